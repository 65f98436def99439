"""GRPO's rollout function: TRL's `rollout_func` that plays whole episodes with the model being trained.

Each generation batch, `EpisodeRollouts` plays the batch's groups (`Group`: `size` episodes of one task, compared
with each other) with turnforge's rollout engine (`run_episodes`, token-exact) and returns per episode the
sequences TRL scores (`episode_sequence`), the reward components its reward functions read back, and, with
GiGPO, the per-token step advantages `grpo_trainer.StepCreditGRPOTrainer` adds. Dynamic sampling (DAPO)
replaces a group whose rewards are all equal by another task's group, for up to `resample_rounds` tries.
One line of `rollouts.jsonl` per batch (`EpisodeRollouts._log`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from turnforge.data.sft import assistant_mask, episode_pieces
from turnforge.envs.base import make_env
from turnforge.policies.base import Policy, SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.policies.queue import Role
from turnforge.policies.roles import env_roles
from turnforge.rewards import COMPONENTS, reward_components, total_reward
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.settings import GRPOSettings
from turnforge.train.step_credit import group_step_advantages, reward_scale, token_values
from turnforge.train.trl_internals import autocast_wrapped_forward
from turnforge.types import Task, Trajectory


@dataclass
class Group:
    """A GRPO group: `size` episodes of one task, each episode's advantage taken against the others'."""

    task: Task
    size: int
    episodes: list[Trajectory] = field(default_factory=list)
    """Empty until played."""


def episode_sequence(traj: Trajectory, max_completion_length: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of one token-exact episode.

    completion = turn 1 generated ids, turn 1 observation ids, turn 2 generated ids, ..., last generated ids
    (the observation after the last turn is left out); env_mask is the SFT loss mask (`assistant_mask`: 1
    exactly on generated ids of turns with `Turn.learn`). Cut to `max_completion_length` tokens.
    """
    try:
        pieces = episode_pieces(traj)
    except ValueError:
        raise ValueError("GRPO needs whole-episode token sequences; the episode was played with a history window") from None
    logprobs: list[float] = []
    for k, (turn, (_, observation)) in enumerate(zip(traj.turns, pieces, strict=True)):
        if len(turn.logprobs) != len(turn.generated_ids):
            raise ValueError(f"episode {traj.task_id}: turn {k} has {len(turn.logprobs)} logprobs for "
                             f"{len(turn.generated_ids)} ids")
        logprobs += [*turn.logprobs, *[0.0] * len(observation)]
    sequence = assistant_mask([], pieces, [turn.learn for turn in traj.turns])
    n = max_completion_length
    return list(traj.prompt_ids), sequence.input_ids[:n], sequence.completion_mask[:n], logprobs[:n]


def rollout_policy(trainer: GRPOTrainer, model, tokenizer, settings: GRPOSettings) -> Policy:
    """The policy that plays the episodes: vLLM through TRL's own engine when `use_vllm` (TRL has synced the
    trained weights into it before calling the rollout function), else the hf backend's engine on the trained model."""
    if not trainer.use_vllm:
        return HFPolicy.from_model(model, tokenizer, batch_size=settings.episodes_per_step, model_id="grpo")
    from turnforge.policies.vllm import TRLServerPolicy, VLLMPolicy  # GPU only

    engine = trainer.vllm_generation
    if engine.mode == "colocate":
        return VLLMPolicy.from_llm(engine.llm, tokenizer, model_id="grpo-vllm")
    return TRLServerPolicy(engine.vllm_client, tokenizer, trainer.model.config.name_or_path)


@contextmanager
def own_precision(model):
    """On a CPU, the model generates in its own dtype while inside, as evaluations run it: accelerate wraps a
    mixed-precision model's forward in autocast, which on a CPU casts every weight at every decoding step (a
    tenth of a quickstart rollout, BENCHMARKS.md). The sampled log-probabilities feed no loss term here (TRL's
    importance correction is vLLM's), so the behaviour policy is simply the model that is evaluated."""
    original = autocast_wrapped_forward(model)
    if original is None or model.device.type != "cpu":
        yield
        return
    wrapped = model.forward
    model.forward = original
    try:
        yield
    finally:
        model.forward = wrapped


