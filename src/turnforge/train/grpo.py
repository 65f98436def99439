"""GRPO stage: multi-turn GRPO on TRL's `GRPOTrainer`, with turnforge's rollout engine as its `rollout_func`.

Read top to bottom, one call of `run_grpo` does:
  1. build a dataset with one row per training task: the env's first messages, each carrying the task id
     (TRL hands the prompts, and nothing else, to the rollout function);
  2. build TRL's `GRPOTrainer` with `rollout_func = EpisodeRollouts(...)` and one reward function per
     component of `turnforge.rewards` (TRL sums them with `reward_weights`; weight 0 = logged only);
  3. each generation batch, `EpisodeRollouts` plays whole episodes with the model being trained
     (`run_episodes`, token-exact), and returns per episode:
       prompt_ids      the rendered first prompt,
       completion_ids  every turn's generated ids, and between turns the observation's chat-template ids,
       env_mask        1 on generated ids, 0 on observation ids (TRL multiplies it into the loss mask),
       logprobs        the sampled tokens' log-probabilities (0 on observation tokens),
     plus `reward_<component>` lists that the reward functions read back;
  4. write `out_dir/model/` (merged, or the LoRA adapter), `metrics.jsonl` (TRL's logs: reward,
     rewards/<component>/mean, frac_reward_zero_std, ...) and `rollouts.jsonl` (one line per generation
     batch: success rate and mean reward of the trained batch and of the drawn groups before dynamic sampling,
     zero-variance groups, replaced groups); the result holds the drawn reward's first- and last-quarter means.

How it departs from plain TRL:
  - Generation is turnforge's (HF `generate` through `HFPolicy.from_model`, or with `use_vllm` the vLLM
    engine TRL built and keeps in sync, through `VLLMPolicy` / `TRLServerPolicy`), not TRL's single-turn
    generate: an episode is many assistant turns with env observations between them. The token sequence
    is never re-tokenized, so the ids TRL scores are exactly the ids the model sampled.
  - The observation after the LAST turn is not part of the completion: the model never saw it, and TRL
    reads "last token is not EOS" as truncated (`mask_truncated_completions`).
  - Dynamic sampling (DAPO): with `dynamic_sampling = true`, a group whose rewards are all equal (no
    learning signal; TRL logs their share as `frac_reward_zero_std`) is replaced by the group of another
    training task, for up to `resample_rounds` tries; what is left is counted in rollouts.jsonl.
  - Episodes with a history window have no single token sequence, so GRPO refuses them.
  - Failure restarts (`restarts = "failures"`): each group's task is first played once greedily with the
    current model; where that fails, the group's episodes replay the greedy episode up to the turn after its
    last progress gain (`restart_turn`) and sample from there, so the group's comparison is made at the state
    where the greedy policy, the one evaluated, went wrong. The replayed turns are context (`Turn.learn`
    False: no loss). `"failures_only"` also swaps the tasks greedy solves for ones it fails, found by
    screening fresh tasks greedily. rollouts.jsonl logs the greedy episodes' success per batch (all of them
    are of uniformly drawn tasks: a greedy-success curve for the price of the screening).
  - Scoring (`EpisodeGRPOTrainer`): each episode's log-probabilities are computed on its own tokens, a few
    rows of similar length at a time, instead of on TRL's batch padded to its longest episode (mostly padding
    in a multi-turn batch); the same values up to rounding.
  - Step-level credit (GiGPO, `step_advantage_weight` > 0): `StepCreditGRPOTrainer` adds to TRL's episode
    advantages a per-turn term, each turn's discounted return against the turns of its group that saw the
    same observation (`turnforge.train.step_credit`).

    turnforge run quickstart --out runs/qs          # its stage `grpo`
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation

from turnforge.data.sft import assistant_mask, episode_pieces
from turnforge.envs.base import get_env_spec, make_env
from turnforge.eval.curves import quarter_means, read_points
from turnforge.models import load_model
from turnforge.models.tiny import resolve_model
from turnforge.policies.base import Generation, Policy, SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.policies.queue import Role
from turnforge.policies.roles import env_roles
from turnforge.policies.scripted import ExpertGuided
from turnforge.rewards import COMPONENTS, reward_components, total_reward
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.lm_head import score_labelled_only
from turnforge.train.runtime import (
    METRICS_FILE,
    MODEL_DIR,
    MetricsFileCallback,
    autocast_wrapped_forward,
    checkpointing_on,
    expanded_cache,
    resume_point,
    save_trained,
    training_dtype,
    trl_config,
)
from turnforge.train.settings import ROLLOUTS_FILE, GRPOSettings
from turnforge.train.step_credit import group_step_advantages, reward_scale, token_values
from turnforge.types import Task, Trajectory

logger = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "MODEL_DIR", "ROLLOUTS_FILE", "EpisodeRollouts", "GRPOSettings", "grpo_config", "run_grpo"]


# ---------------------------------------------------------------------------------------------------------------
# 1. Episodes as TRL sequences


def episode_sequence(traj: Trajectory, max_completion_length: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """(prompt_ids, completion_ids, env_mask, logprobs) of one token-exact episode.

    completion = turn 1 generated ids, turn 1 observation ids, turn 2 generated ids, ..., last generated ids
    (the observation after the last turn is left out); env_mask is the SFT loss mask (`assistant_mask`: 1
    exactly on generated ids, except a replayed prefix's: `Turn.learn`). Cut to `max_completion_length` tokens.
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


# ---------------------------------------------------------------------------------------------------------------
# 2. The rollout function


def task_prompt(task: Task, messages: list) -> list[dict[str, str]]:
    """The dataset prompt of a task: its first messages, each tagged with the task id (TRL passes prompts only)."""
    return [{"role": m.role, "content": m.content, "task_id": task.id} for m in messages]


def restart_turn(traj: Trajectory) -> int:
    """Where a failure restart begins: the turn after the last one that raised the episode's progress (0 when
    none did: the group starts afresh). The greedy policy's wrong decision lies at or after it.

    >>> from turnforge.types import Score, StopReason, Turn
    >>> turns = [Turn("a", progress=0.0), Turn("b", progress=0.5), Turn("c", progress=0.5), Turn("d", progress=0.5)]
    >>> restart_turn(Trajectory("t", "e", "c", [], turns, Score(False, 0.0, 0.5), StopReason.max_turns))
    2
    """
    last, best = 0, 0.0
    for k, turn in enumerate(traj.turns):
        if turn.progress > best:
            last, best = k + 1, turn.progress
    return last


def replayed(traj: Trajectory, turns: int) -> list[Generation]:
    """The first `turns` replies of `traj` as generations to replay (token-exact ids, no loss)."""
    return [
        Generation(t.text, list(t.generated_ids), list(t.logprobs), t.finish_reason or "stop", learn=False)
        for t in traj.turns[:turns]
    ]


def rollout_policy(trainer: GRPOTrainer, model, tokenizer, settings: GRPOSettings) -> Policy:
    """The policy that plays the episodes: vLLM through TRL's own engine when `use_vllm` (TRL has synced the
    trained weights into it before calling the rollout function), else HF `generate` on the trained model."""
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
        self.calls = 0
        self.episodes = 0
        self.greedy: list[bool] = []
        """This batch's greedy episodes' success (`restarts`), and how many of its groups restarted."""
        self.restarted = 0
        self.guided = 0
        """This batch's replies written by the expert (`guide`)."""
        self.step_advantages: list[list[float]] | None = None
        """The last batch's per-token step-level advantages (`step_advantage_weight` > 0), for `StepCreditGRPOTrainer`."""

    def __call__(self, prompts: list[list[dict[str, Any]]], trainer: GRPOTrainer) -> dict[str, list]:
        started = time.perf_counter()
        slots = [self.tasks[p[-1]["task_id"]] for p in prompts]
        self.trainer = trainer
        self.greedy, self.restarted, self.guided = [], 0, 0
        if trainer.use_vllm:  # vLLM generates; the trained model is not needed here
            played = self._play(None, slots)
            groups, replaced, left = self._resample(None, played)
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
                    played = self._play(model, slots)
                    groups, replaced, left = self._resample(model, played)
                finally:
                    model.train(was_training)
        episodes = [traj for _, trajs in groups for traj in trajs]
        drawn = [traj for _, trajs in played for traj in trajs]
        self.episodes += len(episodes)
        out = self._to_trl(episodes)
        self.step_advantages = self._step_advantages(groups, out) if self.settings.step_advantage_weight else None
        self._log(episodes, drawn, groups, replaced, left, time.perf_counter() - started)
        return out

    def _play(self, model, slots: list[Task]) -> list[tuple[Task, list[Trajectory]]]:
        """Episodes for consecutive runs of the same task (one group each), in slot order."""
        runs: list[tuple[Task, int]] = []
        for task in slots:
            if runs and runs[-1][0].id == task.id:
                runs[-1] = (task, runs[-1][1] + 1)
            else:
                runs.append((task, 1))
        return self._episodes(model, runs)

    def _episodes(self, model, runs: list[tuple[Task, int]]) -> list[tuple[Task, list[Trajectory]]]:
        s = self.settings
        policy = self.policy_factory(self.trainer, model, self.tokenizer, s)
        self.calls += 1
        params = SamplingParams(
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens,
            seed=s.seed + 7919 * self.calls, explore=s.explore,
        )
        limits = RolloutLimits(max_turns=s.max_turns, max_open=s.episodes_per_step)
        prefixes: dict[str, list[Generation]] = {}
        if s.restarts != "none":
            runs, prefixes = self._restart_points(policy, runs, limits, params)
        if s.guide:
            policy = ExpertGuided(policy, s.guide, seed=params.seed)
        # Each run gets its own task copy id so that a task drawn twice in one batch stays two groups.
        width = max(n for _, n in runs)
        keyed = [Task(f"{t.id}#{k}", t.env, t.split, t.category, t.data) for k, (t, _) in enumerate(runs)]
        skip = frozenset((kt.id, i) for kt, (_, n) in zip(keyed, runs, strict=True) for i in range(n, width))
        replays = {kt.id: prefixes[t.id] for kt, (t, _) in zip(keyed, runs, strict=True) if t.id in prefixes}
        trajs = run_episodes(
            policy, self._make_env, keyed, width, limits, params, skip=skip,
            renderer=policy.renderer, roles=self._roles(params), prefixes=replays,
        )
        if isinstance(policy, ExpertGuided):
            self.guided += policy.guided
        by_key: dict[str, list[Trajectory]] = {}
        for traj in trajs:
            by_key.setdefault(traj.task_id, []).append(traj)
        groups = []
        for kt, (task, _) in zip(keyed, runs, strict=True):
            group = by_key[kt.id]
            for traj in group:
                traj.task_id = task.id
            groups.append((task, group))
        return groups

    def _make_env(self):
        return make_env(self.env_name, **self.env_options)

    def _restart_points(self, policy: Policy, runs: list[tuple[Task, int]], limits: RolloutLimits,
                        params: SamplingParams) -> tuple[list[tuple[Task, int]], dict[str, list[Generation]]]:
        """The runs (tasks may be swapped) and, by task id, the replies each group replays before sampling.

        Each run's task is played once greedily. `restarts = "failures"`: a failed play is replayed up to its
        `restart_turn`. `"failures_only"` also swaps a task the greedy policy solves for one it fails: per run
        left, 4 fresh candidates are screened greedily, for up to `resample_rounds` (at least 1) rounds; a run
        still without a failure keeps its task and starts afresh.
        """
        s = self.settings
        if self._roles(params):
            raise ValueError(f"grpo: restarts replay the model's replies, but env {self.env_name!r} has model roles "
                             f"{sorted(self._roles(params))}, whose answers would differ on replay")
        greedy = dataclasses.replace(params, temperature=0.0, top_p=1.0, top_k=0)
        played: dict[str, Trajectory] = {}

        def screen(tasks: list[Task]) -> None:
            todo = list({t.id: t for t in tasks if t.id not in played}.values())
            for traj in run_episodes(policy, self._make_env, todo, 1, limits, greedy, renderer=policy.renderer,
                                     progress=False):
                played[traj.task_id] = traj
                self.greedy.append(traj.score.success)

        def failed(task: Task) -> bool:
            return not played[task.id].score.success

        runs = list(runs)
        screen([t for t, _ in runs])
        for _ in range(max(1, s.resample_rounds) if s.restarts == "failures_only" else 0):
            missing = [i for i, (t, _) in enumerate(runs) if not failed(t)]
            pool = [t for t in self.tasks.values() if t.id not in played]
            if not missing or not pool:
                break
            candidates = self.rng.sample(pool, min(len(pool), 4 * len(missing)))
            screen(candidates)
            for i, task in zip(missing, [t for t in candidates if failed(t)], strict=False):
                runs[i] = (task, runs[i][1])
        prefixes = {}
        for task, _ in runs:
            turns = restart_turn(played[task.id])
            if failed(task) and turns:
                prefixes[task.id] = replayed(played[task.id], turns)
        self.restarted += len(prefixes)
        return runs, prefixes

    def _roles(self, params: SamplingParams) -> dict[str, Role]:
        """The env's model roles (e.g. a user simulator), built once; each rollout gets this call's seed."""
        if self.role_policies is None:
            self.role_policies = env_roles(self.env_name, self.env_options, params, self.settings.seed, "hf")
        return {name: Role(r.policy, dataclasses.replace(r.params, seed=params.seed)) for name, r in self.role_policies.items()}

    def _resample(self, model, played):
        """DAPO dynamic sampling: the groups `played`, with zero-variance full groups swapped for fresh tasks' groups
        (a new list; `played` stays as drawn)."""
        s = self.settings
        groups = list(played)
        replaced = 0
        if not s.dynamic_sampling:
            return groups, 0, sum(self._flat(g) for _, g in groups)
        for _ in range(s.resample_rounds):
            flat = [i for i, (_, g) in enumerate(groups) if len(g) == s.num_generations and self._flat(g)]
            if not flat:
                break
            used = {t.id for t, _ in groups}
            pool = [t for t in self.tasks.values() if t.id not in used] or list(self.tasks.values())
            fresh = self._episodes(model, [(self.rng.choice(pool), s.num_generations) for _ in flat])
            for i, group in zip(flat, fresh, strict=True):
                groups[i] = group
                replaced += 1
        return groups, replaced, sum(self._flat(g) for _, g in groups)

    def _flat(self, group: list[Trajectory]) -> bool:
        rewards = {round(self._total(t), 9) for t in group}
        return len(group) > 1 and len(rewards) == 1

    def _components(self, traj: Trajectory) -> dict[str, float]:
        generated = sum(len(t.generated_ids) for t in traj.turns)
        return reward_components(traj, self.settings.rewards, generated, self.settings.max_completion_length)

    def _total(self, traj: Trajectory) -> float:
        return total_reward(self._components(traj), self.settings.rewards)

    def _step_advantages(self, groups: list[tuple[Task, list[Trajectory]]], trl: dict[str, list]) -> list[list[float]]:
        """GiGPO's step-level advantage on every completion token of each episode, in output order (in
        reward units divided by the std TRL divides that episode's advantage by: `step_credit`). The episode
        rewards are the totals of the components `_to_trl` computed (`trl`), in the same order."""
        s = self.settings
        flat = [total_reward({n: trl[f"reward_{n}"][i] for n in COMPONENTS}, s.rewards) for i in range(len(trl["prompt_ids"]))]
        batch_scale = reward_scale(flat)
        out, start = [], 0
        for _, group in groups:
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

    def _log(self, episodes, drawn, groups, replaced: int, left: int, wall_s: float) -> None:
        """One line of rollouts.jsonl. `success`, `progress`, `reward` and `turns` are the trained batch's (after
        dynamic sampling); `drawn_success` and `drawn_reward` those of the groups TRL's sampler drew, before any
        was replaced: the policy's success and reward on uniformly drawn training tasks (with `restarts`, from
        its restart states). Dynamic sampling replaces a group whose rewards are all equal, most often a task
        every episode solves alike, so the trained batch leaves out more easy tasks as the policy improves."""
        if self.log_path is None:
            return
        # Under `accelerate launch` each process played its shard of the batch (TRL splits the prompts): the
        # main process logs them all, gathered.
        mine = [(t.score.success, t.score.progress, self._total(t), len(t.turns)) for t in episodes]
        first = [(t.score.success, self._total(t)) for t in drawn]
        counts = [(len(groups), left, replaced, len(self.greedy), sum(self.greedy), self.restarted, self.guided)]
        if self.trainer.accelerator.num_processes > 1:
            mine, first, counts = gather_object(mine), gather_object(first), gather_object(counts)
        if not self.trainer.accelerator.is_main_process:
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
        }
        if self.settings.restarts != "none":  # greedy episodes of every group played, replacements included
            line["greedy_episodes"] = sum(c[3] for c in counts)
            line["greedy_success"] = sum(c[4] for c in counts) / max(1, line["greedy_episodes"])
            line["restarted_groups"] = sum(c[5] for c in counts)
        if self.settings.guide:  # replacements' episodes included
            line["guided_turns"] = sum(c[6] for c in counts)
        with self.log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def component_reward(name: str):
    """TRL reward function `name` reading back the component the rollout function computed per episode."""

    def reward(prompts=None, completions=None, **kwargs) -> list[float]:
        return [float(v) for v in kwargs[f"reward_{name}"]]

    reward.__name__ = name
    return reward


