"""Episodes fanned out over Ray actors: the `--ray` path of collection, evaluation and RFT sampling.

Each worker is a Ray actor that builds the env (registry name + options) and the policy (its spec: a scripted
policy, an hf / vllm replica of the model, or a client of a shared openai server) and plays its share of the
episodes with the same engine as the in-process path (`turnforge.rollout.run_episodes`). The driver hands out
chunks of (task_id, sample) keys; a worker streams each trajectory back as it finishes (a Ray streaming
generator), and the driver passes it to `on_finish` — the eval runner's writer, the same one the in-process path
uses, so `episodes.jsonl`, its resume and its summary do not know where an episode ran.

A worker that dies (killed, out of memory, its node lost) loses nothing that finished: what it streamed is on
disk, the rest of its chunk goes back to the queue and a new worker takes its place. A chunk whose worker died
`MAX_CHUNK_DEATHS` times stops the run (something in it kills the process); a worker whose construction fails
(bad model path, missing package) stops it at once, with the worker's error.

    turnforge eval --env household --policy expert --ray auto --workers 4 --out runs/ray
"""

from __future__ import annotations

import functools
import math
import queue
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from turnforge.envs.base import make_env
from turnforge.policies import make_policy
from turnforge.policies.base import SamplingParams
from turnforge.policies.roles import env_roles
from turnforge.rollout import RolloutLimits, progress_bar, run_episodes
from turnforge.scale.config import ScaleConfig
from turnforge.types import Task, Trajectory

MAX_CHUNK_DEATHS = 3  # a chunk that took down this many workers is the cause, not a victim
CHUNKS_PER_WORKER = 2  # a worker that finishes early takes a second chunk instead of idling at the tail
Key = tuple[str, int]


@dataclass(frozen=True)
class EpisodeJob:
    """What a worker builds its env and policy from: specs, not objects (they cross to other machines)."""

    env: str
    env_options: dict[str, Any]
    policy: str
    model: str | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    params: SamplingParams = field(default_factory=SamplingParams)
    limits: RolloutLimits = field(default_factory=RolloutLimits)
    seed: int = 0


