"""Asynchronous GRPO (`max_staleness` = k > 0): rollouts never wait for training, training never waits for the
slowest episode.

`AsyncEpisodeRollouts` is TRL's `rollout_func`, like `EpisodeRollouts`, but the episodes are not played inside the
call. A background worker plays groups continuously on a generator copy of the weights (`GeneratorCopy`), beside
training, on the same device, through the hf engine:

  - (k + 1) x tasks_per_step groups are in flight (playing, or finished and waiting) while a step takes its
    groups, k x tasks_per_step while it trains: a group started at step s is trained by step s + k unless it plays
    longer than the groups started before it. A group is one task's `num_generations` episodes, played by one
    `run_episodes` on a thread of its own, all threads feeding the one continuous-batching engine;
  - each call (one per optimizer step s) first copies the trained weights into the generator (version s), atomically:
    under the generator's forward lock (`engine.forwards_paused`), so no forward runs on half-updated weights; then
    it hands TRL the oldest finished groups (by start order) and returns at once when enough are finished. A group
    still playing is carried over to a later step: neither waited for nor dropped;
  - every turn records the weight version it was generated with (the version when its reply was submitted: the
    oldest weights that touched it; `AsyncGroup.versions`). A group's version is the generator's when it started,
    never newer than its oldest turn's. The staleness bound: a group is trained at step s only if s - version <= k. A finished group past it is dropped and its task drawn again (a new
    group of the same task, at the front of the queue), counted as `stale_dropped_groups` in rollouts.jsonl;
  - the tasks are the worker's: a seeded stream of shuffled passes over the training tasks (TRL's sampler draws
    them so too); TRL's prompts fix only how many groups a step takes. Dynamic sampling skips a finished flat
    group for the next finished one, up to `resample_rounds` x tasks_per_step a step;
  - KV blocks computed with older weights stay in the engine's cache and are reused by later turns (a weight update
    lands between two engine steps, not between requests): the sampled tokens' recorded log-probs are those of the
    distribution that drew them, old blocks included, so the importance correction (`off_policy`) covers it.
  - under `accelerate launch` (DDP) each process runs a worker of its own (its own generator copy, tasks and seeds)
    and trains its share of the step; rollouts.jsonl gathers them. FSDP / DeepSpeed (sharded weights) are refused;
  - on a CPU, while the trainer and the engine both compute, each takes half the free cores
    (`machine.computing_threads`); one waiting, the other takes them all;
  - resume: a killed run resumes from its last checkpoint; the groups in flight at the kill are lost and re-sampled
    (never replayed, so none is trained twice); the task stream is seeded by the step it resumes at.

With `use_vllm` (colocate), the generator is TRL's vLLM engine instead of a copy: the groups' calls go one at a time
and together (`SerialBatches`), TRL's own weight sync lands between two calls and drops the prefix cache, and TRL's
own importance-sampling correction weighs the loss.

Memory: the generator is a second copy of the trainable weights only. With LoRA the frozen base is shared (the
same tensors) and only the adapter is copied (a few MB for a 4B model at r = 16); a full fine-tune copies every
weight (a 4B model in bf16: 8 GB more, beside the optimizer's 2 x 16 GB of float32 moments).

The off-policy loss: `grpo_trainer.EpisodeGRPOTrainer.off_policy_weights` (docs/decisions.md, "Asynchronous GRPO").
"""

from __future__ import annotations

import copy
import random
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from turnforge.machine import computing_threads
from turnforge.policies.engine import forwards_paused
from turnforge.policies.hf import HFPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.grpo_rollouts import EpisodeRollouts, Group, rollout_policy
from turnforge.train.trl_internals import drop_patched_forwards, serialize_colocated_sync
from turnforge.types import Task