# ---------------------------------------------------------------------------------------------------------------
# 3. The trainer


def real_spans(attention_mask: torch.Tensor) -> list[tuple[int, int]] | None:
    """Each row's one run of real tokens as (start, end); None when a row's real tokens are not one run."""
    spans = []
    for row in attention_mask.bool():
        where = row.nonzero().flatten()
        if where.numel() == 0:
            spans.append((0, 0))
            continue
        start, end = int(where[0]), int(where[-1]) + 1
        if end - start != where.numel():
            return None
        spans.append((start, end))
    return spans


def prompt_groups(input_ids: torch.Tensor, spans: list[tuple[int, int]], first: int,
                  block: int) -> list[tuple[list[int], int]]:
    """The rows of a GRPO batch that share their prompt (a task's group), with how many of its leading tokens to
    run once for them: the prompt less its last token (whose output scores the first completion token), rounded
    down to `block` (few shapes: oneDNN builds a kernel per new shape). 0 for a row alone or a short prompt.
    Groups in order of their first row."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (start, end) in enumerate(spans):
        groups.setdefault(tuple(input_ids[row, start : min(first, end)].tolist()), []).append(row)
    return [(rows, max(len(prompt) - 1, 0) // block * block if len(rows) > 1 else 0) for prompt, rows in groups.items()]


class EpisodeGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer that scores each episode on its own tokens: TRL pads a batch's prompts on the left and its
    completions on the right to the batch's longest, and a multi-turn batch spans short successes and 30-turn
    failures (most of a padded batch was padding in the quickstart). Here the rows are sorted by length and
    scored `ROWS_PER_CHUNK` at a time, each row's real tokens moved to the row's start and right-padded to the
    chunk's longest (rounded to `pad_to_multiple_of`), so no attention mask is needed: causal attention keeps
    right padding out of every real token's view. Log-probabilities and entropies land where TRL's would (0
    on padding, which its masks drop), through TRL's own fused head. Positions restart at 0 for each row;
    RoPE depends on position differences only, so the scores are TRL's up to rounding. On a CPU the head scores
    the completion positions only (`train.lm_head`).

    The episodes of a group share their prompt (the task's opening, ~45 % of an episode's tokens in the
    quickstart): it runs once per group, one row (`prompt_groups`), and the group's rows continue from its
    keys/values as SFT's `packing = "prefix"` does (`runtime.expanded_cache`); nothing in it is scored, and its
    gradient is the sum over the rows, as when each row ran it. Not in a pass with gradients under activation
    checkpointing: transformers drops a layer's cache where it will recompute the layer, so each row runs it."""

    ROWS_PER_CHUNK = 4  # a fixed row count keeps the chunk shapes few (oneDNN builds a kernel per new shape)
    PROMPT_BLOCK = 64  # a shared prompt is run to a multiple of this many tokens (few shapes, as above)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        score_labelled_only(self)  # on a CPU TRL's head would score the prompt positions too

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **media):
        spans = real_spans(attention_mask)
        if spans is None or compute_aux_loss or any(v is not None for v in media.values()):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **media)
        rows, width = input_ids.shape
        first = width - logits_to_keep  # the first completion position
        multiple = self.pad_to_multiple_of or 1
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
        logps = input_ids.new_zeros((rows, logits_to_keep), dtype=torch.float32)
        entropies = logps.clone() if compute_entropy else None
        # transformers drops a layer's cache where checkpointing will recompute it: the rows then run the prompt
        recomputed = torch.is_grad_enabled() and model.training and checkpointing_on(self.accelerator.unwrap_model(model))
        for group, shared in prompt_groups(input_ids, spans, first, self.PROMPT_BLOCK):
            shared = 0 if recomputed else shared
            prefix = None
            if shared:
                start = spans[group[0]][0]
                with self.accelerator.autocast():
                    prefix = model(input_ids=input_ids[group[0] : group[0] + 1, start : start + shared], use_cache=True,
                                   logits_to_keep=1).cache
            # per row: where its run starts (after the shared prompt), ends, and its first scored token
            extents = {r: (spans[r][0] + shared, spans[r][1], max(first, spans[r][0] + 1)) for r in group}
            order = sorted(group, key=lambda r: extents[r][1] - extents[r][0], reverse=True)
            for at in range(0, len(order), self.ROWS_PER_CHUNK):
                chunk = order[at : at + self.ROWS_PER_CHUNK]
                longest = max(max(extents[r][1] - extents[r][0] for r in chunk), 2)
                ids = input_ids.new_full((len(chunk), -(-longest // multiple) * multiple), pad)
                labels = torch.full_like(ids, -100)
                for k, r in enumerate(chunk):
                    start, end, scored = extents[r]
                    ids[k, : end - start] = input_ids[r, start:end]
                    labels[k, scored - start : end - start] = input_ids[r, scored:end]
                cached = {}
                if prefix is not None:
                    positions = torch.arange(shared, shared + ids.shape[1], device=ids.device).expand(len(chunk), -1)
                    cached = {"cache": expanded_cache(prefix, len(chunk), model.config), "position_ids": positions}
                with self.accelerator.autocast():
                    out = model(input_ids=ids, labels=labels, fused_lm_head=True, **cached)
                for k, r in enumerate(chunk):
                    start, end, scored = extents[r]
                    if end > scored:  # log_probs[t] scores token t + 1
                        logps[r, scored - first : end - first] = out.log_probs[k, scored - start - 1 : end - start - 1]
                        if compute_entropy:
                            entropies[r, scored - first : end - first] = out.entropy[k, scored - start - 1 : end - start - 1]
        if out.log_probs.requires_grad and not logps.requires_grad:  # no token scored (all truncated): as TRL,
            logps = logps + 0 * out.log_probs.sum()  # a zero that backward can run through
        return logps, entropies, None


class StepCreditGRPOTrainer(EpisodeGRPOTrainer):
    """TRL's GRPOTrainer with GiGPO's step-level term added to its advantages: (B,) episode advantages become
    (B, T) = A^E + omega * A^S (`step_credit`); TRL's loss takes (B, T) advantages as they are."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rollouts: EpisodeRollouts = self.rollout_func
        steps, rollouts.step_advantages = rollouts.step_advantages, None
        episode = output["advantages"]
        if steps is None or len(steps) != len(episode):
            raise RuntimeError(f"step advantages for {0 if steps is None else len(steps)} episodes, TRL has {len(episode)}")
        table = torch.zeros(output["completion_ids"].shape, dtype=episode.dtype, device=episode.device)
        for row, values in enumerate(steps):
            n = min(len(values), table.shape[1])
            table[row, :n] = torch.tensor(values[:n], dtype=episode.dtype)
        output["advantages"] = episode.unsqueeze(1) + rollouts.settings.step_advantage_weight * table
        return output


def grpo_config(out_dir: Path, settings: GRPOSettings) -> GRPOConfig:
    """TRL's config: the knobs pass through unchanged; batch = tasks_per_step x num_generations episodes."""
    return trl_config(GRPOConfig, out_dir, settings)


def task_dataset(env_name: str, env_options: dict[str, Any], tasks: list[Task]) -> datasets.Dataset:
    # The prompts only carry the task ids to the rollout function: made without the env's model roles (a model
    # user's opening needs the `user` role, which only the rollouts have; the episodes play with it).
    roles = get_env_spec(env_name).role_options
    env = make_env(env_name, **{k: v for k, v in env_options.items() if k not in roles})
    return datasets.Dataset.from_list([{"prompt": task_prompt(t, env.reset(t))} for t in tasks])


def run_grpo(
    model: str,
    env_name: str,
    env_options: dict[str, Any],
    tasks: list[Task],
    out_dir: Path,
    settings: GRPOSettings,
    adapter: str | None = None,
) -> dict[str, Any]:
    """Train `model` with GRPO on `tasks` of env `env_name`; writes out_dir/model, metrics.jsonl, rollouts.jsonl."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not tasks:
        raise ValueError("grpo: no training tasks (check the stage's split, tasks and filters)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL
    path = resolve_model(model, out_dir / "cache", [(env_name, env_options)])
    lm, tokenizer = load_model(path, dtype=training_dtype(settings.lora), device="cpu", adapter=adapter)
    if adapter is not None:
        lm = lm.merge_and_unload()  # a start model saved as an adapter: its weights become the policy's own
    rollouts = EpisodeRollouts(env_name, env_options, tasks, tokenizer, settings, out_dir / ROLLOUTS_FILE)
    resume = resume_point(out_dir, also_reset=(ROLLOUTS_FILE,))
    trainer_class = StepCreditGRPOTrainer if settings.step_advantage_weight else EpisodeGRPOTrainer
    trainer = trainer_class(
        model=lm,
        reward_funcs=[component_reward(name) for name in COMPONENTS],
        args=grpo_config(out_dir, settings),
        train_dataset=task_dataset(env_name, env_options, tasks),
        processing_class=tokenizer,
        peft_config=settings.lora.to_peft() if settings.lora is not None else None,
        rollout_func=rollouts,
        callbacks=[MetricsFileCallback(out_dir / METRICS_FILE)],
    )
    result = trainer.train(resume_from_checkpoint=resume)
    save_trained(trainer, tokenizer, out_dir, settings.lora, settings.merge)
    drawn = quarter_means([y for _, y in read_points(out_dir / ROLLOUTS_FILE, "batch", "drawn_reward")])
    return {
        "steps": int(result.global_step),
        "train_loss": float(result.training_loss),
        "episodes": rollouts.episodes,
        # the reward of the tasks the steps drew (before dynamic sampling), first and last quarter of the batches
        "drawn_reward_quarters": [round(v, 4) for v in drawn] if drawn else None,
        "wall_s": round(time.perf_counter() - start, 3),
    }
