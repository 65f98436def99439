"""Stage `grpo`: multi-turn GRPO (`turnforge.train.grpo`) on the recipe's env, once, on its task filter.

    stages/NN-grpo/     model/, metrics.jsonl (TRL's logs), rollouts.jsonl (per generation batch)

    turnforge run quickstart --out runs/qs      # its stage `grpo`

    [[stages]]
    kind = "grpo"
    steps = 40
    [stages.rewards]
    progress = 0.5

The config is a `turnforge.train.settings.GRPOSettings` (it derives from it) with a task filter (`TaskFilter`,
shared with `envtune`), and is what the trainer gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from turnforge.envs.base import load_tasks
from turnforge.stages.config import STAGE_NAME, PlaysEnv, TrainStage
from turnforge.stages.context import RunContext
from turnforge.stages.registry import register_stage
from turnforge.train.settings import METRICS_FILE, MODEL_DIR, ROLLOUTS_FILE, GRPOSettings
from turnforge.types import Task


class TaskFilter(PlaysEnv):
    """Which tasks of the split a stage trains on."""

    split: str = "train"
    tasks: int | None = Field(default=None, ge=1)
    """The first N tasks of the split (after the category filter); unset = all."""
    categories: list[str] = Field(default_factory=list)
    """Only tasks of these categories (e.g. household task types, BFCL categories); empty = all."""
    difficulty: tuple[float, float] | None = None
    """Only tasks whose `data["difficulty"]` is within [low, high] (envs that set it: BFCL turn count)."""
    env: dict[str, Any] = Field(default_factory=dict)
    """Env options that override the recipe's [env.options] for this stage's rollouts (e.g. hints = true)."""


class GRPOStageBase(TrainStage, TaskFilter, GRPOSettings):
    """What grpo and envtune share: a task filter and `turnforge.train.settings.GRPOSettings`'s fields."""

    HASHED_WHEN_SET: ClassVar[frozenset[str]] = frozenset({"stop", "max_staleness"})  # added after runs were made


class GRPOStageConfig(GRPOStageBase):
    """`kind = "grpo"`: multi-turn GRPO on TRL (`turnforge.train.grpo`)."""

    kind: Literal["grpo"] = "grpo"
    name: str = Field(default="grpo", pattern=STAGE_NAME)


def select_tasks(
    env: str,
    options: dict[str, Any],
    split: str,
    limit: int | None,
    categories: list[str] | None,
    difficulty: tuple[float, float] | None,
) -> list[Task]:
    """The first `limit` tasks of `split` that are in `categories` (all when empty) and within `difficulty`."""
    tasks = load_tasks(env, split, **options)
    if categories:
        known = {t.category for t in tasks}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise ValueError(f"categories {unknown} do not occur in {env} {split}; categories: {sorted(known)}")
        tasks = [t for t in tasks if t.category in categories]
    if difficulty is not None:
        low, high = difficulty
        tasks = [t for t in tasks if low <= float(t.data.get("difficulty", 0.0)) <= high]
    return tasks[:limit] if limit is not None else tasks


def run_grpo_stage(stage: GRPOStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.grpo import (
        run_grpo,  # torch and TRL (seconds to import) load when a training stage runs
    )

    start = ctx.model(ctx.recipe.model_source(index))
    env, options = ctx.stage_env(stage)
    tasks = select_tasks(env, options, stage.split, stage.tasks, stage.categories, stage.difficulty)
    result = run_grpo(start.path, env, options, tasks, stage_dir, stage, start.adapter)
    return {**result, **rl_outputs(stage_dir, ctx), "tasks": len(tasks)}


def rl_outputs(stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    """The done.json entries of a GRPO stage's outputs: its model, and its metrics and rollouts logs."""
    model_dir = stage_dir / MODEL_DIR
    out = {"model": ctx.relative(model_dir), "adapter": (model_dir / "adapter_config.json").exists()}
    for key, name in (("metrics", METRICS_FILE), ("rollouts", ROLLOUTS_FILE)):
        if (stage_dir / name).exists():
            out[key] = ctx.relative(stage_dir / name)
    return out


register_stage(GRPOStageConfig, run_grpo_stage)
