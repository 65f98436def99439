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
  - Generation is turnforge's (transformers' continuous-batching engine through `HFPolicy.from_model`, or
    with `use_vllm` the vLLM engine TRL built and keeps in sync, through `VLLMPolicy` / `TRLServerPolicy`),
    not TRL's single-turn generate: an episode is many assistant turns with env observations between them.
    The token sequence is never re-tokenized, so the ids TRL scores are exactly the ids the model sampled.
  - The observation after the LAST turn is not part of the completion: the model never saw it, and TRL
    reads "last token is not EOS" as truncated (`mask_truncated_completions`).
  - Dynamic sampling (DAPO): with `dynamic_sampling = true`, a group whose rewards are all equal (no
    learning signal; TRL logs their share as `frac_reward_zero_std`) is replaced by the group of another
    training task, for up to `resample_rounds` tries; what is left is counted in rollouts.jsonl.
  - Episodes with a history window have no single token sequence, so GRPO refuses them.
  - Scoring (`EpisodeGRPOTrainer`): each episode's log-probabilities are computed on its own tokens, a few
    rows of similar length at a time, instead of on TRL's batch padded to its longest episode (mostly padding
    in a multi-turn batch); the same values up to rounding.
  - Asynchronous GRPO (`max_staleness` = k > 0, `train/grpo_async.py`): a background worker plays groups on a copy
    of the weights beside training, each step trains the oldest finished groups (none more than k steps stale), and
    the loss weighs each token by its truncated importance ratio against the recorded log-probs (`off_policy.py`).
  - Step-level credit (GiGPO, `step_advantage_weight` > 0): `StepCreditGRPOTrainer` adds to TRL's episode
    advantages a per-turn term, each turn's discounted return against the turns of its group that saw the
    same observation (`turnforge.train.step_credit`).

Where the parts live: this file reads top to bottom (config, tasks, rewards, `run_grpo`); the rollout function
and the `Group` type in `train/grpo_rollouts.py`; the trainers in `train/grpo_trainer.py`; every hook into TRL's
private internals in `train/trl_internals.py`.

    turnforge run quickstart --out runs/qs          # its stage `grpo`
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import torch
from trl import GRPOConfig

from turnforge.envs.base import get_env_spec, make_env
from turnforge.eval.curves import quarter_means, read_points
from turnforge.models import load_model
from turnforge.rewards import COMPONENTS
from turnforge.tiny_model import resolve_model
from turnforge.train.grpo_async import AsyncEpisodeRollouts
from turnforge.train.grpo_rollouts import EpisodeRollouts
from turnforge.train.grpo_trainer import EpisodeGRPOTrainer, StepCreditGRPOTrainer
from turnforge.train.runtime import (
    METRICS_FILE,
    MODEL_DIR,
    MetricsFileCallback,
    resume_point,
    save_trained,
    train_loss,
    training_dtype,
    trl_config,
)
from turnforge.train.settings import ROLLOUTS_FILE, GRPOSettings
from turnforge.train.trl_internals import reload_colocated_weights_on_cpu
from turnforge.types import Task

logger = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "MODEL_DIR", "ROLLOUTS_FILE", "EpisodeRollouts", "GRPOSettings", "grpo_config", "run_grpo"]


# ---------------------------------------------------------------------------------------------------------------
# 1. Config


def grpo_config(out_dir: Path, settings: GRPOSettings) -> GRPOConfig:
    """TRL's config: the knobs pass through unchanged; batch = tasks_per_step x num_generations episodes."""
    return trl_config(GRPOConfig, out_dir, settings)


# ---------------------------------------------------------------------------------------------------------------
# 2. Tasks


def task_prompt(task: Task, messages: list) -> list[dict[str, str]]:
    """The dataset prompt of a task: its first messages, each tagged with the task id (TRL passes prompts only)."""
    return [{"role": m.role, "content": m.content, "task_id": task.id} for m in messages]


