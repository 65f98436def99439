"""The typed recipe tables (design.md §7): `[model]`, `[env]` and one class per `[[stages]]` kind.

Every table forbids unknown keys (pydantic `extra="forbid"`), so a typo is an error, not a silent default.
The SFT stage's training fields are not written here: they are the fields of `turnforge.train.sft.SFTSettings`
(one source of truth), turned into a pydantic model on first use so that recipes without an `sft` stage
parse without importing the training stack.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from turnforge.policies.base import SamplingParams

STAGE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # it names folders (stages/NN-<id>, eval/<name>)


class Table(BaseModel):
    """A recipe table: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Table):
    """`[model]`: the initial model of the run (the "base" that stages start from)."""

    name: str = "tiny"
    """"tiny" (the offline tiny model, built into OUT/models/tiny), a local path, or a Hugging Face hub id."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for generation (hf rollouts)."""
    device: str = "auto"
    """"auto" (CUDA when present), "cpu", "cuda", "cuda:1", ... for generation (hf rollouts)."""
    lora: dict[str, Any] | None = None
    """Default LoRA (the fields of `turnforge.models.LoraSpec`) for training stages that set none."""


class EnvConfig(Table):
    """`[env]`: the environment every rollout stage plays (see `turnforge envs`)."""

    name: str = "household"
    format: str | None = None
    """How the agent writes actions (act_line | react | tool_call ...); the same as `options.format`."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The env's options (`turnforge envs` lists them), e.g. `grammar = "0.3"`, `hints = true`."""


class StageConfig(Table):
    """Fields every `[[stages]]` entry has. `id` (kind, or kind-name) names its folder and its `--set` path."""

    kind: str
    name: str = Field(pattern=STAGE_NAME)
    NOT_IN_HASH: ClassVar[frozenset[str]] = frozenset()
    """Fields that do not change a stage's results (changing them on a finished stage is allowed)."""

    @property
    def id(self) -> str:
        """Unique within a recipe: "sft" for an sft stage named sft, "eval-base" for an eval stage named base."""
        return self.kind if self.name == self.kind else f"{self.kind}-{self.name}"


class PlaysEnv(Table):
    """A stage that plays an env on a `split`, with `env` options on top of the recipe's [env].

    Being one is a base class, not a flag, so that no other base can shadow it: the env's name and options
    are among the inputs of every such stage (its hash), and its split and options are checked at load.
    """

    split: str
    env: dict[str, Any] = Field(default_factory=dict)


class RolloutStage(StageConfig, PlaysEnv):
    """Episodes of a policy on a split (collect and eval share these fields)."""

    policy: Literal["expert", "random", "hf"]
    """expert / random: scripted, no model; hf: the model named by `model`, with transformers."""
    model: str = "latest"
    """For policy hf: "base" ([model]), "latest" (the last sft stage before this one, else base) or a stage."""
    split: str
    tasks: int | None = Field(default=None, ge=1)
    """The first N tasks of the split (stable order); unset = the whole split."""
    samples: int = Field(default=1, ge=1)
    """Episodes per task (pass@k / pass^k use them)."""
    seed: int = 0
    temperature: float = Field(ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(default=256, ge=1)
    """Tokens per assistant turn."""
    max_turns: int | None = Field(default=None, ge=1)
    """Assistant turns per episode; unset = the env's own limit."""
    window: int | None = Field(default=None, ge=1)
    """Prompt history window (assistant turns kept) for policy hf; unset = the window the model was trained
    with (for "base": the recipe's first sft stage's), or the whole history when there is none."""
    batch_size: int = Field(default=64, ge=1)
    """Episodes open at once (the generate batch)."""
    env: dict[str, Any] = Field(default_factory=dict)
    """Env options on top of the recipe's [env.options] for this stage; with `name`, another env altogether
    (its options are then this table's alone), e.g. `env = { name = "sql", generate = 200 }`."""
    NOT_IN_HASH: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens, seed=self.seed
        )


class CollectStage(RolloutStage):
    """`kind = "collect"`: rollouts whose episodes become training data (stages/NN-<id>/trajectories.jsonl)."""

    kind: Literal["collect"] = "collect"
    name: str = Field(default="collect", pattern=STAGE_NAME)
    policy: Literal["expert", "random", "hf"] = "expert"
    split: str = "train"
    temperature: float = Field(default=1.0, ge=0.0)


class EvalStage(RolloutStage):
    """`kind = "eval"`: an evaluation, written to eval/<name>/{episodes.jsonl,summary.json}."""

    kind: Literal["eval"] = "eval"
    name: str = Field(default="eval", pattern=STAGE_NAME)
    policy: Literal["expert", "random", "hf"] = "hf"
    split: str = "test"
    temperature: float = Field(default=0.0, ge=0.0)


