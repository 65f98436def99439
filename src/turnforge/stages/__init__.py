"""Pipeline stages: one module per `[[stages]]` kind, each `run_<kind>(stage, index, stage_dir, ctx) -> result`.

The result (JSON) is stored in the stage's done.json; paths in it are relative to the run directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnforge.stages.collect import run_collect
from turnforge.stages.context import ModelRef, RunContext, stage_folder
from turnforge.stages.dpo import run_dpo_stage
from turnforge.stages.eval import EVAL_DIR, run_eval_stage
from turnforge.stages.grpo import run_envtune_stage, run_grpo_stage
from turnforge.stages.rft import run_rft_stage
from turnforge.stages.sft import run_sft_stage

StageRunner = Callable[[Any, int, Path, RunContext], dict[str, Any]]

RUNNERS: dict[str, StageRunner] = {
    "collect": run_collect,
    "sft": run_sft_stage,
    "eval": run_eval_stage,
    "rft": run_rft_stage,
    "grpo": run_grpo_stage,
    "envtune": run_envtune_stage,
    "dpo": run_dpo_stage,
}

__all__ = ["EVAL_DIR", "RUNNERS", "ModelRef", "RunContext", "StageRunner", "stage_folder"]
