"""THE multi-turn loop (design.md §5): many episodes open at once, one `policy.generate` call per round.

Each round of `run_episodes`:
  1. open queued episodes until `max_open` are open (`env.reset`, in the env pool),
  2. build one `Prompt` per open episode and call `policy.generate` ONCE for the whole batch,
  3. per episode (in the env pool): parse the reply with the env's format, step the env with the parsed
     Message or the FormatError (the env answers a FormatError with its own error observation), record a
     `Turn`, append the RAW assistant text (what the model wrote; the parsed Message is what the env saw)
     and the env's observation messages,
  4. close the episodes that stopped and hand each to `on_finish` at once (the eval writer flushes it).

An exception from the env (reset, parse, step, score) ends only that episode, with `StopReason.env_error`
and the traceback in `score.details["error"]`; the batch goes on. An exception from the policy is a bug
in the backend and stops the run.

Token-exact (for training on real models): when the policy has a `renderer` (a `ChatRenderer`), an
episode's ids are the rendered first prompt + exactly the generated ids + the chat-template delta of each
observation; text is never re-tokenized, and `Prompt.ids` carries them. With a history window
(`renderer.window = N`: system prompt + first observation + last N turns) each turn's prompt is rendered
afresh from the windowed messages and kept in `Turn.prompt_ids`, so every turn is a token-exact
(prompt, completion) pair. Scripted policies have no renderer; their ids stay empty.

    turnforge eval --env household --policy expert --split test --tasks 30 --out runs/expert
"""

from __future__ import annotations

import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from turnforge.envs.base import Env
from turnforge.formats.base import FormatError
from turnforge.models.chat import window_messages
from turnforge.policies.base import Generation, Policy, Prompt, SamplingParams
from turnforge.types import Message, Score, StepResult, StopReason, Task, Trajectory, Turn


@dataclass
class RolloutLimits:
    """When episodes are cut short, and how many run at once. The defaults suit a laptop evaluation."""

    max_turns: int | None = None
    """Assistant turns per episode -> StopReason.max_turns; None leaves it to the env's own step limit."""
    max_format_errors: int | None = 5
    """CONSECUTIVE unparsable replies -> StopReason.format_error_limit; None = no limit. Consecutive, not
    total: a model that recovers from a slip goes on, one stuck repeating bad output is cut off."""
    max_open: int = 64
    """Episodes open at once = the batch size of each `generate` call."""
    env_workers: int = 0
    """0 steps the envs inline; N > 0 steps them in a pool of N threads (for envs that wait on I/O)."""
    max_total_tokens: int | None = None
    """Cap on an episode's tokens -> StopReason.max_tokens: its whole id sequence (prompt + generated +
    observations) when token-exact (with a history window: the next windowed prompt), else its generated
    tokens; None = no cap."""

    def __post_init__(self) -> None:
        at_least_one = {"max_turns": self.max_turns, "max_format_errors": self.max_format_errors}
        at_least_one |= {"max_open": self.max_open, "max_total_tokens": self.max_total_tokens}
        for name, value in at_least_one.items():
            if value is not None and value < 1:
                raise ValueError(f"rollout limit {name} must be at least 1, got {value}")
        if self.env_workers < 0:
            raise ValueError(f"rollout limit env_workers must be >= 0 (0 = inline), got {self.env_workers}")


