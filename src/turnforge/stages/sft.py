"""Stage `sft`: fine-tune the stage's model on earlier collect stages with `turnforge.train.sft.run_sft`.

The data are the collect stages' `trajectories.jsonl` (and any `hf:` dataset or file the recipe names);
the model is "base" ([model]), "latest" (the last training stage before, else base) or a named stage. The
trained model lands in `stages/NN-<id>/model` (merged, or a LoRA adapter with `merge = false`), the loss
curve in `stages/NN-<id>/metrics.jsonl`. A killed SFT stage resumes from its last checkpoint when
`save_steps` > 0, else it trains again from the start.

    turnforge run recipes/quickstart.toml --out runs/qs      # stage 02-sft -> runs/qs/stages/02-sft/model

The config is an `turnforge.train.settings.SFTSettings` (it derives from it), and is what the trainer gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from turnforge.stages.collect import TRAJECTORIES_FILE
from turnforge.stages.config import STAGE_NAME, TrainStage
from turnforge.stages.context import RunContext
from turnforge.stages.registry import register_stage
from turnforge.train.settings import METRICS_FILE, MODEL_DIR, SFTSettings


class SFTStageConfig(TrainStage, SFTSettings):
    """`kind = "sft"`: supervised fine-tuning on earlier collect stages; the model lands in stages/NN-<id>/model.

    The other fields are those of `turnforge.train.settings.SFTSettings`: the stage is the trainer's settings.
    """

    kind: Literal["sft"] = "sft"
    name: str = Field(default="sft", pattern=STAGE_NAME)
    data: list[str] = Field(min_length=1)
    """Earlier collect stages (by id or name), `hf:NAME[:SPLIT]` datasets, or JSONL files."""


def run_sft_stage(stage: SFTStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.sft import (
        run_sft,  # torch and TRL (seconds to import) load when a training stage runs
    )

    start = ctx.model(ctx.recipe.model_source(index))
    if start.adapter is not None:
        raise ValueError(
            f"stage {stage.id}: its model is a LoRA adapter saved unmerged; set merge = true on the stage "
            "that trained it to train on top of it"
        )
    data = [data_path(source, ctx) for source in ctx.recipe.data_sources(index)]
    result = run_sft(start.path, data, stage_dir, stage)
    return {**result, **trained_model(stage_dir, ctx)}


def trained_model(stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    """The done.json entries of a training stage's outputs: its model (adapter or not) and metrics file."""
    model_dir = stage_dir / MODEL_DIR
    return {
        "model": ctx.relative(model_dir),
        "adapter": (model_dir / "adapter_config.json").exists(),
        "metrics": ctx.relative(stage_dir / METRICS_FILE),
    }


def data_path(source: str, ctx: RunContext) -> str:
    """A collect stage id -> its trajectories file; hf:/file specs pass through (files relative to the recipe)."""
    if any(s.id == source and s.kind == "collect" for s in ctx.recipe.stages):
        return str(ctx.stage_dir(source) / TRAJECTORIES_FILE)
    recipe_dir = ctx.recipe.source.parent if ctx.recipe.source else Path(".")
    if not source.startswith("hf:") and not Path(source).exists() and (recipe_dir / source).exists():
        return str(recipe_dir / source)
    return source


register_stage(SFTStageConfig, run_sft_stage)
