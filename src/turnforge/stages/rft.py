"""Stage `rft`: rejection fine-tuning — sample k episodes per task with the current model, keep the good
ones (`turnforge.data.rft.select_rft`), fine-tune on them with the SFT trainer.

    stages/NN-rft/samples/        episodes.jsonl + summary.json of the sampling (resumable, as an eval)
    stages/NN-rft/kept.jsonl      the episodes trained on
    stages/NN-rft/model/          the fine-tuned model; metrics.jsonl beside it

done.json reports the yield (kept / sampled) overall and per category.

    turnforge run quickstart --out runs/qs      # its stage `rft`
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from turnforge.data.rft import select_rft
from turnforge.eval.runner import EPISODES_FILE, read_episodes
from turnforge.stages.context import RunContext
from turnforge.stages.eval import run_rollouts
from turnforge.stages.sft import data_path

logger = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
KEPT_FILE = "kept.jsonl"


def run_rft_stage(stage: Any, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.sft import METRICS_FILE, MODEL_DIR, run_sft

    start = ctx.model(ctx.recipe.model_source(index))
    if start.adapter is not None:
        raise ValueError(f"stage {stage.id}: its model is an unmerged LoRA adapter; set merge = true where it was trained")
    sampled = run_rollouts(stage, index, stage_dir / SAMPLES_DIR, ctx)
    episodes = read_episodes(stage_dir / SAMPLES_DIR / EPISODES_FILE)
    kept, report = select_rft(episodes, stage.keep, stage.max_per_task, stage.min_progress)
    if not kept:  # nothing to learn from: the model goes on unchanged, and the run says so
        logger.warning(
            "stage %s: no episode to keep out of %d (success rate %.3f); the model is passed on untrained. "
            "Sample more (samples, tasks), set keep = \"best\", or train the model longer first",
            stage.id, len(episodes), sampled["success"],
        )
        return {"model": start.path, "adapter": False, "steps": 0, "sample_success": sampled["success"],
                "yield": report, "note": "no episode kept: model unchanged"}
    kept_path = stage_dir / KEPT_FILE
    kept_path.write_text("".join(t.to_json() + "\n" for t in kept), encoding="utf-8")
    extra = [data_path(source, ctx) for source in ctx.recipe.data_sources(index)]
    result = run_sft(start.path, [str(kept_path), *extra], stage_dir, stage.settings())
    model_dir = stage_dir / MODEL_DIR
    return {
        **result,
        "model": ctx.relative(model_dir),
        "adapter": (model_dir / "adapter_config.json").exists(),
        "metrics": ctx.relative(stage_dir / METRICS_FILE),
        "sample_success": sampled["success"],
        "yield": report,
    }