@runtime_checkable
class ChatRenderer(Protocol):
    """Turns messages into the exact ids a model sees (a policy's optional `renderer` attribute).

    `turnforge.models.chat.ChatTemplateRenderer` implements it over a Hugging Face chat template.
    """

    window: int | None
    """None: one growing id sequence per episode. N: each prompt is `window_messages(messages, N)` rendered anew."""

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Ids of a whole prompt, ending with the header of the assistant turn to generate."""
        ...

    def observation_ids(
        self,
        messages: list[Message],
        new_messages: list[Message],
        tools: list[dict] | None,
        generated_ids: list[int],
        finish_reason: str | None,
    ) -> list[int]:
        """Ids appended after `generated_ids`: end-of-turn if the generation lacks it, `new_messages` and the
        next assistant header. `messages` is the conversation up to and including the raw assistant message
        just generated."""
        ...


@dataclass
class _Episode:
    """One open episode's state; mutated only by the pool task that owns it during a round."""

    task: Task
    sample: int
    env: Env | None = None
    messages: list[Message] = field(default_factory=list)
    tools: list[dict] | None = None
    turns: list[Turn] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    format_errors_in_a_row: int = 0
    env_steps: int = 0
    tokens_generated: int = 0
    started: float = 0.0  # when the episode opened (not when it was queued)
    generate_s: float = 0.0
    env_s: float = 0.0
    closed: bool = False
    stop: StopReason | None = None  # None when closed = the env ended it; success/failure comes from score()
    error: str | None = None  # traceback of an env failure


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
) -> list[Trajectory]:
    """Run `samples_per_task` episodes of every task (except the `(task_id, sample)` keys in `skip`).

    Returns the trajectories in task order, then sample order, whatever order they finished in;
    `on_finish` sees each one as soon as it finishes. Envs are reused across episodes (`reset`),
    except one that raised.
    """
    limits = limits or RolloutLimits()
    params = params or SamplingParams()
    renderer: ChatRenderer | None = getattr(policy, "renderer", None)
    queue = deque(_Episode(t, s) for t in tasks for s in range(samples_per_task) if (t.id, s) not in skip)
    order = {(ep.task.id, ep.sample): i for i, ep in enumerate(queue)}
    finished: list[Trajectory] = []
    idle_envs: list[Env] = []
    open_eps: list[_Episode] = []
    with _env_pool(limits.env_workers) as run_all, _progress_bar(len(queue)) as advance:
        while queue or open_eps:
            opened = [queue.popleft() for _ in range(min(len(queue), limits.max_open - len(open_eps)))]
            for ep in opened:
                ep.env = idle_envs.pop() if idle_envs else None
            run_all(lambda ep: _reset(ep, env_factory, renderer), opened)
            open_eps += opened
            live = [ep for ep in open_eps if not ep.closed]
            if live:
                generations = _generate(policy, live, params, renderer)
                run_all(lambda pair: _step(*pair, limits, renderer), zip(live, generations, strict=True))
            for ep in open_eps:
                if ep.closed:
                    traj = _to_trajectory(ep, seed, policy.name)
                    if ep.error is None:
                        idle_envs.append(ep.env)
                    finished.append(traj)
                    if on_finish is not None:
                        on_finish(traj)
                    advance()
            open_eps = [ep for ep in open_eps if not ep.closed]
    return sorted(finished, key=lambda t: order[t.key])


def _reset(ep: _Episode, env_factory: Callable[[], Env], renderer: ChatRenderer | None) -> None:
    ep.started = t0 = time.perf_counter()
    try:
        if ep.env is None:
            ep.env = env_factory()
        ep.messages = list(ep.env.reset(ep.task))
        ep.tools = ep.env.tools()
    except Exception:
        _fail(ep)
        return
    finally:
        ep.env_s += time.perf_counter() - t0
    if renderer is not None:
        ep.prompt_ids = renderer.prompt_ids(ep.messages, ep.tools)
        ep.ids = list(ep.prompt_ids)


def _generate(
    policy: Policy, eps: list[_Episode], params: SamplingParams, renderer: ChatRenderer | None
) -> list[Generation]:
    # Prompts share the episodes' lists (no copy on the hot path): policies read them, never mutate.
    prompts = [
        Prompt(
            messages=ep.messages,
            task=ep.task,
            sample=ep.sample,
            turn=len(ep.turns),
            ids=ep.ids if renderer is not None else None,
            tools=ep.tools,
            env=ep.env,
        )
        for ep in eps
    ]
    t0 = time.perf_counter()
    generations = policy.generate(prompts, params)
    if len(generations) != len(prompts):
        raise RuntimeError(
            f"policy {policy.name!r} returned {len(generations)} generations for {len(prompts)} prompts"
        )
    share = (time.perf_counter() - t0) / len(eps)  # each episode carries its share of the batched call
    for ep in eps:
        ep.generate_s += share
    return generations