class EpisodeWorker:
    """One Ray actor: its env factory and policy (with the env's model roles), built once, playing chunks."""

    def __init__(self, job: EpisodeJob) -> None:
        self.job = job
        self.policy = make_policy(job.policy, model=job.model, seed=job.seed, **job.policy_options)
        self.roles = env_roles(job.env, job.env_options, job.params, job.seed, job.policy, job.policy_options)
        self.env_factory = functools.partial(make_env, job.env, **job.env_options)

    def play(self, tasks: list[Task], samples: int, keys: list[Key]) -> Iterator[str]:
        """The episodes `keys` of `tasks`, each yielded as its Trajectory JSON line the moment it finishes."""
        wanted = set(keys)
        skip = frozenset((t.id, s) for t in tasks for s in range(samples)) - wanted
        lines: queue.Queue = queue.Queue()
        done = object()

        def run() -> None:
            try:
                run_episodes(
                    self.policy, self.env_factory, tasks, samples, self.job.limits, self.job.params,
                    on_finish=lambda traj: lines.put(traj.to_json()), skip=skip, seed=self.job.seed,
                    renderer=self.policy.renderer, roles=self.roles, progress=False,
                )
            except BaseException as e:  # raised again below, in the actor's call
                lines.put(e)
            finally:
                lines.put(done)

        # run_episodes blocks until its chunk is over; on a thread of its own, this call can stream meanwhile.
        thread = threading.Thread(target=run, name="turnforge-ray-episodes")
        thread.start()
        while (item := lines.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
        thread.join()


def connect(address: str) -> None:
    """Join the Ray instance at `address` ("auto": RAY_ADDRESS or one running here, else a new local one)."""
    if ray.is_initialized():  # e.g. a test's or a notebook's own ray.init(num_cpus=2)
        return
    ray.init(address=None if address == "auto" else address, log_to_driver=True)


def run_episodes_on_ray(
    job: EpisodeJob,
    tasks: list[Task],
    samples_per_task: int,
    scale: ScaleConfig,
    on_finish: Callable[[Trajectory], None] | None = None,
    skip: frozenset[Key] = frozenset(),
) -> list[Trajectory]:
    """`run_episodes`' contract over `scale.workers` Ray actors: the same episodes, `on_finish` called on this
    thread as each one comes back, and the trajectories returned in task then sample order."""
    connect(scale.ray or "auto")
    keys = [(t.id, s) for t in tasks for s in range(samples_per_task) if (t.id, s) not in skip]
    if not keys:
        return []
    fleet = _Fleet(job, tasks, samples_per_task, scale)
    fleet.queue_chunks(keys)
    finished: dict[Key, Trajectory] = {}
    with progress_bar(len(keys)) as advance:
        for traj in fleet.stream():
            finished[traj.key] = traj
            if on_finish is not None:
                on_finish(traj)
            advance(traj)
    return [finished[k] for k in keys]


class _Fleet:
    """The workers of one run, the chunks still to play, and which chunk each worker streams."""

    def __init__(self, job: EpisodeJob, tasks: list[Task], samples: int, scale: ScaleConfig) -> None:
        self.job, self.samples, self.scale = job, samples, scale
        self.tasks = {t.id: t for t in tasks}
        self.actor_cls = ray.remote(num_cpus=scale.worker_cpus, num_gpus=scale.worker_gpus)(EpisodeWorker)
        self.name = f"turnforge-episodes-{uuid.uuid4().hex[:8]}"  # named: `ray list actors` shows whose they are
        self.made = 0
        self.order: dict[Key, int] = {}
        self.pending: deque[tuple[list[Key], int]] = deque()  # (keys, workers it has killed)
        self.running: dict[Any, tuple[Any, set[Key], int]] = {}  # stream -> (actor, keys not back yet, deaths)

    def queue_chunks(self, keys: list[Key]) -> None:
        self.order = {key: i for i, key in enumerate(keys)}
        size = max(1, math.ceil(len(keys) / (self.scale.workers * CHUNKS_PER_WORKER)))
        size = min(size, self.job.limits.max_open * 4)  # more chunks than that only delays a dead worker's redo
        self.pending.extend((keys[i : i + size], 0) for i in range(0, len(keys), size))

    def new_actor(self) -> Any:
        self.made += 1
        return self.actor_cls.options(name=f"{self.name}-{self.made}").remote(self.job)

    def start(self, actor: Any) -> None:
        keys, deaths = self.pending.popleft()
        tasks = [self.tasks[i] for i in dict.fromkeys(task_id for task_id, _ in keys)]
        stream = actor.play.options(num_returns="streaming").remote(tasks, self.samples, keys)
        self.running[stream] = (actor, set(keys), deaths)

    def stream(self) -> Iterator[Trajectory]:
        """Every queued episode, as workers send them back; a dead worker's unfinished keys are played again."""
        for _ in range(min(self.scale.workers, len(self.pending))):
            self.start(self.new_actor())
        try:
            while self.running:
                ready, _ = ray.wait(list(self.running), num_returns=1)
                stream = ready[0]
                actor, left, deaths = self.running[stream]
                try:
                    line = ray.get(next(stream))
                except StopIteration:  # its chunk is done: the next one, or the worker retires
                    del self.running[stream]
                    if self.pending:
                        self.start(actor)
                    else:
                        ray.kill(actor)
                    continue
                except RayActorError as e:
                    del self.running[stream]
                    self.requeue(e, left, deaths)
                    continue
                except RayTaskError as e:  # the worker's own exception (a failing model server): as in-process
                    raise (e.cause if isinstance(e.cause, Exception) else e) from None
                traj = Trajectory.from_json(line)
                left.discard(traj.key)
                yield traj
        finally:
            for actor, _, _ in self.running.values():
                ray.kill(actor)

    def requeue(self, error: RayActorError, left: set[Key], deaths: int) -> None:
        """A worker died: its chunk's unfinished keys go back to the queue (at the front), and a new worker starts."""
        if error.actor_init_failed:
            raise RuntimeError(f"a Ray worker could not build its env and policy: {error}") from None
        if deaths + 1 >= MAX_CHUNK_DEATHS:
            raise RuntimeError(
                f"{MAX_CHUNK_DEATHS} Ray workers died playing episodes {sorted(left)[:5]}...; the finished episodes "
                f"are kept and the same command resumes. Last error: {error}"
            )
        print(f"a Ray worker died ({type(error).__name__}); its {len(left)} unfinished episodes are queued again",
              file=sys.stderr, flush=True)
        self.pending.appendleft((sorted(left, key=self.order.__getitem__), deaths + 1))
        self.start(self.new_actor())
