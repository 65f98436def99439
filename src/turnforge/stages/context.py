"""What a stage knows about its run: the recipe, the run directory, and the models earlier stages made."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from turnforge.envs.base import get_env_spec, plays_tool_call, with_family_format
from turnforge.formats.families import Family, model_family
from turnforge.launch import main_process_result
from turnforge.rundir import MODELS_DIR, STAGES_DIR
from turnforge.scale import ScaleConfig
from turnforge.tiny_model import resolve_model

if TYPE_CHECKING:
    from turnforge.stages.config import StageConfig


class BaseModelTable(Protocol):
    """`[model]` as a stage reads it (`turnforge.recipes.schema.ModelConfig`)."""

    name: str
    family: str | None
    dtype: str
    device: str
    lora: dict[str, Any] | None


class EnvTable(Protocol):
    """`[env]` as a stage reads it (`turnforge.recipes.schema.EnvConfig`)."""

    name: str


class StagePlan(Protocol):
    """What a stage reads of its recipe: `turnforge.recipes.Recipe` is one. The recipe loader builds the stage
    kinds' configs (recipes -> stages), so the stages know their recipe by this protocol, never by importing it."""

    model: BaseModelTable
    env: EnvTable
    stages: list[StageConfig]
    source: Path | None
    scale: ScaleConfig

    def env_options(self) -> dict[str, Any]: ...

    def stage_env(self, stage: StageConfig) -> tuple[str, dict[str, Any]]: ...

    def envs(self) -> list[tuple[str, dict[str, Any]]]: ...

    def model_source(self, index: int) -> str | None: ...

    def data_sources(self, index: int) -> list[str]: ...

    def stage(self, ref: str) -> StageConfig | None: ...

BASE_ROLE = "base"
"""A model role's env option set to this (`user = "base"`) plays the role with the recipe's base model, frozen:
the tau2 seed trains against a user simulator that is a copy of its base model (a local Qwen3-4B-Instruct)."""

@dataclass
class ModelRef:
    """A model a stage can load: a path or hub id, plus a LoRA adapter folder when it was saved unmerged."""

    path: str
    adapter: str | None = None


@dataclass
class RunContext:
    """Shared by the stages of one `run_recipe` call. `models` maps an sft stage id to the model it made."""

    recipe: StagePlan
    out_dir: Path
    models: dict[str, ModelRef] = field(default_factory=dict)
    base_build_s: float | None = None
    _base: ModelRef | None = None
    _family: tuple[Family | None] | None = None

    def model(self, stage_id: str | None) -> ModelRef:
        """The model made by stage `stage_id`, or the base model ([model]) for None."""
        if stage_id is None:
            return self.base_model()
        return self.models[stage_id]

    def base_model(self) -> ModelRef:
        """[model] name, resolved once: "tiny" is built into OUT/models/tiny (no download) for the recipe's envs,
        others pass through, or, where [model] family names another family than its template's, through a folder
        whose template names it (`resolve_model`)."""
        if self._base is None:
            started = time.perf_counter()
            model = self.recipe.model
            self._base = ModelRef(resolve_model(model.name, self.out_dir / MODELS_DIR, self.recipe.envs(), model.family))
            self.base_build_s = time.perf_counter() - started
        return self._base

    def share_base_model(self) -> None:
        """Under `accelerate launch`: the main process resolves the base model (building "tiny" is a write) and
        every process takes its answer, so that none resolves it alone later, in a stage only the main one runs."""
        self._base, self.base_build_s = main_process_result(lambda: (self.base_model(), self.base_build_s))

    def stage_env(self, stage: StageConfig) -> tuple[str, dict[str, Any]]:
        """(env name, options) `stage` plays (`Recipe.stage_env`), a role named "base" resolved to
        `hf:PATH` of the base model: [model] as it was, never a stage's training of it."""
        name, options = self.recipe.stage_env(stage)
        for key in get_env_spec(name).role_options:
            if options.get(key) == BASE_ROLE:
                options[key] = f"hf:{self.base_model().path}"
        if not plays_tool_call(name, options):  # the base model's family matters to tool formats only
            return name, options
        return name, with_family_format(name, options, self.model_family())

    def model_family(self) -> Family | None:
        """The base model's family (`formats/families.py`), read once; every stage's model is a training of it."""
        if self._family is None:
            self._family = (model_family(self.base_model().path),)
        return self._family[0]

    def relative(self, path: Path) -> str:
        """A path inside the run directory as written in done.json (relative, so a run dir can move)."""
        return str(Path(path).relative_to(self.out_dir))

    def absolute(self, path: str) -> Path:
        return self.out_dir / path

    def stage_dir(self, stage_id: str) -> Path:
        """The folder of the stage with id `stage_id` (stages/NN-<id>)."""
        index = next(i for i, s in enumerate(self.recipe.stages) if s.id == stage_id)
        return self.out_dir / stage_folder(index, stage_id)

    def registered(self, stage_id: str, result: dict[str, Any]) -> None:
        """Remember the model a finished (or skipped) stage made, from its done.json result."""
        if "model" in result:
            model = str(self.absolute(result["model"]))
            if result.get("adapter"):
                index = next(i for i, s in enumerate(self.recipe.stages) if s.id == stage_id)
                self.models[stage_id] = ModelRef(self.model(self.recipe.model_source(index)).path, model)
            else:
                self.models[stage_id] = ModelRef(model)


def stage_folder(index: int, stage_id: str) -> str:
    """The folder of stage `index`: "stages/01-collect" for the first (numbered from 01, in recipe order)."""
    return f"{STAGES_DIR}/{index + 1:02d}-{stage_id}"
