"""The recipe-wide tables (design.md §7): `[model]` and `[env]`.

Each `[[stages]]` kind's table is its stage file's config class (`turnforge.stages.<kind>`, in the one registry
`turnforge.stages.registry`); the bases they share are in `turnforge.stages.config`. Every table forbids
unknown keys (pydantic `extra="forbid"`), so a typo is an error, not a silent default.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from turnforge.formats.families import get_family
from turnforge.stages.config import Table


class ModelConfig(Table):
    """`[model]`: the initial model of the run (the "base" that stages start from)."""

    name: str = "tiny"
    """"tiny" (the offline tiny model, built into OUT/models/tiny; "tiny:FAMILY" another family's, into
    OUT/models/tiny-FAMILY: docs/families.md), a local path, or a Hugging Face hub id."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype for generation (hf rollouts)."""
    device: str = "auto"
    """"auto" (CUDA when present), "cpu", "cuda", "cuda:1", ... for generation (hf rollouts)."""
    lora: dict[str, Any] | None = None
    """Default LoRA (the fields of `turnforge.models.LoraSpec`) for training stages that set none."""
    family: str | None = None
    """The model's family (`turnforge.formats.families`: its tool-call format, reasoning tags, turn ends); None: read
    from its chat template. Named, it holds where the template reads as no family or another one (a fine-tuned
    model's own template), and gives a model without a chat template the family's: the run's base model is then a
    folder of links to it whose template names the family (OUT/models/NAME-as-FAMILY, `tiny_model.resolve_model`)."""

    @field_validator("family")
    @classmethod
    def _known_family(cls, family: str | None) -> str | None:
        if family is not None:
            get_family(family)  # an unknown name is one line listing the families
        return family


class EnvConfig(Table):
    """`[env]`: the environment every rollout stage plays (see `turnforge envs`)."""

    name: str = "household"
    format: str | None = None
    """How the agent writes actions (act_line | react | tool_call ...); the same as `options.format`."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The env's options (`turnforge envs` lists them), e.g. `grammar = "0.3"`, `hints = true`."""