class TrainStage(StageConfig):
    """A stage that trains a model (sft, rft, dpo, grpo, envtune); its model lands in stages/NN-<id>/model.

    Later stages name it in their `model` field ("latest" = the last training stage before them).
    """

    model: str = "latest"
    """The model to train: "base", "latest" (the last training stage before this one, else base) or a stage."""


class SFTStageConfig(TrainStage):
    """`kind = "sft"`: supervised fine-tuning on earlier collect stages; the model lands in stages/NN-<id>/model.

    The other fields are those of `turnforge.train.sft.SFTSettings` (see `sft_stage_class`).
    """

    kind: Literal["sft"] = "sft"
    name: str = Field(default="sft", pattern=STAGE_NAME)
    data: list[str] = Field(min_length=1)
    """Earlier collect stages (by id or name), `hf:NAME[:SPLIT]` datasets, or JSONL files."""

    def settings(self) -> Any:
        """The `SFTSettings` this stage trains with."""
        from turnforge.train.sft import SFTSettings

        return SFTSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SFTSettings)})

    @model_validator(mode="after")
    def _settings_are_valid(self) -> SFTStageConfig:
        self.settings()  # SFTSettings checks its own ranges (max_steps, warmup_ratio, ...): a ValueError here
        return self


class DPOStageConfig(TrainStage):
    """`kind = "dpo"`: round-wise DPO on pairs mined from earlier collect stages and/or pair datasets.

    The training fields are those of `turnforge.train.dpo.DPOSettings` (see `dpo_stage_class`).
    """

    kind: Literal["dpo"] = "dpo"
    name: str = Field(default="dpo", pattern=STAGE_NAME)
    data: list[str] = Field(min_length=1)
    """Earlier collect stages (their trajectories are mined), or pair datasets: `hf:NAME[:SPLIT]`, JSONL/parquet files
    in the seed schema (messages, chosen, rejected, reason) or TRL's (prompt, chosen, rejected)."""
    reasons: list[str] | None = None
    """Keep mined pairs of these reasons only (format, task_succeeded_negative, loop, implausible_location,
    invalid_action, verbose, or an env's own); unset = all."""
    verbose_chars: int = Field(default=160, ge=0)
    """A valid reply is `verbose` when longer than its concise rendering by more than this many characters."""

    def settings(self) -> Any:
        """The `DPOSettings` this stage trains with."""
        from turnforge.train.dpo import DPOSettings

        return DPOSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(DPOSettings)})

    @model_validator(mode="after")
    def _settings_are_valid(self) -> DPOStageConfig:
        self.settings()
        return self


def with_settings_fields(name: str, base: type[BaseModel], settings_cls: type) -> type[Any]:
    """`base` + every field of the dataclass `settings_cls`, with its type and default (one source of truth)."""
    from turnforge.models import LoraSpec
    from turnforge.rewards import RewardWeights

    hints = typing.get_type_hints(settings_cls, localns={"LoraSpec": LoraSpec, "RewardWeights": RewardWeights})
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(settings_cls):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        else:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
    return create_model(name, __base__=base, __doc__=base.__doc__, **fields)


@functools.cache
def sft_stage_class() -> type[SFTStageConfig]:
    """SFTStageConfig + every field of `SFTSettings` (imports the training code)."""
    from turnforge.train.sft import SFTSettings

    return with_settings_fields("SFTStage", SFTStageConfig, SFTSettings)


@functools.cache
def dpo_stage_class() -> type[DPOStageConfig]:
    """DPOStageConfig + every field of `DPOSettings` (imports the training code)."""
    from turnforge.train.dpo import DPOSettings

    return with_settings_fields("DPOStage", DPOStageConfig, DPOSettings)


def lora_spec_class() -> type:
    from turnforge.models import LoraSpec

    return LoraSpec


# Each kind's config class, built on first use (training kinds import their settings dataclass).
_STAGE_CLASSES: dict[str, typing.Callable[[], type[StageConfig]]] = {
    "collect": lambda: CollectStage,
    "sft": sft_stage_class,
    "dpo": dpo_stage_class,
    "eval": lambda: EvalStage,
    "rft": lambda: _training().RFTStageConfig,
    "grpo": lambda: _training().grpo_stage_class("grpo"),
    "envtune": lambda: _training().grpo_stage_class("envtune"),
}


def _training() -> Any:
    from turnforge.recipes import training  # imports this module: loaded on first use

    return training


def stage_class(kind: str) -> type[StageConfig] | None:
    """The config class of a stage kind, or None for an unknown kind."""
    factory = _STAGE_CLASSES.get(kind)
    return factory() if factory is not None else None


STAGE_KINDS = tuple(_STAGE_CLASSES)