def generator_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` for generation that shares its frozen parameters (a LoRA model's base) and copies the
    trainable ones, in eval mode, without gradients."""
    shared = {id(p): p for p in model.parameters() if not p.requires_grad}
    generator = copy.deepcopy(model, memo=shared)
    generator.eval()
    for p in generator.parameters():
        p.requires_grad_(False)
    for module in generator.modules():
        # The forwards patched onto the trained model's instance (TRL's fused LM head, accelerate's autocast wrapper)
        # are closures over the TRAINED model: copied, they would run its weights (in training mode). The copy runs
        # its class's forward, in its own dtype (as `grpo_rollouts.own_precision` on a CPU).
        drop_patched_forwards(module)
    return generator


def copy_bytes(model: torch.nn.Module) -> int:
    """What the generator copy costs: the bytes of the trainable parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class WeightSync:
    """The trained model's trainable parameters, copied into the generator's, atomically (`forwards_paused`)."""

    def __init__(self, trained: torch.nn.Module, generator: torch.nn.Module) -> None:
        mine = dict(generator.named_parameters())
        self.pairs = [(mine[name], p) for name, p in trained.named_parameters() if p.requires_grad]

    def __call__(self, generator: torch.nn.Module) -> None:
        with forwards_paused(generator), torch.no_grad():
            for target, source in self.pairs:
                self.copy(target, source)

    @staticmethod
    def copy(target: torch.Tensor, source: torch.Tensor) -> None:
        target.copy_(source)


class TaskStream:
    """Tasks in seeded shuffled passes over the training tasks; a dropped group's task goes back to the front."""

    def __init__(self, tasks: list[Task], seed: int) -> None:
        self.tasks, self.rng, self.queue = list(tasks), random.Random(seed), deque()

    def next(self) -> Task:
        if not self.queue:
            order = list(self.tasks)
            self.rng.shuffle(order)
            self.queue.extend(order)
        return self.queue.popleft()

    def again(self, task: Task) -> None:
        self.queue.appendleft(task)


def engine_thread(threads: int) -> ThreadPoolExecutor:
    """One thread for a colocated vLLM engine's calls, with the OpenMP count the engine was built with on the training
    thread. vLLM's CPU attention plans each step for the calling thread's count and checks it in the kernel
    ("Check failed: input->metadata->thread_num == thread_num (2 vs. 1)" from a group thread), and its CPU worker
    replaces `torch.set_num_threads` with a no-op once built, so the count is set with torch's own setter."""
    return ThreadPoolExecutor(1, thread_name_prefix="grpo-async-vllm", initializer=torch._C.set_num_threads,
                              initargs=(threads,))


class SerialBatches:
    """A policy whose engine takes one call at a time (vLLM's `LLM`), shared by the worker's group threads: the calls
    that arrive while one runs go together as the next call (those with the same sampling settings), and TRL's weight
    sync takes `lock` too (`trl_internals.serialize_colocated_sync`), so new weights land between two calls."""

    def __init__(self, policy, threads: int | None = None) -> None:
        self.policy, self.lock, self.mutex = policy, threading.Lock(), threading.Lock()
        self.pending: list[tuple[list, Any, Future]] = []
        # `threads`: the calls run on one engine thread of their own, with that OpenMP count (`engine_thread`)
        self.engine = engine_thread(threads) if threads else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["policy"], name)

    def generate(self, prompts, params):
        mine: Future = Future()
        with self.mutex:
            self.pending.append((list(prompts), params, mine))
        with self.lock:
            if not mine.done():  # else an earlier holder answered it with its own call
                with self.mutex:
                    batch = [r for r in self.pending if r[1] == params]
                    self.pending = [r for r in self.pending if r[1] != params]
                try:
                    asked = [p for r in batch for p in r[0]]
                    replies = (self.engine.submit(self.policy.generate, asked, params).result() if self.engine
                               else self.policy.generate(asked, params))
                except BaseException as error:  # noqa: BLE001 - every caller of the batch gets it
                    for _, _, future in batch:
                        future.set_exception(error)
                else:
                    at = 0
                    for asked, _, future in batch:
                        future.set_result(replies[at:at + len(asked)])
                        at += len(asked)
        return mine.result()


@dataclass
class AsyncGroup(Group):
    """A group played by the worker: its start order, and each episode's per-turn weight versions."""

    uid: str = ""
    order: int = 0
    start_version: int = 0
    versions: list[list[int]] = field(default_factory=list)

    @property
    def version(self) -> int:
        """The version the staleness rule reads: the weights when the group started, never newer than its oldest
        turn's (`versions`), and known while it still plays."""
        return self.start_version


class VersionedPolicy:
    """The generator's policy, recording the weight version each reply was submitted with, per (episode key,
    sample, turn)."""

    def __init__(self, policy: HFPolicy, version) -> None:
        self.policy, self.version, self.seen = policy, version, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def generate(self, prompts, params, on_token=None):
        now = self.version()
        for p in prompts:
            self.seen[(p.task.id, p.sample, p.turn)] = now
        return self.policy.generate(prompts, params)


class AsyncEpisodeRollouts(EpisodeRollouts):
    """TRL's `rollout_func` for `max_staleness` > 0 (module docstring). `off_policy` tells the trainer to weigh the
    loss by the importance ratios (`EpisodeGRPOTrainer.off_policy_weights`)."""

    off_policy = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        s = self.settings
        self.k = s.max_staleness
        self.cond = threading.Condition()
        self.version = 0
        self.finished: list[AsyncGroup] = []
        self.playing: dict[str, AsyncGroup] = {}
        self.doomed: set[str] = set()
        """Playing groups already past the staleness bound: dropped when they finish; they hold no capacity."""
        self.started = 0
        self.error: BaseException | None = None
        self.closing = False
        self.generator = self.policy = self.sync = self.stream = self.serial = None
        self.start_step = 0
        self.generator_busy_s = 0.0
        self.trainer_waiting = False
        self._extra: dict[str, Any] = {}

    # -- the worker ------------------------------------------------------------------------------------------

    def _start_worker(self, trainer: GRPOTrainer) -> None:
        self.start_step = self.version = trainer.state.global_step
        # under `accelerate launch` (DDP) each process runs a worker of its own: its own tasks and seeds
        self.rank = trainer.accelerator.process_index
        self.stream = TaskStream(list(self.tasks.values()),
                                 self.settings.seed * 1_000_003 + self.start_step + 7_777_777 * self.rank)
        if self.policy_factory is not rollout_policy:  # a given policy (tests: scripted): no weights to copy
            self.policy = VersionedPolicy(self.policy_factory(trainer, None, self.tokenizer, self.settings),
                                          lambda: self.version)
            return
        if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
            raise ValueError("grpo max_staleness > 0 needs each process to hold the whole model (its generator copies "
                             "the weights): DDP, not FSDP or DeepSpeed")
        if trainer.use_vllm:  # TRL's colocated engine holds its own copy of the weights: it is the generator
            self.serial = SerialBatches(rollout_policy(trainer, None, self.tokenizer, self.settings),
                                        torch.get_num_threads())
            serialize_colocated_sync(trainer, self.serial.lock)
            self.policy = VersionedPolicy(self.serial, lambda: self.version)
            return
        trained = trainer.accelerator.unwrap_model(trainer.model)
        self.generator = generator_copy(trained)
        self.sync = WeightSync(trained, self.generator)
        policy = HFPolicy.from_model(self.generator, self.tokenizer, batch_size=(self.k + 1) * self.settings.episodes_per_step,
                                     model_id="grpo-async")
        self.policy = VersionedPolicy(policy, lambda: self.version)

    def _fill(self, room: int) -> None:
        """Start groups until `room` are in flight, playing or finished, past the bound not counted (holding `cond`)."""
        while len(self.finished) + len(self.playing) - len(self.doomed) < room and not self.closing:
            self._begin(self.stream.next())

    def _begin(self, task: Task) -> None:
        order = self.started
        self.started += 1
        uid = f"{self.start_step}:{order}" + (f"/{self.rank}" if self.rank else "")  # process N's ends in /N
        group = AsyncGroup(task, self.settings.num_generations, uid=uid, order=order, start_version=self.version)
        if not self.playing:
            self.generator_busy_s -= time.perf_counter()
        self.playing[group.uid] = group
        self._share_cores()
        threading.Thread(target=self._play_group, args=(group,), daemon=True, name=f"grpo-async-{group.uid}").start()

    def _play_group(self, group: AsyncGroup) -> None:
        s = self.settings
        key = f"{group.task.id}#{group.uid}"
        keyed = Task(key, group.task.env, group.task.split, group.task.category, group.task.data)
        # vLLM seeds each request from (seed, task id, sample, turn), and the task id is keyed by the group: one seed
        # for all groups lets their calls go together (`SerialBatches`); hf seeds torch once a call, so one per group
        order = 0 if self.serial is not None else group.order + 1
        params = s.sampling().replace(seed=s.seed + 7919 * order + 104729 * self.start_step + 15485863 * self.rank)
        try:
            trajs = run_episodes(self.policy, self._make_env, [keyed], group.size,
                                 RolloutLimits(max_turns=s.max_turns, max_open=group.size), params,
                                 renderer=self.policy.renderer, roles=self._roles(params), progress=False)
        except BaseException as error:  # noqa: BLE001 - handed to the training thread, which raises it
            with self.cond:
                self.playing.pop(group.uid, None)
                self._share_cores()
                if not self.closing and self.error is None:
                    self.error = error
                self.cond.notify_all()
            return
        for traj in trajs:
            traj.task_id = group.task.id
            group.versions.append([self.policy.seen.pop((key, traj.sample, t), self.version)
                                   for t in range(len(traj.turns))])
            for t in range(len(traj.turns), len(traj.turns) + 2):  # a reply refused or cut short left no turn
                self.policy.seen.pop((key, traj.sample, t), None)
        group.episodes = trajs
        with self.cond:
            self.playing.pop(group.uid, None)
            if not self.playing:
                self.generator_busy_s += time.perf_counter()
            self._share_cores()
            self.finished.append(group)
            self.cond.notify_all()

    # -- one optimizer step ----------------------------------------------------------------------------------

    def __call__(self, prompts: list[list[dict[str, Any]]], trainer: GRPOTrainer) -> dict[str, list]:
        started = time.perf_counter()
        self.trainer = trainer
        if self.policy is None:
            self._start_worker(trainer)
        elif self.sync is not None:
            self.sync(self.generator)  # new weights, atomically, before any group of this step starts
        with self.cond:
            self.version = trainer.state.global_step
            self.calls += 1
            groups, drawn, replaced, dropped = self._take(len(prompts) // self.settings.num_generations)
            carried = len(self.playing)
        waited = time.perf_counter() - started
        episodes = [traj for g in groups for traj in g.episodes]
        out = self._to_trl(episodes)
        self.step_advantages = self._step_advantages(groups, out) if self.settings.step_advantage_weight else None
        mine = {"ages": [self.version - g.version for g in groups], "dropped": dropped, "carried": carried,
                "group_ids": [g.uid for g in groups], "waited": waited, "busy": self._busy()}
        every = gather_object([mine]) if trainer.accelerator.num_processes > 1 else [mine]  # each process's worker
        staleness = Counter(age for m in every for age in m["ages"])
        self._extra = {
            "step": self.version + 1,
            "staleness": {str(k): staleness[k] for k in sorted(staleness)},
            "stale_dropped_groups": sum(m["dropped"] for m in every),
            "carried_groups": sum(m["carried"] for m in every),
            "group_ids": [uid for m in every for uid in m["group_ids"]],
            "trainer_wait_s": round(max(m["waited"] for m in every), 3),  # the step waits for the slowest process
            "generator_busy_s": round(min(m["busy"] for m in every), 3),
        }
        left = sum(self._flat(g.episodes) for g in groups)
        self._log(episodes, [t for g in drawn for t in g.episodes], groups, replaced, left, waited)
        return out

    def _take(self, wanted: int) -> tuple[list[AsyncGroup], list[AsyncGroup], int, int]:
        """The oldest finished groups within the staleness bound, waiting while too few are finished (holding
        `cond`). Returns (groups, drawn: the first `wanted` taken before dynamic sampling's skips, replaced, dropped)."""
        s = self.settings
        skips = s.resample_rounds * wanted if s.dynamic_sampling else 0
        groups, drawn, replaced, dropped = [], [], 0, 0
        while len(groups) < wanted:
            dropped += self._drop_stale()
            # (k + 1) steps' worth in flight while this step takes its groups, k steps' worth once it has them: a
            # group started now is trained within k steps, unless it plays longer than the groups before it
            self._fill(self.k * wanted + wanted - len(groups))
            if not self.finished:
                if self.error is not None:
                    raise RuntimeError(f"async GRPO: a rollout group failed: {self.error}") from self.error
                self.trainer_waiting = True
                self._share_cores()
                self.cond.wait()
                self.trainer_waiting = False
                self._share_cores()
                continue
            group = min(self.finished, key=lambda g: g.order)
            self.finished.remove(group)
            if len(drawn) < wanted:
                drawn.append(group)
            if skips and len(group.episodes) == s.num_generations and self._flat(group.episodes):
                skips -= 1
                replaced += 1
                continue
            groups.append(group)
        return groups, drawn, replaced, dropped

    def _drop_stale(self) -> int:
        """The staleness rule: a finished group sampled more than k versions ago is dropped, its task drawn again;
        a playing one past it is marked doomed (it frees its room at once, and is dropped when it finishes)."""
        stale = [g for g in self.finished if self.version - g.version > self.k]
        for group in stale:
            self.finished.remove(group)
            self.doomed.discard(group.uid)
            self.stream.again(group.task)
        for group in self.playing.values():
            if self.version - group.version > self.k and group.uid not in self.doomed:
                self.doomed.add(group.uid)
        return len(stale)

    def _share_cores(self) -> None:
        """On a CPU, the trainer and the engine each take their share of the free cores while both compute, all of
        them while one waits (`machine.computing_threads`; holding `cond`)."""
        computing_threads((not self.trainer_waiting) + bool(self.playing))

    def _busy(self) -> float:
        """Seconds the generator had at least one group playing since it started."""
        return self.generator_busy_s + (time.perf_counter() if self.playing else 0.0)

    def batch_metrics(self) -> dict[str, Any]:
        return self._extra

    def close(self) -> None:
        """Stop the worker: the engine stops, the groups still playing end (lost: a later run re-samples)."""
        with self.cond:
            self.closing = True
        computing_threads(1)
        close = getattr(self.policy.policy, "close", None) if self.policy is not None else None
        if close is not None:
            close()
