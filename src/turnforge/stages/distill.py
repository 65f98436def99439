"""Stage `distill`: on-policy distillation (`turnforge.train.distill`) of a teacher into the stage's model.

    stages/NN-distill/  model/, metrics.jsonl (TRL's logs), rollouts.jsonl (per batch, with `teacher_kl`)

    turnforge run quickstart_distill --out runs/qsd      # its stage 06-distill

    [[stages]]
    kind = "distill"
    model = "sft-student"        # the student (as any training stage's `model`)
    teacher = "sft-teacher"      # an earlier training stage of this recipe, or hf:PATH, vllm:PATH, openai:URL[#MODEL]
    steps = 30

The config is a `turnforge.train.distill.DistillSettings` (GRPO's settings plus `kl_coef` and `reward_weight`;
it derives from it) with GRPO's task filter (`TaskFilter`), and is what the trainer gets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from turnforge.policies import PolicySpec
from turnforge.stages.config import STAGE_NAME, StageConfig, TrainStage, find_stage
from turnforge.stages.context import RunContext
from turnforge.stages.grpo import TaskFilter, rl_outputs, select_tasks
from turnforge.stages.registry import register_stage
from turnforge.train.distill import DistillSettings

TEACHER_SPECS = ("hf", "vllm", "openai")


class DistillStageConfig(TrainStage, TaskFilter, DistillSettings):
    """`kind = "distill"`: the student (`model`) plays, the teacher scores its tokens, loss = reverse KL per token."""

    kind: Literal["distill"] = "distill"
    HASHED_WHEN_SET: ClassVar[frozenset[str]] = frozenset({"divergence", "gkd_beta", "max_staleness"})
    name: str = Field(default="distill", pattern=STAGE_NAME)
    teacher: str = Field(min_length=1)
    """An earlier training stage of the recipe (its model, in-process), or a policy spec that scores tokens:
    hf:PATH, vllm:PATH or openai:URL[#MODEL] (a server with vLLM's `prompt_logprobs`: vLLM, `turnforge serve`)."""

    @model_validator(mode="after")
    def _teacher_scores_tokens(self) -> DistillStageConfig:
        if _spec_kind(self.teacher) not in (None, *TEACHER_SPECS):
            raise ValueError(f"teacher {self.teacher!r}: a teacher scores tokens: an earlier training stage, "
                             "hf:PATH, vllm:PATH or openai:URL[#MODEL]")
        if self.divergence == "gkd" and _spec_kind(self.teacher) in ("vllm", "openai"):
            raise ValueError(f"teacher {self.teacher!r}: divergence \"gkd\" needs the teacher's whole next-token "
                             "distribution, so a teacher in this process (an earlier stage or hf:PATH); "
                             "use divergence = \"sampled\" with a server teacher")
        return self

    def model_reads(self, earlier: list[StageConfig]) -> list[str]:
        """The ids of the earlier stages whose model this stage reads besides its own start model: the teacher's
        stage (none for a spec). The pipeline hashes them with this stage's inputs; the recipe loader checks them."""
        if _spec_kind(self.teacher) is not None:
            return []
        found = find_stage(self.teacher, [s for s in earlier if isinstance(s, TrainStage)])
        if found is None:
            names = ", ".join(s.id for s in earlier if isinstance(s, TrainStage)) or "none"
            raise ValueError(f"teacher {self.teacher!r} is no earlier training stage ({names}) and no hf:PATH, "
                             "vllm:PATH or openai:URL[#MODEL] spec")
        return [found.id]


def _spec_kind(teacher: str) -> str | None:
    """The policy kind of a teacher written as a spec (`hf:...`), None for a stage reference."""
    kind, colon, _ = teacher.partition(":")
    return PolicySpec.parse(teacher).kind if colon and kind in (*TEACHER_SPECS, "expert", "random", "replay") else None


def teacher_spec(stage: DistillStageConfig, index: int, ctx: RunContext) -> str:
    """The teacher's policy spec: as written, or `hf:PATH` of the model an earlier training stage made."""
    reads = stage.model_reads(ctx.recipe.stages[:index])
    if not reads:
        return stage.teacher
    ref = ctx.model(reads[0])
    if ref.adapter is not None:
        raise ValueError(f"stage {stage.id}: teacher {reads[0]} saved a LoRA adapter unmerged; set merge = true on it")
    return f"hf:{ref.path}"


def run_distill_stage(stage: DistillStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.policies.teacher import make_teacher  # torch and TRL load when a training stage runs
    from turnforge.train.distill import run_distill

    start = ctx.model(ctx.recipe.model_source(index))
    teacher = make_teacher(teacher_spec(stage, index, ctx))
    env, options = ctx.stage_env(stage)
    tasks = select_tasks(env, options, stage.split, stage.tasks, stage.categories, stage.difficulty)
    result = run_distill(start.path, teacher, env, options, tasks, stage_dir, stage, start.adapter)
    return {**result, **rl_outputs(stage_dir, ctx), "tasks": len(tasks)}


register_stage(DistillStageConfig, run_distill_stage)