def task_dataset(env_name: str, env_options: dict[str, Any], tasks: list[Task]) -> datasets.Dataset:
    # The prompts only carry the task ids to the rollout function: made without the env's model roles (a model
    # user's opening needs the `user` role, which only the rollouts have; the episodes play with it).
    roles = get_env_spec(env_name).role_options
    env = make_env(env_name, **{k: v for k, v in env_options.items() if k not in roles})
    try:
        return datasets.Dataset.from_list([{"prompt": task_prompt(t, env.reset(t))} for t in tasks])
    finally:
        env.close()  # it may hold a sandbox or an OpenEnv session


# ---------------------------------------------------------------------------------------------------------------
# 3. The rollout function (`grpo_rollouts.EpisodeRollouts`) and the rewards it hands TRL


def component_reward(name: str):
    """TRL reward function `name` reading back the component the rollout function computed per episode."""

    def reward(prompts=None, completions=None, **kwargs) -> list[float]:
        return [float(v) for v in kwargs[f"reward_{name}"]]

    reward.__name__ = name
    return reward


# ---------------------------------------------------------------------------------------------------------------
# 4. The trainer (`grpo_trainer`) and the run


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
    trainer_class = StepCreditGRPOTrainer if settings.step_advantage_weight else EpisodeGRPOTrainer
    # max_staleness 0: today's synchronous rollouts, unchanged; k > 0: the background worker (`grpo_async`)
    rollouts_class = AsyncEpisodeRollouts if settings.max_staleness else EpisodeRollouts
    result, rollouts = train_on_episodes(
        "grpo", model, env_name, env_options, tasks, out_dir, settings, adapter, trainer_class,
        lambda tokenizer: rollouts_class(env_name, env_options, tasks, tokenizer, settings, out_dir / ROLLOUTS_FILE),
    )
    drawn = quarter_means([y for _, y in read_points(out_dir / ROLLOUTS_FILE, "batch", "drawn_reward")])
    return {
        "steps": int(result.global_step),
        "train_loss": train_loss(result),
        "episodes": rollouts.episodes,
        # the reward of the tasks the steps drew (before dynamic sampling), first and last quarter of the batches
        "drawn_reward_quarters": [round(v, 4) for v in drawn] if drawn else None,
        "wall_s": round(time.perf_counter() - start, 3),
    }


def train_on_episodes(
    kind: str,
    model: str,
    env_name: str,
    env_options: dict[str, Any],
    tasks: list[Task],
    out_dir: Path,
    settings: GRPOSettings,
    adapter: str | None,
    trainer_class: type[EpisodeGRPOTrainer],
    make_rollouts: Callable[[Any], EpisodeRollouts],
) -> tuple[Any, EpisodeRollouts]:
    """What grpo and distill share: the start model, TRL's trainer with turnforge's episodes as its `rollout_func`
    (`make_rollouts(tokenizer)`), training resumed from the last checkpoint, the model saved. Returns TRL's
    train output and the rollouts."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not tasks:
        raise ValueError(f"{kind}: no training tasks (check the stage's split, tasks and filters)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL
    if settings.use_vllm and settings.trl.get("vllm_mode") == "server" and not torch.cuda.is_available():
        # TRL's VLLMClient.init_communicator refuses a CPU device (NotImplementedError) when the trainer is built.
        raise ValueError(f'{kind}: use_vllm with vllm_mode = "server" needs a CUDA device: TRL syncs the trained '
                         "weights into the vLLM server over NCCL. On a CPU use vllm_mode = \"colocate\"")
    path = resolve_model(model, out_dir / "cache", [(env_name, env_options)])
    lm, tokenizer = load_model(path, dtype=training_dtype(settings.lora), device="cpu", adapter=adapter)
    if adapter is not None:
        lm = lm.merge_and_unload()  # a start model saved as an adapter: its weights become the policy's own
    rollouts = make_rollouts(tokenizer)
    resume = resume_point(out_dir, also_reset=(ROLLOUTS_FILE,))
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
    reload_colocated_weights_on_cpu(trainer)  # use_vllm in colocate mode on vLLM's CPU build (trl_internals)
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    finally:
        close = getattr(rollouts, "close", None)  # async GRPO's worker: its groups still playing are dropped
        if close is not None:
            close()
    save_trained(trainer, tokenizer, out_dir, settings.lora, settings.merge)
    return result, rollouts
