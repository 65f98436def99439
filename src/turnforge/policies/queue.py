"""Batching queues: many episodes `await` a model role; each role's pending requests run as ONE batched call.

A rollout has one queue per model role (`agent`: the policy evaluated or trained; `user`: a simulator;
`judge`; `teacher`), each over a `Policy` whose `generate(prompts, params)` answers a whole batch. An
episode asks with `await queues.generate(role, prompt, order)`. A role's pending requests are dispatched as
one `policy.generate` call, one call in flight per role, on the MODEL THREAD: the thread that called
`run_episodes` (the event loop runs on a thread of its own). In-process policies that take batches (vllm's
`LLM`, scripted ones) thus run on the thread that loaded the model: CUDA's current stream and OpenMP's thread
team are those of that thread. The hf policy is a concurrent backend instead (`max_in_flight`): its
continuous-batching engine steps on a thread of its own and batches whatever replies are open.
A batch is dispatched as soon as

  - every live episode of the rollout waits on a model (no other request can come before one returns), or
  - `max_batch` requests are pending, or
  - the oldest pending request has waited `tick_s` (an episode stuck in a slow env step, a sandbox or an
    HTTP call does not hold back the others for longer than that).

With envs that answer quickly only the first rule fires, so the batches are the lock-step engine's (the same
episodes, sorted by episode index) and seeded sampling reproduces run to run. A server backend (openai,
and others, whose `max_in_flight` > 1) gains nothing from waiting: its requests go one per call as soon as
they arrive, up to `max_in_flight` calls at once (the server batches them itself).

Envs that declared a role (`Env.roles`, e.g. a customer-service env's `user`) get a `RoleClient` per episode;
they call `client.generate(messages)` from their `step`, which runs in an env worker thread: the request joins
the role's queue and the thread waits for its answer.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from turnforge.policies.base import Generation, Policy, Prompt, SamplingParams
from turnforge.types import Message, Task

ROLES = ("agent", "user", "judge", "teacher")


@dataclass
class Role:
    """A model role of a rollout: the policy that answers it and its sampling settings."""

    policy: Policy
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class RoleStats:
    """What one role's queue did: `requests` answered in `calls` batched calls taking `busy_s` in all."""

    requests: int = 0
    calls: int = 0
    busy_s: float = 0.0

    @property
    def mean_batch(self) -> float:
        return self.requests / self.calls if self.calls else 0.0


class ModelThread(Executor):
    """An executor whose calls run on the thread that calls `serve()` (the caller of `run_episodes`).

    Written here because the standard executors only run work on threads they create.
    """

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._work.put((future, fn, args, kwargs))
        return future

    def serve(self) -> None:
        """Run submitted calls, in order, until `stop()`."""
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except KeyboardInterrupt:
                    # Ctrl-C is this thread's (Python raises it in the main thread): the caller stops the episodes'
                    # loop cleanly. Handed to the loop, it surfaced in every waiting episode's task instead, as
                    # 140-170 lines of "Task exception was never retrieved".
                    raise
                except BaseException as e:  # handed to whoever awaits the call
                    future.set_exception(e)

    def stop(self) -> None:
        self._work.put(None)


@dataclass
class _Request:
    prompt: Prompt
    order: int
    future: asyncio.Future


@dataclass
class _Queue:
    role: Role
    worker: Executor
    max_in_flight: int = 1  # > 1: a server backend; each request is its own call, this many at once
    pending: list[_Request] = field(default_factory=list)
    in_flight: int = 0
    since: float = 0.0  # loop time of the oldest pending request
    stats: RoleStats = field(default_factory=RoleStats)

    @property
    def busy(self) -> bool:
        return self.in_flight >= self.max_in_flight