def _step(ep: _Episode, gen: Generation, limits: RolloutLimits, renderer: ChatRenderer | None) -> None:
    """Apply one generation to its episode; closes the episode when it stops."""
    ep.tokens_generated += len(gen.ids)
    if gen.finish_reason == "exhausted":  # the policy has nothing left to say (e.g. replay ran out)
        ep.closed, ep.stop = True, StopReason.gave_up
        return
    t0 = time.perf_counter()
    try:
        parsed = ep.env.format.parse(gen.text)
        result = ep.env.step(parsed)
    except Exception:
        _fail(ep)
        return
    finally:
        ep.env_s += time.perf_counter() - t0
    ep.env_steps += 1
    parse_error = parsed.reason if isinstance(parsed, FormatError) else None
    turn = Turn(
        text=gen.text,
        generated_ids=list(gen.ids),
        logprobs=list(gen.logprobs),
        reward=result.reward,
        progress=float(result.info.get("progress", 0.0)),
        parse_ok=parse_error is None,
        parse_error=parse_error,
        finish_reason=gen.finish_reason,
    )
    ep.messages.append(Message("assistant", gen.text))
    if renderer is not None:
        _append_ids(ep, turn, result.messages, renderer, gen.finish_reason)
    ep.messages.extend(result.messages)
    ep.turns.append(turn)
    ep.format_errors_in_a_row = 0 if parse_error is None else ep.format_errors_in_a_row + 1
    tokens = len(ep.ids) if renderer is not None else ep.tokens_generated
    ep.closed, ep.stop = _stop_after_step(ep, result, tokens, limits)


def _append_ids(
    ep: _Episode, turn: Turn, observation: list[Message], renderer: ChatRenderer, finish_reason: str
) -> None:
    """Extend the episode's ids after a turn (`ep.messages` ends with the raw assistant message).

    Without a window: generated ids + the observation delta, onto the one growing sequence. With one: the turn
    keeps the prompt it was generated from, and the next prompt is the windowed conversation rendered anew.
    """
    if renderer.window is None:
        turn.observation_ids = renderer.observation_ids(
            ep.messages, observation, ep.tools, turn.generated_ids, finish_reason
        )
        ep.ids += turn.generated_ids + turn.observation_ids
    else:
        turn.prompt_ids = ep.ids
        ep.ids = renderer.prompt_ids(window_messages(ep.messages + observation, renderer.window), ep.tools)


def _stop_after_step(
    ep: _Episode, result: StepResult, tokens: int, limits: RolloutLimits
) -> tuple[bool, StopReason | None]:
    """(closed, reason); the env's own end comes first, then our limits."""
    if result.done:
        return True, result.stop
    if limits.max_format_errors is not None and ep.format_errors_in_a_row >= limits.max_format_errors:
        return True, StopReason.format_error_limit
    if limits.max_turns is not None and len(ep.turns) >= limits.max_turns:
        return True, StopReason.max_turns
    if limits.max_total_tokens is not None and tokens >= limits.max_total_tokens:
        return True, StopReason.max_tokens
    return False, None


def _fail(ep: _Episode) -> None:
    ep.closed, ep.stop, ep.error = True, StopReason.env_error, traceback.format_exc()


def _final_score(ep: _Episode) -> tuple[Score, StopReason]:
    if ep.error is None:
        try:
            score = ep.env.score()
            return score, ep.stop or (StopReason.success if score.success else StopReason.failure)
        except Exception:
            _fail(ep)
    progress = ep.turns[-1].progress if ep.turns else 0.0
    return Score(
        success=False, reward=0.0, progress=progress, details={"error": ep.error}
    ), StopReason.env_error


def _to_trajectory(ep: _Episode, seed: int, model: str) -> Trajectory:
    score, stop = _final_score(ep)
    return Trajectory(
        task_id=ep.task.id,
        env=ep.task.env,
        category=ep.task.category,
        split=ep.task.split,
        sample=ep.sample,
        messages=ep.messages,
        turns=ep.turns,
        score=score,
        stop_reason=stop,
        prompt_ids=ep.prompt_ids,
        tokens_generated=ep.tokens_generated,
        env_steps=ep.env_steps,
        timings={"wall_s": time.perf_counter() - ep.started, "generate_s": ep.generate_s, "env_s": ep.env_s},
        seed=seed,
        model=model,
        tools=ep.tools,
    )


@contextmanager
def _env_pool(workers: int) -> Iterator[Callable[[Callable, Iterable], list]]:
    """`run_all(fn, items)`: inline when workers == 0, else in a thread pool (results in input order)."""
    if workers <= 0:
        yield lambda fn, items: [fn(x) for x in items]
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="turnforge-env") as pool:
        yield lambda fn, items: list(pool.map(fn, items))


@contextmanager
def _progress_bar(total: int) -> Iterator[Callable[[], None]]:
    """`advance()` per finished episode; a rich bar on stderr only when it is a terminal."""
    if total == 0 or not sys.stderr.isatty():
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, Progress

    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=Console(stderr=True)) as bar:
        task_id = bar.add_task("episodes", total=total)
        yield lambda: bar.advance(task_id)
