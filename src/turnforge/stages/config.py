"""What every stage's typed config is made of: recipe tables and the bases a stage kind's config derives from.

A stage's settings are declared once, where they are used: a rollout stage derives from the sampling group
(`turnforge.types.SamplingParams`), a training stage from its trainer's settings (`turnforge.train.settings`,
e.g. `class SFTStageConfig(TrainStage, SFTSettings)`), and the stage object itself is what the policy or the
trainer is given. Every table forbids unknown keys (pydantic `extra="forbid"`), so a typo is an error, not a
silent default.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from turnforge.types import SamplingParams

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
    HASHED_WHEN_SET: ClassVar[frozenset[str]] = frozenset()
    """Fields this kind gained after runs of it were made: at their default they stay out of the stage's hash, so
    that a run finished before they existed keeps its finished stages (set, they change the hash as any field)."""

    def hash_inputs(self) -> dict[str, Any]:
        """The config as the stage's input hash sees it (`pipeline.stage_inputs`)."""
        dump = self.model_dump(mode="json", exclude=set(self.NOT_IN_HASH))
        for name in self.HASHED_WHEN_SET:
            if getattr(self, name) == type(self).model_fields[name].get_default(call_default_factory=True):
                dump.pop(name, None)
        return dump

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


class RolloutStage(StageConfig, PlaysEnv, SamplingParams):
    """Episodes of a policy on a split (collect, eval and rft's sampling share these fields); the sampling group
    (temperature, top_p, top_k, max_new_tokens, stop, seed, explore) is `SamplingParams`'s, and `sampling()` is
    what the policy gets."""

    policy: Literal["expert", "random", "hf"]
    """expert / random: scripted, no model; hf: the model named by `model`, with transformers."""
    model: str = "latest"
    """For policy hf: "base" ([model]), "latest" (the last training stage before this one, else base) or a stage."""
    split: str
    tasks: int | None = Field(default=None, ge=1)
    """The first N tasks of the split (stable order); unset = the whole split."""
    samples: int = Field(default=1, ge=1)
    """Episodes per task (pass@k / pass^k use them)."""
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
    HASHED_WHEN_SET: ClassVar[frozenset[str]] = frozenset({"explore"})


class TrainStage(StageConfig):
    """A stage that trains a model (sft, rft, dpo, grpo, envtune); its model lands in stages/NN-<id>/model.

    Later stages name it in their `model` field ("latest" = the last training stage before them).
    """

    model: str = "latest"
    """The model to train: "base", "latest" (the last training stage before this one, else base) or a stage."""


def find_stage(ref: str, stages: list[StageConfig]) -> StageConfig | None:
    """The stage `ref` names among `stages`: by id, else by name when one stage has it; None otherwise."""
    by_id = [s for s in stages if s.id == ref]
    by_name = [s for s in stages if s.name == ref]
    if by_id:
        return by_id[0]
    return by_name[0] if len(by_name) == 1 else None
