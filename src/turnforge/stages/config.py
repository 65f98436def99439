"""What every stage's typed config is made of: recipe tables, the bases a stage kind's config derives from,
and the one way a training stage's fields come from its trainer's settings dataclass.

Every table forbids unknown keys (pydantic `extra="forbid"`), so a typo is an error, not a silent default.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from turnforge.models.loading import LoraSpec
from turnforge.policies.base import SamplingParams
from turnforge.rewards import RewardWeights

STAGE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # it names folders (stages/NN-<id>, eval/<name>)


class Table(BaseModel):
    """A recipe table: unknown keys are errors, values are validated on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


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
    """Episodes of a policy on a split (collect, eval and rft's sampling share these fields)."""

    policy: Literal["expert", "random", "hf"]
    """expert / random: scripted, no model; hf: the model named by `model`, with transformers."""
    model: str = "latest"
    """For policy hf: "base" ([model]), "latest" (the last training stage before this one, else base) or a stage."""
    split: str
    tasks: int | None = Field(default=None, ge=1)
    """The first N tasks of the split (stable order); unset = the whole split."""
    samples: int = Field(default=1, ge=1)
    """Episodes per task (pass@k / pass^k use them)."""
    seed: int = 0
    temperature: float = Field(ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    """Sample from the k most likely tokens only; 0 = off."""
    max_new_tokens: int = Field(default=256, ge=1)
    """Tokens per assistant turn."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a reply (kept in its text), besides the model's end-of-turn token."""
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
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_new_tokens=self.max_new_tokens,
            stop=list(self.stop), seed=self.seed,
        )


class TrainStage(StageConfig):
    """A stage that trains a model (sft, rft, dpo, grpo, envtune); its model lands in stages/NN-<id>/model.

    Later stages name it in their `model` field ("latest" = the last training stage before them).
    """

    model: str = "latest"
    """The model to train: "base", "latest" (the last training stage before this one, else base) or a stage."""


def with_settings_fields(name: str, base: type[BaseModel], settings_cls: type) -> type[Any]:
    """`base` + every field of the dataclass `settings_cls`, with its type and default (one source of truth).

    A `trl` field (TRL options passed through) is checked against the TRL config class's own fields, so an
    unknown key is an error at that key (`stages.sft.trl: unknown field(s) of TRL's SFTConfig ...`)."""
    hints = typing.get_type_hints(settings_cls, localns={"LoraSpec": LoraSpec, "RewardWeights": RewardWeights})
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(settings_cls):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        else:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
    validators = {}
    if "trl" in fields:

        def trl_fields_exist(cls: type, value: dict[str, Any]) -> dict[str, Any]:
            settings_cls(trl=value).check_trl()
            return value

        validators["_trl_fields_exist"] = field_validator("trl")(trl_fields_exist)
    return create_model(name, __base__=base, __doc__=base.__doc__, __validators__=validators, **fields)


def settings_of(config: BaseModel, settings_cls: type, **overrides: Any) -> Any:
    """The `settings_cls` dataclass holding `config`'s values of its fields (and `overrides`)."""
    return settings_cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(settings_cls)} | overrides)
