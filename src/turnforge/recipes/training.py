"""Typed tables of the reinforcement stages: `rft`, `grpo` and `envtune` (design.md §6–7).

Their training fields are not written here: they come from the settings dataclasses of the training code
(`SFTSettings` for rft's `train` table, `GRPOSettings` for grpo and envtune), turned into pydantic fields on
first use, so the recipe and the trainer cannot disagree on a name, a type or a default.

    [[stages]]                      [[stages]]                        [[stages]]
    kind = "rft"                    kind = "grpo"                     kind = "envtune"
    samples = 4                     steps = 40                        [[stages.phases]]
    [stages.train]                  [stages.rewards]                  name = "hints"
    max_steps = 100                 progress = 0.5                    env = { hints = true }
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from turnforge.recipes.schema import STAGE_NAME, PlaysEnv, RolloutStage, Table, TrainStage, with_settings_fields


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


class RFTStageConfig(RolloutStage, TrainStage):
    """`kind = "rft"`: rejection fine-tuning. `samples` episodes per task with the current model, keep the
    successful ones (deduplicated, at most `max_per_task` per task), SFT on them (`train` = SFT settings)."""

    kind: Literal["rft"] = "rft"
    name: str = Field(default="rft", pattern=STAGE_NAME)
    policy: Literal["hf"] = "hf"
    split: str = "train"
    samples: int = Field(default=4, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    keep: Literal["success", "best"] = "success"
    """success: successful episodes only; best: also, for a task with no success, its best episode by progress
    when that progress is at least `min_progress`."""
    min_progress: float = Field(default=0.5, ge=0.0, le=1.0)
    max_per_task: int = Field(default=2, ge=1)
    data: list[str] = Field(default_factory=list)
    """More training data mixed in (earlier collect stages, hf:DATASET, JSONL files), e.g. the SFT data."""
    train: dict[str, Any] = Field(default_factory=dict)
    """The SFT settings of the fine-tuning step (the fields of an sft stage: max_steps, learning_rate, ...)."""

    def settings(self) -> Any:
        from turnforge.train.sft import SFTSettings

        return SFTSettings(**self.train)

    @model_validator(mode="after")
    def _train_is_valid(self) -> RFTStageConfig:
        sft_settings_model().model_validate(self.train)  # unknown keys and bad values name the field
        return self


@functools.cache
def sft_settings_model() -> type[Table]:
    from turnforge.train.sft import SFTSettings

    return with_settings_fields("SFTSettingsTable", Table, SFTSettings)


class GRPOStageBase(TrainStage, TaskFilter):
    """Fields shared by grpo and envtune; the rest are `turnforge.train.grpo.GRPOSettings`'s."""

    def settings(self, **overrides: Any) -> Any:
        from turnforge.train.grpo import GRPOSettings

        names = {f.name for f in dataclasses.fields(GRPOSettings)}
        values = {name: getattr(self, name) for name in names}
        values["rewards"] = dataclasses.asdict(values["rewards"]) | overrides.pop("rewards", {})
        return GRPOSettings(**(values | overrides))

    @model_validator(mode="after")
    def _settings_are_valid(self) -> GRPOStageBase:
        self.settings()
        return self


class GRPOStageConfig(GRPOStageBase):
    """`kind = "grpo"`: multi-turn GRPO on TRL (`turnforge.train.grpo`)."""

    kind: Literal["grpo"] = "grpo"
    name: str = Field(default="grpo", pattern=STAGE_NAME)


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


@functools.cache
def grpo_stage_class(kind: str) -> type[GRPOStageBase]:
    """GRPOStageConfig / EnvTuneStageConfig + every field of `GRPOSettings` (imports the training code)."""
    from turnforge.train.grpo import GRPOSettings

    base = {"grpo": GRPOStageConfig, "envtune": EnvTuneStageConfig}[kind]
    return with_settings_fields(base.__name__, base, GRPOSettings)
