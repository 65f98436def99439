"""Stage `sft`: fine-tune the stage's model on earlier collect stages with `turnforge.train.sft.run_sft`.

The data are the collect stages' `trajectories.jsonl` (and any `hf:` dataset or file the recipe names);
the model is "base" ([model]), "latest" (the last sft stage before, else base) or a named sft stage. The
trained model lands in `stages/NN-<id>/model` (merged, or a LoRA adapter with `merge = false`), the loss
curve in `stages/NN-<id>/metrics.jsonl`. A killed SFT stage resumes from its last checkpoint when
`save_steps` > 0, else it trains again from the start.

    turnforge run recipes/quickstart.toml --out runs/qs      # stage 02-sft -> runs/qs/stages/02-sft/model
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from turnforge.recipes import SFTStageConfig
from turnforge.stages.collect import TRAJECTORIES_FILE
from turnforge.stages.context import RunContext


def run_sft_stage(stage: SFTStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.sft import METRICS_FILE, MODEL_DIR, run_sft

    start = ctx.model(ctx.recipe.model_source(index))
    if start.adapter is not None:
        raise ValueError(
            f"stage {stage.id}: its model is a LoRA adapter saved unmerged; set merge = true on the stage "
            "that trained it to train on top of it"
        )
    data = [data_path(source, ctx) for source in ctx.recipe.data_sources(index)]
    result = run_sft(start.path, data, stage_dir, stage.settings())
    model_dir = stage_dir / MODEL_DIR
    return {
        **result,
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
