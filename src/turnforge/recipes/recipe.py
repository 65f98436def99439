"""A validated recipe (`Recipe`): its model, env and typed stages, and which earlier stages each stage reads.

Made by `turnforge.recipes.loading.load_recipe`; the pipeline runs it and its stages read it (`RunContext.recipe`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnforge.recipes.schema import EnvConfig, ModelConfig
from turnforge.recipes.toml_text import dump_toml
from turnforge.scale import ScaleConfig
from turnforge.stages.config import StageConfig, TrainStage, find_stage


@dataclass
class Recipe:
    """A validated recipe. `model_source(i)` / `data_sources(i)` say which earlier stages stage i reads."""

    name: str
    description: str
    model: ModelConfig
    env: EnvConfig
    stages: list[StageConfig]
    source: Path | None = None
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """`[scale]`: collection, evaluation and RFT sampling on Ray workers (unset: in this process)."""

    def env_options(self) -> dict[str, Any]:
        """The env's options with `format` folded in, as `make_env` takes them."""
        return {**self.env.options, **({"format": self.env.format} if self.env.format else {})}

    def stage_env(self, stage: StageConfig) -> tuple[str, dict[str, Any]]:
        """(env name, options) a stage plays: the recipe's [env] with the stage's `env` table on top; a `name`
        there picks another env, whose options are then the stage's alone (e.g. Iron Guard's SQL collect)."""
        over = dict(getattr(stage, "env", None) or {})
        name = over.pop("name", self.env.name)
        if name != self.env.name:
            return name, over
        return name, {**self.env_options(), **over}

    def envs(self) -> list[tuple[str, dict[str, Any]]]:
        """(env name, options) of [env] and of every stage that plays its own: what a tiny model is built for."""
        return [(self.env.name, self.env_options()), *(self.stage_env(stage) for stage in self.stages)]

    def model_source(self, index: int) -> str | None:
        """Id of the stage whose model stage `index` uses, or None for the base model ([model])."""
        stage = self.stages[index]
        ref = getattr(stage, "model", "base")
        if ref == "base":
            return None
        earlier = [s for s in self.stages[:index] if isinstance(s, TrainStage)]
        if ref == "latest":
            return earlier[-1].id if earlier else None
        return find_stage(ref, earlier).id

    def data_sources(self, index: int) -> list[str]:
        """Stage `index`'s data: ids of earlier collect stages, or external specs (hf:..., files) as written."""
        stage = self.stages[index]
        earlier = [s for s in self.stages[:index] if s.kind == "collect"]
        return [find_stage(d, earlier).id if find_stage(d, earlier) else d for d in getattr(stage, "data", [])]

    def stage(self, ref: str) -> StageConfig | None:
        """The stage with id `ref`, else the one named `ref` (if unique), else position `ref` (from 0)."""
        found = find_stage(ref, self.stages)
        if found is None and ref.isdigit() and int(ref) < len(self.stages):
            return self.stages[int(ref)]
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "model": self.model.model_dump(mode="json"),
            "env": self.env.model_dump(mode="json"),
            "scale": self.scale.model_dump(mode="json"),
            "stages": [s.model_dump(mode="json") for s in self.stages],
        }

    def to_toml(self) -> str:
        """The resolved recipe (every field written out), readable by `load_recipe` again."""
        return dump_toml(self.to_dict())
