"""Stage `envtune`: Environment Tuning (arXiv 2510.10197) — GRPO through `phases` in order
(`turnforge.train.curriculum`), each with its own task filter, env options (hints on/off), reward weights and
length, every phase starting from the model the previous one wrote; the last phase runs without hints.

    stages/NN-envtune/PP-<phase>/   model/, metrics.jsonl, rollouts.jsonl per phase
    stages/NN-envtune/model         the last phase's model; metrics.jsonl: every phase's, steps numbered on

A killed envtune stage resumes at the first phase without its `model/` folder.

    [[stages]]
    kind = "envtune"
    [[stages.phases]]
    name = "hints"
    steps = 20
    env = { hints = true }
    [[stages.phases]]
    name = "plain"
    steps = 20
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from turnforge.envs.base import get_env_spec
from turnforge.stages.config import STAGE_NAME, Table
from turnforge.stages.context import RunContext
from turnforge.stages.grpo import GRPOStageBase, rl_outputs, select_tasks
from turnforge.stages.registry import register_stage
from turnforge.train.settings import GRPOSettings


class EnvTunePhase(Table):
    """One phase of an Environment Tuning curriculum: its tasks, env options, reward weights and length."""

    name: str = Field(pattern=STAGE_NAME)
    steps: int = Field(ge=1)
    categories: list[str] | None = None
    """None = the stage's categories."""
    difficulty: tuple[float, float] | None = None
    tasks: int | None = Field(default=None, ge=1)
    env: dict[str, Any] = Field(default_factory=dict)
    """Env options for this phase on top of the stage's (e.g. hints = true)."""
    rewards: dict[str, Any] = Field(default_factory=dict)
    """Reward weights for this phase on top of the stage's (e.g. progress = 0.5)."""
    learning_rate: float | None = None


class EnvTuneStageConfig(GRPOStageBase):
    """`kind = "envtune"`: Environment Tuning (arXiv 2510.10197): GRPO through `phases` in order, each with
    its task filter, env options (hints), reward weights and length; the last phase runs without hints."""

    kind: Literal["envtune"] = "envtune"
    name: str = Field(default="envtune", pattern=STAGE_NAME)
    phases: list[EnvTunePhase] = Field(min_length=1)

    @field_validator("phases")
    @classmethod
    def _last_phase_without_hints(cls, phases: list[EnvTunePhase]) -> list[EnvTunePhase]:
        if phases[-1].env.get("hints") in (True, "true", 1, "1"):
            raise ValueError(f"the last phase ({phases[-1].name}) must run without hints: set hints = false")
        names = [p.name for p in phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        return phases


def run_envtune_stage(stage: EnvTuneStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.curriculum import run_curriculum  # torch and TRL (seconds to import): when it runs

    start = ctx.model(ctx.recipe.model_source(index))
    env, stage_options = ctx.stage_env(stage)
    phases = [curriculum_phase(stage, phase, env, stage_options, last=k == len(stage.phases) - 1)
              for k, phase in enumerate(stage.phases)]
    results = run_curriculum(start.path, start.adapter, env, phases, stage_dir)
    return {"phases": results, **rl_outputs(stage_dir, ctx)}


def curriculum_phase(stage: EnvTuneStageConfig, phase: EnvTunePhase, env: str, stage_options: dict[str, Any], last: bool):
    """A `turnforge.train.curriculum.Phase`: the stage's settings, filter and env options with the phase's on top."""
    from turnforge.train.curriculum import Phase  # with the training stack, as in run_envtune_stage

    options = {**stage_options, **phase.env}
    if last and "hints" in {opt.name for opt in get_env_spec(env).options}:
        options["hints"] = False  # Environment Tuning: the last phase learns to do without them
    categories = phase.categories if phase.categories is not None else stage.categories
    tasks = select_tasks(
        env, options, stage.split, phase.tasks or stage.tasks, categories, phase.difficulty or stage.difficulty
    )
    overrides: dict[str, Any] = {"steps": phase.steps, "merge": True,
                                 "rewards": dataclasses.asdict(stage.rewards) | phase.rewards}
    if phase.learning_rate is not None:
        overrides["learning_rate"] = phase.learning_rate
    return Phase(phase.name, tasks, options, phase_settings(stage, overrides))


def phase_settings(stage: EnvTuneStageConfig, overrides: dict[str, Any]) -> GRPOSettings:
    """The stage's GRPO settings with a phase's `overrides`, checked as the stage's are."""
    fields = set(GRPOSettings.model_fields)
    return GRPOSettings.model_validate({name: getattr(stage, name) for name in fields} | overrides)


register_stage(EnvTuneStageConfig, run_envtune_stage)