class RoleQueues:
    """The batching queues of one rollout; used on its event loop only (`RoleClient` bridges from threads)."""

    def __init__(
        self,
        roles: dict[str, Role],
        live: Callable[[], int],
        max_batch: int,
        tick_s: float = 0.05,
        model_thread: Executor | None = None,
    ):
        unknown = set(roles) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown model role(s) {sorted(unknown)}; roles are: {', '.join(ROLES)}")
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()
        self.live, self.max_batch, self.tick_s = live, max_batch, tick_s
        self.waiting = 0  # requests pending or in flight, all roles (an episode has at most one)
        self.model_thread = model_thread or ThreadPoolExecutor(1, thread_name_prefix="turnforge-model")
        self._own_model_thread = model_thread is None
        self.queues = {name: self._make_queue(name, role) for name, role in roles.items()}

    def _make_queue(self, name: str, role: Role) -> _Queue:
        flight = int(getattr(role.policy, "max_in_flight", 1))
        if flight < 1:
            raise ValueError(f"policy {role.policy.name!r}: max_in_flight must be at least 1, got {flight}")
        if flight == 1:  # an in-process model (or a scripted policy): on the model thread
            return _Queue(role, self.model_thread, flight)
        return _Queue(role, ThreadPoolExecutor(flight, thread_name_prefix=f"turnforge-{name}"), flight)

    @property
    def stats(self) -> dict[str, RoleStats]:
        return {name: q.stats for name, q in self.queues.items()}

    async def generate(self, role: str, prompt: Prompt, order: int) -> tuple[Generation, float]:
        """(the reply, this request's share of its batched call's seconds). `order` sorts a batch."""
        queue = self._queue(role)
        request = _Request(prompt, order, self.loop.create_future())
        if not queue.pending:
            queue.since = self.loop.time()
            self.loop.call_later(self.tick_s, self.dispatch)
        queue.pending.append(request)
        self.waiting += 1
        self.dispatch()
        return await request.future

    def dispatch(self) -> None:
        """Start a batched call for every idle role whose pending requests are ready to go."""
        for q in self.queues.values():
            while q.pending and not q.busy:
                full = len(q.pending) >= self.max_batch
                stalled = self.waiting >= self.live()
                if not (q.max_in_flight > 1 or full or stalled or self.loop.time() - q.since >= self.tick_s * 0.999):
                    break
                size = 1 if q.max_in_flight > 1 else self.max_batch
                q.pending.sort(key=lambda r: r.order)
                batch, q.pending = q.pending[:size], q.pending[size:]
                q.since = self.loop.time()
                if q.pending:
                    self.loop.call_later(self.tick_s, self.dispatch)
                q.in_flight += 1
                self.loop.create_task(self._run(q, batch))

    async def _run(self, q: _Queue, batch: list[_Request]) -> None:
        prompts = [r.prompt for r in batch]
        started = time.perf_counter()
        try:
            gens = await self.loop.run_in_executor(q.worker, q.role.policy.generate, prompts, q.role.params)
            if len(gens) != len(prompts):
                raise RuntimeError(
                    f"policy {q.role.policy.name!r} returned {len(gens)} generations for {len(prompts)} prompts"
                )
        except BaseException as e:  # a backend failure is a bug: every episode of the batch sees it
            self.waiting -= len(batch)
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(e)
        else:
            # Answered requests stop counting as waiting before anything else is dispatched: their episodes
            # run on at once, and a batch sent now would miss them.
            self.waiting -= len(batch)
            share = (time.perf_counter() - started) / len(batch)
            for r, gen in zip(batch, gens, strict=True):
                if not r.future.done():
                    r.future.set_result((gen, share))
        finally:
            q.stats.requests += len(batch)
            q.stats.calls += 1
            q.stats.busy_s += time.perf_counter() - started
            q.in_flight -= 1
            self.dispatch()

    def _queue(self, role: str) -> _Queue:
        try:
            return self.queues[role]
        except KeyError:
            raise ValueError(
                f"no policy for model role {role!r}; this rollout has: {', '.join(sorted(self.queues))}"
            ) from None

    def close(self) -> None:
        for q in self.queues.values():
            if q.worker is not self.model_thread:
                q.worker.shutdown(wait=True)
        if self._own_model_thread:
            self.model_thread.shutdown(wait=True)


class RoleClient:
    """A model role as an env sees it during one episode: `generate(messages)` from the env's `step`.

    `step` runs in an env worker thread; the call joins the role's batching queue on the rollout's event loop
    and waits for the answer.
    """

    def __init__(self, queues: RoleQueues, role: str, task: Task, sample: int, order: int):
        queues._queue(role)  # an unknown role fails here, when the episode starts
        self.queues, self.role, self.task, self.sample, self.order = queues, role, task, sample, order
        self.calls = 0

    def generate(self, messages: list[Message], tools: list[dict] | None = None) -> Generation:
        """The role's reply to `messages` (rendered with the role's own chat template)."""
        if threading.get_ident() == self.queues.thread:
            raise RuntimeError(
                f"an env asked model role {self.role!r} from the rollout's event loop; "
                "envs that use roles must be stepped in env worker threads (RolloutLimits.env_workers != 0)"
            )
        prompt = Prompt(messages=messages, task=self.task, sample=self.sample, turn=self.calls, tools=tools)
        self.calls += 1
        coro = self.queues.generate(self.role, prompt, self.order)
        gen, _ = asyncio.run_coroutine_threadsafe(coro, self.queues.loop).result()
        return gen
