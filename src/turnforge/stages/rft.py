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
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from turnforge.data.rft import mask_defects, select_rft
from turnforge.envs.base import get_env_spec, make_env, tasks_of
from turnforge.eval.runner import EPISODES_FILE, read_episodes
from turnforge.scale.processes import main_process_result
from turnforge.stages.config import STAGE_NAME, RolloutStage, Table, TrainStage, with_settings_fields
from turnforge.stages.context import RunContext
from turnforge.stages.eval import run_rollouts
from turnforge.stages.registry import register_stage
from turnforge.stages.sft import data_path, trained_model
from turnforge.train.settings import SettingsError, SFTSettings

logger = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
KEPT_FILE = "kept.jsonl"

SFTSettingsTable = with_settings_fields("SFTSettingsTable", Table, SFTSettings)
"""rft's `train` table: the fields of an sft stage's training (unknown keys and bad values name the field)."""


class RFTStageConfig(RolloutStage, TrainStage):
    """`kind = "rft"`: rejection fine-tuning. `samples` episodes per task with the current model, keep the
    successful ones (deduplicated, at most `max_per_task` per task), SFT on them (`train` = SFT settings)."""

    kind: Literal["rft"] = "rft"
    name: str = Field(default="rft", pattern=STAGE_NAME)
    policy: Literal["hf"] = "hf"
    split: str = "train"
    samples: int = Field(default=4, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    keep: Literal["success", "best"] = "success"
    """success: successful episodes only; best: also, for a task with no success, its best episode by progress
    when that progress is at least `min_progress`."""
    min_progress: float = Field(default=0.5, ge=0.0, le=1.0)
    max_per_task: int = Field(default=2, ge=1)
    skip_solved: bool = False
    """Keep nothing of a task whose samples all succeeded (the model already does it): what is kept is then
    where the model is still unreliable (DAPO's filter of zero-variance groups, applied to RFT)."""
    mask_defects: bool = False
    """Replay each kept episode in the env and train on none of the replies it flags as defective ("Nothing
    happens.", a loop, a format error: `turnforge.data.rft.mask_defects`); they stay as context, so a success
    that recovered from a slip teaches the recovery, not the slip."""
    guide: float = Field(default=0.0, ge=0.0, lt=1.0)
    """The share of the sampled replies the env's expert writes, at the state the episode reached (`ExpertGuided`);
    the kept successes then hold its replies where the model's own failed, and also the model's mistakes that a
    later expert reply repaired (docs/quickstart.md, sixteenth session: not better than unguided there). 0 = off."""
    data: list[str] = Field(default_factory=list)
    """More training data mixed in (earlier collect stages, hf:DATASET, JSONL files), e.g. the SFT data."""
    train: dict[str, Any] = Field(default_factory=dict)
    """The SFT settings of the fine-tuning step (the fields of an sft stage: max_steps, learning_rate, ...)."""

    def settings(self) -> SFTSettings:
        return SFTSettings(**self.train)

    @model_validator(mode="after")
    def _train_is_valid(self) -> RFTStageConfig:
        SFTSettingsTable.model_validate(self.train)  # unknown keys and bad types name the field
        try:
            self.settings()
        except SettingsError as e:  # bad values, each at its key inside `train`
            raise SettingsError(e.kind, [(("train", k) if isinstance(k, str) else ("train", *k), m) for k, m in e.problems]) from None
        return self


def run_rft_stage(stage: RFTStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.sft import (
        run_sft,  # torch and TRL (seconds to import) load when a training stage runs
    )

    start = ctx.model(ctx.recipe.model_source(index))
    if start.adapter is not None:
        raise ValueError(f"stage {stage.id}: its model is an unmerged LoRA adapter; set merge = true where it was trained")
    # Sampling and selection on the main process (under `accelerate launch`), the fine-tuning on every one.
    sampled, n_episodes, n_kept, report = main_process_result(lambda: _sample_and_keep(stage, index, stage_dir, ctx))
    if not n_kept:  # nothing to learn from: the model goes on unchanged, and the run says so
        if report["kept"]:  # episodes were kept, but mask_defects left none of their replies to learn
            why = f"every reply of the {report['kept']} episodes kept is a defect (mask_defects)"
        else:
            why = f"no episode to keep out of {n_episodes} (success rate {sampled['success']:.3f})"
        logger.warning("stage %s: %s; the model is passed on untrained. Sample more (samples, tasks), set keep = "
                       "\"best\", or train the model longer first", stage.id, why)
        return {"model": start.path, "adapter": False, "steps": 0, "sample_success": sampled["success"],
                "yield": report, "note": f"{why}: model unchanged"}
    kept_path = stage_dir / KEPT_FILE
    extra = [data_path(source, ctx) for source in ctx.recipe.data_sources(index)]
    result = run_sft(start.path, [str(kept_path), *extra], stage_dir, stage.settings())
    return {
        **result,
        **trained_model(stage_dir, ctx),
        "sample_success": sampled["success"],
        "yield": report,
    }


def _sample_and_keep(stage: RFTStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> tuple:
    """Sample the episodes (resumable), keep the good ones in kept.jsonl: (summary, sampled, kept, yield report)."""
    sampled = run_rollouts(stage, index, stage_dir / SAMPLES_DIR, ctx, guide=stage.guide)
    episodes = read_episodes(stage_dir / SAMPLES_DIR / EPISODES_FILE)
    kept, report = select_rft(episodes, stage.keep, stage.max_per_task, stage.min_progress, stage.skip_solved)
    if kept and stage.mask_defects:
        env_name, raw_options = ctx.recipe.stage_env(stage)
        options = get_env_spec(env_name).coerce_options(raw_options)
        report["masked"] = mask_defects(kept, partial(make_env, env_name, **options), tasks_of(kept, env_name, **options))
        kept = [t for t in kept if any(turn.learn for turn in t.turns)]  # every reply a slip: nothing to learn
        report["masked"]["left"] = len(kept)
    if kept:
        (stage_dir / KEPT_FILE).write_text("".join(t.to_json() + "\n" for t in kept), encoding="utf-8")
    return sampled, len(episodes), len(kept), report


register_stage(RFTStageConfig, run_rft_stage)