class EpisodeRollouts:
    """TRL's `rollout_func(prompts, trainer) -> dict`: plays the prompts' tasks with the trainer's model.

    `prompts` holds each task `num_generations` times in a row (TRL's RepeatSampler); every entry becomes
    one episode, and the i-th output is the i-th entry's episode (or, with dynamic sampling, a replacement).
    """

    def __init__(
        self,
        env_name: str,
        env_options: dict[str, Any],
        tasks: list[Task],
        tokenizer,
        settings: GRPOSettings,
        log_path: Path | None = None,
        policy_factory: Callable[..., Policy] | None = None,
    ) -> None:
        self.env_name, self.env_options = env_name, env_options
        self.tasks = {t.id: t for t in tasks}
        self.tokenizer = tokenizer
        self.settings = settings
        self.log_path = log_path
        self.policy_factory = policy_factory or rollout_policy
        self.role_policies: dict[str, Role] | None = None
        self.rng = random.Random(settings.seed)
        self.rank = 0
        """The process under `accelerate launch`: its replacement draws and sampling seeds are its own (`_seed_rank`)."""
        self.calls = 0
        self.episodes = 0
        self.step_advantages: list[list[float]] | None = None
        """The last batch's per-token step-level advantages (`step_advantage_weight` > 0), for `StepCreditGRPOTrainer`."""

    def __call__(self, prompts: list[list[dict[str, Any]]], trainer: GRPOTrainer) -> dict[str, list]:
        started = time.perf_counter()
        slots = [self.tasks[p[-1]["task_id"]] for p in prompts]
        self.trainer = trainer
        self._seed_rank(trainer)
        if trainer.use_vllm:  # vLLM generates; the trained model is not needed here
            groups, played, replaced, left = self._rollout(None, slots)
        else:
            # As TRL's own generation: the bare model, ZeRO-3's sharded parameters gathered while it generates.
            args = trainer.args
            with unwrap_model_for_generation(
                trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs,
            ) as model, own_precision(model):
                was_training = model.training
                model.eval()
                try:
                    groups, played, replaced, left = self._rollout(model, slots)
                finally:
                    model.train(was_training)
        episodes = [traj for g in groups for traj in g.episodes]
        drawn = [traj for g in played for traj in g.episodes]
        out = self._to_trl(episodes)
        self.step_advantages = self._step_advantages(groups, out) if self.settings.step_advantage_weight else None
        self._log(episodes, drawn, groups, replaced, left, time.perf_counter() - started)
        return out

    def _seed_rank(self, trainer: GRPOTrainer) -> None:
        """Under `accelerate launch` each process draws dynamic sampling's replacement tasks and samples with seeds of
        its own (the same seeds would play the same replacement groups, token for token, on every process); the main
        process keeps the single-process seeds."""
        rank = getattr(trainer.accelerator, "process_index", 0)
        if rank != self.rank:
            self.rank, self.rng = rank, random.Random(self.settings.seed + 104729 * rank)

    def _rollout(self, model, slots: list[Task]) -> tuple[list[Group], list[Group], int, int]:
        """The slots' groups played, then dynamic sampling's replacements (`_resample`), all with one policy: the
        weights are this step's throughout (an hf engine made per batch cost ~0.7 s to stop, most of it transformers'
        `gc.collect`, and dynamic sampling doubled the batches). Returns (groups, played, replaced, left)."""
        policy = self.policy_factory(self.trainer, model, self.tokenizer, self.settings)
        try:
            played = self._play(policy, slots)
            groups, replaced, left = self._resample(policy, played)
            return groups, played, replaced, left
        finally:  # the hf engine's KV blocks hold this step's weights: the next step starts a fresh one
            close = getattr(policy, "close", None)
            if close is not None:
                close()

    def _play(self, policy: Policy, slots: list[Task]) -> list[Group]:
        """The groups of the slots (a run of the same task is one group), played, in slot order."""
        groups: list[Group] = []
        for task in slots:
            if groups and groups[-1].task.id == task.id:
                groups[-1].size += 1
            else:
                groups.append(Group(task, 1))
        return self._episodes(policy, groups)

    def _episodes(self, policy: Policy, groups: list[Group]) -> list[Group]:
        """`groups` with their episodes played, in one batch of the rollout engine."""
        s = self.settings
        self.calls += 1
        params = s.sampling().replace(seed=s.seed + 7919 * self.calls + 15485863 * self.rank)
        limits = RolloutLimits(max_turns=s.max_turns, max_open=s.episodes_per_step)
        # run_episodes keys episodes by (task id, sample): each group plays a copy of its task under a key of its
        # own, so that a task drawn twice in one batch stays two groups; the episodes get the task's id back.
        width = max(g.size for g in groups)
        keyed = [Task(f"{g.task.id}#{k}", g.task.env, g.task.split, g.task.category, g.task.data)
                 for k, g in enumerate(groups)]
        skip = frozenset((kt.id, i) for kt, g in zip(keyed, groups, strict=True) for i in range(g.size, width))
        trajs = run_episodes(
            policy, self._make_env, keyed, width, limits, params, skip=skip,
            renderer=policy.renderer, roles=self._roles(params),
        )
        by_key: dict[str, list[Trajectory]] = {}
        for traj in trajs:
            by_key.setdefault(traj.task_id, []).append(traj)
        played = []
        for kt, g in zip(keyed, groups, strict=True):
            for traj in by_key[kt.id]:
                traj.task_id = g.task.id
            played.append(Group(g.task, g.size, by_key[kt.id]))
        return played

    def _make_env(self):
        return make_env(self.env_name, **self.env_options)

    def _roles(self, params: SamplingParams) -> dict[str, Role]:
        """The env's model roles (e.g. a user simulator), built once; each rollout gets this call's seed."""
        if self.role_policies is None:
            self.role_policies = env_roles(self.env_name, self.env_options, params, self.settings.seed, "hf")
        return {name: Role(r.policy, r.params.replace(seed=params.seed)) for name, r in self.role_policies.items()}

    def _resample(self, policy: Policy, played: list[Group]) -> tuple[list[Group], int, int]:
        """DAPO dynamic sampling: the groups `played`, with zero-variance full groups swapped for fresh tasks' groups
        (a new list; `played` stays as drawn), how many were replaced, and how many flat groups are left."""
        s = self.settings
        groups = list(played)
        replaced = 0
        if not s.dynamic_sampling:
            return groups, 0, sum(self._flat(g.episodes) for g in groups)
        for _ in range(s.resample_rounds):
            flat = [i for i, g in enumerate(groups) if len(g.episodes) == s.num_generations and self._flat(g.episodes)]
            if not flat:
                break
            used = {g.task.id for g in groups}
            pool = [t for t in self.tasks.values() if t.id not in used] or list(self.tasks.values())
            fresh = self._episodes(policy, [Group(self.rng.choice(pool), s.num_generations) for _ in flat])
            for i, group in zip(flat, fresh, strict=True):
                groups[i] = group
                replaced += 1
        return groups, replaced, sum(self._flat(g.episodes) for g in groups)

    def _flat(self, group: list[Trajectory]) -> bool:
        rewards = {round(self._total(t), 9) for t in group}
        return len(group) > 1 and len(rewards) == 1

    def _components(self, traj: Trajectory) -> dict[str, float]:
        generated = sum(len(t.generated_ids) for t in traj.turns)
        return reward_components(traj, self.settings.rewards, generated, self.settings.max_completion_length)

    def _total(self, traj: Trajectory) -> float:
        return total_reward(self._components(traj), self.settings.rewards)

    def _step_advantages(self, groups: list[Group], trl: dict[str, list]) -> list[list[float]]:
        """GiGPO's step-level advantage on every completion token of each episode, in output order (in
        reward units divided by the std TRL divides that episode's advantage by: `step_credit`). The episode
        rewards are the totals of the components `_to_trl` computed (`trl`), in the same order."""
        s = self.settings
        flat = [total_reward({n: trl[f"reward_{n}"][i] for n in COMPONENTS}, s.rewards) for i in range(len(trl["prompt_ids"]))]
        batch_scale = reward_scale(flat)
        out, start = [], 0
        for g in groups:
            group = g.episodes
            rewards, start = flat[start : start + len(group)], start + len(group)
            scale = {"group": reward_scale(rewards), "batch": batch_scale}.get(s.scale_rewards, 1.0)
            per_turn = group_step_advantages(group, rewards, s.step_discount, scale)
            out += [token_values(traj, values, s.max_completion_length) for traj, values in zip(group, per_turn, strict=True)]
        return out

    def _to_trl(self, episodes: list[Trajectory]) -> dict[str, list]:
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": []}
        for name in COMPONENTS:
            out[f"reward_{name}"] = []
        for traj in episodes:
            prompt, completion, mask, logprobs = episode_sequence(traj, self.settings.max_completion_length)
            if not completion:  # an episode that ended before its first reply (env error): one pad token, no loss
                completion, mask, logprobs = [self.tokenizer.pad_token_id], [0], [0.0]
            if not prompt:  # its reset failed too: no rendered prompt (an empty list would become a float tensor)
                prompt = [self.tokenizer.pad_token_id]
            out["prompt_ids"].append(prompt)
            out["completion_ids"].append(completion)
            out["env_mask"].append(mask)
            out["logprobs"].append(logprobs)
            for name, value in self._components(traj).items():
                out[f"reward_{name}"].append(value)
        return out

    def batch_metrics(self) -> dict[str, float]:
        """More entries for this batch's line of rollouts.jsonl (a subclass's: distillation's KL to the teacher)."""
        return {}

    def _log(self, episodes, drawn, groups, replaced: int, left: int, wall_s: float) -> None:
        """One line of rollouts.jsonl. `success`, `progress`, `reward` and `turns` are the trained batch's (after
        dynamic sampling); `drawn_success` and `drawn_reward` those of the groups TRL's sampler drew, before any
        was replaced: the policy's success and reward on uniformly drawn training tasks. Dynamic sampling replaces a group whose rewards are all equal, most often a task
        every episode solves alike, so the trained batch leaves out more easy tasks as the policy improves."""
        # Under `accelerate launch` each process played its shard of the batch (TRL splits the prompts): the
        # episodes are counted and logged gathered, by the main process.
        mine = [(t.score.success, t.score.progress, self._total(t), len(t.turns)) for t in episodes]
        first = [(t.score.success, self._total(t)) for t in drawn]
        counts = [(len(groups), left, replaced)]
        if self.trainer.accelerator.num_processes > 1:
            mine, first, counts = gather_object(mine), gather_object(first), gather_object(counts)
        self.episodes += len(mine)
        if self.log_path is None or not self.trainer.accelerator.is_main_process:
            return
        n, m = max(1, len(mine)), max(1, len(first))
        line = {
            "batch": self.calls,
            "episodes": len(mine),
            "success": sum(e[0] for e in mine) / n,
            "progress": sum(e[1] for e in mine) / n,
            "reward": sum(e[2] for e in mine) / n,
            "turns": sum(e[3] for e in mine) / n,
            "drawn_success": sum(e[0] for e in first) / m,
            "drawn_reward": sum(e[1] for e in first) / m,
            "groups": sum(c[0] for c in counts),
            "zero_variance_groups": sum(c[1] for c in counts),
            "replaced_groups": sum(c[2] for c in counts),
            "wall_s": round(wall_s, 3),
            **self.batch_metrics(),
        }
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
