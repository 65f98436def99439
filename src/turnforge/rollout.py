"""THE multi-turn loop (design.md §5): one coroutine per episode, model calls batched per role.

`play_episode` is an episode start to end: reset -> (generate -> parse -> step)* -> score. `run_episodes`
keeps up to `max_open` of them alive on one asyncio event loop (on a thread of its own) and streams each
finished trajectory to `on_finish` (the eval writer flushes it at once). Where an episode waits, the others
go on:

  - generate: `await queues.generate("agent", prompt)`: the agent role's queue (policies/queue.py) runs the
    pending requests of all episodes as ONE batched `policy.generate` call on the thread that called
    `run_episodes` (the thread that loaded, and in GRPO trains, the model);
  - env calls (reset, parse + step, score) run in a pool of env worker threads, so a step that waits (SQL,
    a sandbox, a simulated user over HTTP, another model role) stalls only its own episode. An env that
    declares model roles (`Env.roles`, e.g. a `user` simulator) gets a `RoleClient` per episode; its
    requests are batched across episodes like the agent's.

An exception from the env (reset, parse, step, score) ends only that episode, with `StopReason.env_error`
and the traceback in `score.details["error"]`; the others go on. An exception from a policy is a bug in the
backend and stops the run. Every env the run created is closed (`Env.close()`) before it returns.

Token-exact (for training on real models): with a `renderer` (a `ChatRenderer`, passed explicitly), an
episode's ids are the rendered first prompt + exactly the generated ids + the chat-template delta of each
observation; text is never re-tokenized, and `Prompt.ids` carries them. With a history window
(`renderer.window = N`: system prompt + first observation + last N turns) each turn's prompt is rendered
afresh from the windowed messages and kept in `Turn.prompt_ids`, so every turn is a token-exact
(prompt, completion) pair. Without a renderer (scripted policies) the ids stay empty.

    turnforge eval --env household --policy expert --split test --tasks 30 --out runs/expert
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from turnforge.envs.base import Env, UsesRoles
from turnforge.episode import Episode, RolloutLimits, fail_episode, step_episode, to_trajectory
from turnforge.formats.base import bind_tools
from turnforge.formats.chat_template import ChatRenderer
from turnforge.formats.families import check_tool_format
from turnforge.policies.base import Policy, Prompt, SamplingParams
from turnforge.policies.queue import ModelThread, Role, RoleClient, RoleQueues, RoleStats
from turnforge.types import Task, Trajectory

T = TypeVar("T")
STATUS_EVERY_S = 30.0  # without a terminal, one status line this often


def run_episodes(
    policy: Policy,
    env_factory: Callable[[], Env],
    tasks: list[Task],
    samples_per_task: int,
    limits: RolloutLimits | None = None,
    params: SamplingParams | None = None,
    on_finish: Callable[[Trajectory], None] | None = None,
    skip: frozenset[tuple[str, int]] = frozenset(),
    seed: int = 0,
    renderer: ChatRenderer | None = None,
    roles: dict[str, Role] | None = None,
    stats: dict[str, RoleStats] | None = None,
    progress: bool = True,
) -> list[Trajectory]:
    """Run `samples_per_task` episodes of every task (except the `(task_id, sample)` keys in `skip`).

    `policy` answers the `agent` role with `params`; `roles` adds the other model roles the env declares
    (`{"user": Role(policy, params)}`); `renderer` makes the episodes token-exact (an hf policy's
    `policy.renderer`). Returns the trajectories in task order, then sample order, whatever order they
    finished in; `on_finish` sees each one as soon as it finishes. Envs are reused across episodes
    (`reset`), except one that raised. `stats`, when given, receives each role's batching figures. `progress`
    shows episodes done on stderr (off in a Ray worker: the driver shows the run's).
    Callable from synchronous code (TRL's `rollout_func`) and from inside a running event loop: the episodes'
    event loop runs on a thread of its own, and the model calls run on the calling thread.
    """
    job = _Run(
        policy, env_factory, limits or RolloutLimits(), params or SamplingParams(), on_finish, seed, renderer,
        roles or {}, progress,
    )
    episodes = [
        Episode(t, s, i)
        for i, (t, s) in enumerate((t, s) for t in tasks for s in range(samples_per_task))
        if (t.id, s) not in skip
    ]
    finished = _run_on_loop_thread(job, episodes)
    if stats is not None:
        stats.update(job.stats)
    order = {(ep.task.id, ep.sample): ep.order for ep in episodes}
    return sorted(finished, key=lambda t: order[t.key])


def _run_on_loop_thread(job: _Run, episodes: list[Episode]) -> list[Trajectory]:
    """The event loop on a thread of its own; this thread serves the model calls until the loop is done."""
    model_thread = ModelThread()
    box: dict[str, Any] = {}

    def loop_main() -> None:
        try:
            box["result"] = asyncio.run(job.run(episodes, model_thread))
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e
        finally:
            model_thread.stop()

    thread = threading.Thread(target=loop_main, name="turnforge-rollout")
    thread.start()
    try:
        model_thread.serve()
    except BaseException:  # Ctrl-C while a model call ran here: stop the loop, keep what finished
        job.cancel()
        model_thread.serve()
        thread.join()
        raise
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


class _Run:
    """One `run_episodes` call: its episodes' shared parts (queues, env pool, idle envs, output)."""

    def __init__(self, policy, env_factory, limits, params, on_finish, seed, renderer, roles, progress) -> None:
        if "agent" in roles:
            raise ValueError("the agent role is the policy itself; give the other roles (user, judge, teacher)")
        self.roles = {"agent": Role(policy, params), **roles}
        self.policy, self.env_factory, self.limits = policy, env_factory, limits
        self.on_finish, self.seed, self.renderer, self.progress = on_finish, seed, renderer, progress
        self.idle_envs: list[Env] = []
        self.made_envs: list[Env] = []
        self.stats: dict[str, RoleStats] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.main: asyncio.Task | None = None

    def cancel(self) -> None:
        """Stop the run from another thread (the episodes finished so far were already handed to on_finish)."""
        if self.loop is not None and self.main is not None:
            self.loop.call_soon_threadsafe(self.main.cancel)

    async def run(self, episodes: list[Episode], model_thread: ModelThread) -> list[Trajectory]:
        self.loop, self.main = asyncio.get_running_loop(), asyncio.current_task()
        queue, finished = deque(episodes), []
        unfinished = len(episodes)  # queued + open: min(max_open, unfinished) episodes are alive

        def live() -> int:
            return min(self.limits.max_open, unfinished)

        self.queues = RoleQueues(self.roles, live, self.limits.max_open, self.limits.batch_wait_s, model_thread)
        workers = self.limits.env_workers
        self.pool = ThreadPoolExecutor(workers or self.limits.max_open, thread_name_prefix="turnforge-env") \
            if workers != 0 else None

        async def slot(advance: Callable[[Trajectory], None]) -> None:
            nonlocal unfinished
            while queue:
                traj = await self.play_episode(queue.popleft())
                finished.append(traj)
                unfinished -= 1
                if self.on_finish is not None:
                    self.on_finish(traj)
                advance(traj)
                self.queues.dispatch()  # one episode fewer: a batch waiting for it may be ready

        try:
            with progress_bar(len(episodes) if self.progress else 0) as advance:
                slots = [asyncio.create_task(slot(advance)) for _ in range(min(self.limits.max_open, len(queue)))]
                try:
                    await asyncio.gather(*slots)
                except BaseException:
                    for task in slots:
                        task.cancel()
                    await asyncio.gather(*slots, return_exceptions=True)
                    raise
        finally:
            self.stats = self.queues.stats
            self.queues.close()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
            for env in self.made_envs:
                _close(env)
        return finished

    async def play_episode(self, ep: Episode) -> Trajectory:
        """One episode, start to end: reset -> (generate -> parse -> step)* -> score."""
        ep.env = self.idle_envs.pop() if self.idle_envs else self.make_env(ep)
        await self.env_call(ep, self.reset, ep)
        while not ep.closed:
            gen, share = await self.queues.generate("agent", self.prompt(ep), ep.order)
            ep.generate_s += share  # each episode carries its share of the batched call
            await self.env_call(ep, step_episode, ep, gen, self.limits, self.renderer)
        traj = await self.env_call(ep, to_trajectory, ep, self.seed, self.policy.name)
        if ep.error is None:
            self.idle_envs.append(ep.env)
        elif ep.env is not None:  # an env that raised is not reused
            self.made_envs.remove(ep.env)
            _close(ep.env)
        return traj

    def make_env(self, ep: Episode) -> Env | None:
        """A new env from the factory (on the loop: envs are made once per slot); None after a failure."""
        try:
            env = self.env_factory()
        except Exception:
            fail_episode(ep)
            return None
        self.made_envs.append(env)
        return env

    def reset(self, ep: Episode) -> None:
        ep.started = time.perf_counter()
        if ep.env is None:  # its construction failed (make_env)
            return
        self.bind_roles(ep)  # a role nobody gave is the caller's mistake: it stops the run
        try:
            ep.messages = list(ep.env.reset(ep.task))
            ep.tools = ep.env.tools()
            bind_tools(ep.env.format, ep.tools)  # a format typing values by the tools' schemas reads by these
        except Exception:
            fail_episode(ep)
            return
        finally:
            ep.env_s += time.perf_counter() - ep.started
        if self.renderer is not None:
            check_tool_format(self.renderer.family, ep.env.format.name)
            ep.prompt_ids = self.renderer.prompt_ids(ep.messages, ep.tools)
            ep.ids = list(ep.prompt_ids)

    def bind_roles(self, ep: Episode) -> None:
        """Give the env a client for each model role it declares, bound to this episode."""
        if not isinstance(ep.env, UsesRoles) or not ep.env.roles:
            return
        name = getattr(ep.env, "name", type(ep.env).__name__)
        missing = [r for r in ep.env.roles if r not in self.roles]
        if missing:
            raise ValueError(f"env {name!r} needs a policy for model role(s) {missing}; pass roles={{...}}")
        if self.pool is None:
            raise ValueError(f"env {name!r} asks model roles from its steps; it cannot be stepped inline (env_workers=0)")
        ep.env.use_roles({r: RoleClient(self.queues, r, ep.task, ep.sample, ep.order) for r in ep.env.roles})

    def prompt(self, ep: Episode) -> Prompt:
        # The prompt shares the episode's lists (no copy on the hot path): policies read them, never mutate.
        return Prompt(
            messages=ep.messages,
            task=ep.task,
            sample=ep.sample,
            turn=len(ep.turns),
            ids=ep.ids if self.renderer is not None else None,
            tools=ep.tools,
            env=ep.env,
        )

    async def env_call(self, ep: Episode, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the episode's env: in an env worker thread, or inline (see `RolloutLimits.env_workers`)."""
        if self.pool is None or not self.threaded(ep.env):
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def threaded(self, env: Env | None) -> bool:
        if self.limits.env_workers is not None:
            return self.limits.env_workers > 0
        return bool(getattr(env, "blocks", False)) or (isinstance(env, UsesRoles) and bool(env.roles))


def _close(env: Env) -> None:
    try:
        env.close()
    except Exception as e:  # a failing close must not hide the run's results
        warnings.warn(f"closing env {getattr(env, 'name', type(env).__name__)!r} failed: {e}", RuntimeWarning,
                      stacklevel=2)


@contextmanager
def progress_bar(total: int) -> Iterator[Callable[[Trajectory], None]]:
    """`advance(traj)` per finished episode: episodes done / total, success so far and episodes/s, as a rich bar on
    stderr when it is a terminal, else as a one-line status on stderr every `STATUS_EVERY_S` seconds."""
    if total == 0:
        yield lambda traj: None
        return
    started, done, won = time.perf_counter(), 0, 0
    if not sys.stderr.isatty():
        last = started

        def status(traj: Trajectory) -> None:
            nonlocal done, won, last
            done, won = done + 1, won + traj.score.success
            now = time.perf_counter()
            if now - last >= STATUS_EVERY_S and done < total:
                last = now
                print(f"episodes {done}/{total}, success {won / done:.1%}, {done / (now - started):.2f} episodes/s",
                      file=sys.stderr, flush=True)

        yield status
        return
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress, TextColumn

    columns = (*Progress.get_default_columns(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task_id = bar.add_task("episodes", total=total, status="")

        def advance(traj: Trajectory) -> None:
            nonlocal done, won
            done, won = done + 1, won + traj.score.success
            rate = done / (time.perf_counter() - started)
            bar.update(task_id, advance=1, status=f"success {won / done:.1%} · {rate:.2f} episodes/s")

        yield advance
