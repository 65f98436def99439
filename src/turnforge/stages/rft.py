"""Stage `rft`: rejection fine-tuning — sample k episodes per task with the current model, keep the good
ones (`turnforge.data.rft.select_rft`), fine-tune on them with the SFT trainer.

    stages/NN-rft/greedy/         with aim = "greedy_failures": the greedy play of the tasks (resumable)
    stages/NN-rft/samples/        episodes.jsonl + summary.json of the sampling (resumable, as an eval)
    stages/NN-rft/kept.jsonl      the episodes trained on
    stages/NN-rft/model/          the fine-tuned model; metrics.jsonl beside it

done.json reports the yield (kept / sampled) overall and per category.

    turnforge run quickstart --out runs/qs      # its stage `rft`
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_serializer, model_validator

from turnforge.data.rft import select_rft
from turnforge.launch import main_process_result
from turnforge.rollouts_file import read_episodes
from turnforge.rundir import EPISODES_FILE
from turnforge.stages.config import STAGE_NAME, RolloutStage, TrainStage
from turnforge.stages.context import RunContext
from turnforge.stages.eval import run_rollouts
from turnforge.stages.registry import register_stage
from turnforge.stages.sft import data_path, trained_model
from turnforge.train.settings import SFTSettings
from turnforge.types import Trajectory

logger = logging.getLogger(__name__)

SAMPLES_DIR = "samples"
GREEDY_DIR = "greedy"
KEPT_FILE = "kept.jsonl"
REPLAY_FILE = "replay.jsonl"

class RFTStageConfig(RolloutStage, TrainStage):
    """`kind = "rft"`: rejection fine-tuning. `samples` episodes per task with the current model, keep the
    successful ones (deduplicated, at most `max_per_task` per task), SFT on them (`train` = SFT settings)."""

    kind: Literal["rft"] = "rft"
    name: str = Field(default="rft", pattern=STAGE_NAME)
    policy: Literal["hf"] = "hf"
    split: str = "train"
    samples: int = Field(default=4, ge=1)
    keep: Literal["success", "best"] = "success"
    """success: successful episodes only; best: also, for a task with no success, its best episode by progress
    when that progress is at least `min_progress`."""
    min_progress: float = Field(default=0.5, ge=0.0, le=1.0)
    max_per_task: int = Field(default=2, ge=1)
    skip_solved: bool = False
    """Keep nothing of a task whose samples all succeeded (the model already does it): what is kept is then
    where the model is still unreliable (DAPO's filter of zero-variance groups, applied to RFT)."""
    aim: Literal["all", "greedy_failures"] = "all"
    """all: sample every task. greedy_failures: play each task greedily first and sample only the tasks that play
    failed, so what is kept is where the greedy policy (the one evaluated) fails and some sample does not
    (expert iteration aimed at pass@k -> pass@1; docs/quickstart.md, seventeenth session)."""
    replay: int = Field(default=0, ge=0)
    """With aim = "greedy_failures": this many of the greedy play's own successes (drawn with `seed`) are trained on
    beside the kept episodes, so that fine-tuning on the failed tasks does not move the play on the others."""
    repeat_kept: int = Field(default=1, ge=1)
    """Each kept episode appears this many times in the fine-tuning data (its weight against `replay` and `data`)."""
    data: list[str] = Field(default_factory=list)
    """More training data mixed in (earlier collect stages, hf:DATASET, JSONL files), e.g. the SFT data."""
    train: SFTSettings = Field(default_factory=SFTSettings)
    """The SFT settings of the fine-tuning step (the fields of an sft stage: max_steps, learning_rate, ...): what
    the SFT trainer gets. Nested, not flat as an sft stage's, since some names mean another thing here (batch_size
    is the episodes sampled at once, seed the sampling's)."""
    _train_as_written: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_train_as_written(cls, data: Any, handler: Any) -> RFTStageConfig:
        stage = handler(data)
        if isinstance(data, dict) and isinstance(data.get("train"), dict):
            stage._train_as_written = dict(data["train"])
        return stage

    @field_serializer("train")
    def _train_table(self, train: SFTSettings) -> dict[str, Any]:
        # The table as the recipe wrote it (epochs = 1 stays 1, unset keys stay unset), as when it was an untyped
        # table: the stage's hash and config.toml are unchanged, so runs made before keep their finished stages.
        if self._train_as_written is not None:
            return self._train_as_written
        return train.model_dump(mode="json", exclude_unset=True)

    @model_validator(mode="after")
    def _replay_needs_greedy_play(self) -> RFTStageConfig:
        if self.replay and self.aim != "greedy_failures":
            raise ValueError('replay takes the greedy play\'s successes: it needs aim = "greedy_failures"')
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
        if report.get("greedy_failures") == 0:
            why = "the greedy play solved every task (aim = greedy_failures)"
        else:
            why = f"no episode to keep out of {n_episodes} (success rate {sampled['success']:.3f})"
        logger.warning("stage %s: %s; the model is passed on untrained. Sample more (samples, tasks), set keep = "
                       "\"best\", or train the model longer first", stage.id, why)
        return {"model": start.path, "adapter": False, "steps": 0, "sample_success": sampled["success"],
                "yield": report, "note": f"{why}: model unchanged"}
    kept_path, replay_path = stage_dir / KEPT_FILE, stage_dir / REPLAY_FILE
    extra = [data_path(source, ctx) for source in ctx.recipe.data_sources(index)]
    own = [str(kept_path)] * stage.repeat_kept + ([str(replay_path)] if stage.replay and replay_path.exists() else [])
    result = run_sft(start.path, [*own, *extra], stage_dir, stage.train)
    return {
        **result,
        **trained_model(stage_dir, ctx),
        "sample_success": sampled["success"],
        "yield": report,
    }


def _sample_and_keep(stage: RFTStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> tuple:
    """Sample the episodes (resumable), keep the good ones in kept.jsonl: (summary, sampled, kept, yield report)."""
    task_ids, report_greedy = None, {}
    if stage.aim == "greedy_failures":
        greedy = stage.model_copy(update={"temperature": 0.0, "top_p": 1.0, "top_k": 0, "explore": 1.0, "samples": 1})
        screen = run_rollouts(greedy, index, stage_dir / GREEDY_DIR, ctx)
        played = read_episodes(stage_dir / GREEDY_DIR / EPISODES_FILE)
        task_ids, replay = aim_at_failures(played, stage.replay, stage.seed)
        report_greedy = {"greedy_success": screen["success"], "greedy_failures": len(task_ids), "replay": len(replay)}
        if replay:
            (stage_dir / REPLAY_FILE).write_text("".join(t.to_json() + "\n" for t in replay), encoding="utf-8")
        else:  # none drawn this time: an earlier run's file in this folder must not be trained on
            (stage_dir / REPLAY_FILE).unlink(missing_ok=True)
        if not task_ids:  # the greedy play solves every task: nothing to aim at
            return screen, 0, 0, {"kept": 0, **report_greedy}
    sampled = run_rollouts(stage, index, stage_dir / SAMPLES_DIR, ctx, task_ids=task_ids)
    episodes = read_episodes(stage_dir / SAMPLES_DIR / EPISODES_FILE)
    kept, report = select_rft(episodes, stage.keep, stage.max_per_task, stage.min_progress, stage.skip_solved)
    report.update(report_greedy)
    if kept:
        (stage_dir / KEPT_FILE).write_text("".join(t.to_json() + "\n" for t in kept), encoding="utf-8")
    return sampled, len(episodes), len(kept), report


def aim_at_failures(played: list[Trajectory], replay: int, seed: int) -> tuple[list[str], list[Trajectory]]:
    """From the greedy play of the tasks: the ids of the tasks it failed (to sample), and `replay` of its successes
    (drawn with `seed`, in play order) to train on beside the kept episodes."""
    failed = [t.task_id for t in played if not t.score.success]
    solved = [t for t in played if t.score.success]
    drawn = sorted(random.Random(seed).sample(range(len(solved)), min(replay, len(solved))))
    return failed, [solved[i] for i in drawn]


register_stage(RFTStageConfig, run_rft_stage)
