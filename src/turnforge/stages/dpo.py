"""Stage `dpo`: mine round-wise pairs from earlier rollouts, then DPO-train the stage's model on them.

The data are earlier collect stages (their `trajectories.jsonl` are replayed in the env each collect stage
played — the recipe's, or its own `env = { name = ... }` — and every defective reply becomes a pair:
`turnforge.data.dpo_pairs.mine_dpo_pairs`), trajectory JSONL files (replayed in the recipe's env), and pair
datasets made elsewhere (`hf:NAME`, JSONL/parquet in the seed or TRL schema). Everything lands in `stages/NN-<id>/pairs.jsonl` (seed schema +
provenance), the per-reason counts in done.json, and the model trained by `turnforge.train.dpo.run_dpo` in
`stages/NN-<id>/model` (LoRA on the start model, merged unless `merge = false`).

    turnforge run alfworld_dpo --out runs/alf-dpo         # 01 collect, 02 sft, 03 collect-policy, 04 dpo, evals
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from turnforge.data.dpo_pairs import (
    MiningCounts,
    MiningSettings,
    Pair,
    load_pairs,
    mine_dpo_pairs,
    policy_teacher,
    reason_counts,
    save_pairs,
)
from turnforge.data.sources import holds_trajectories
from turnforge.envs.base import make_env, tasks_of, with_family_format
from turnforge.launch import main_process_result
from turnforge.policies import MODEL_BACKENDS, PolicySpec, make_policy
from turnforge.policies.base import Policy, SamplingParams
from turnforge.stages.config import STAGE_NAME, TrainStage
from turnforge.stages.context import MODELS_DIR, RunContext
from turnforge.stages.registry import register_stage
from turnforge.stages.sft import data_path, trained_model
from turnforge.tiny_model import resolve_model
from turnforge.train.settings import DPOSettings
from turnforge.types import Temperature, read_trajectories

PAIRS_FILE = "pairs.jsonl"


class DPOStageConfig(TrainStage, DPOSettings):
    """`kind = "dpo"`: round-wise DPO on pairs mined from earlier collect stages and/or pair datasets.

    The training fields are those of `turnforge.train.settings.DPOSettings`: the stage is the trainer's settings.
    """

    kind: Literal["dpo"] = "dpo"
    name: str = Field(default="dpo", pattern=STAGE_NAME)
    data: list[str] = Field(min_length=1)
    """Earlier collect stages (their trajectories are mined), or pair datasets: `hf:NAME[:SPLIT]`, JSONL/parquet files
    in the seed schema (messages, chosen, rejected, reason) or TRL's (prompt, chosen, rejected)."""
    reasons: list[str] | None = None
    """Keep mined pairs of these reasons only (format, task_succeeded_negative, loop, implausible_location,
    invalid_action, verbose, or an env's own); unset = all."""
    verbose_chars: int = Field(default=160, ge=0)
    """A valid reply is `verbose` when longer than its concise rendering by more than this many characters."""
    teacher: str | None = None
    """A model that writes the chosen replies (`hf:PATH`, `vllm:PATH`, `openai:URL#model`; the Iron Guard seed used
    a Qwen3-30B teacher): asked at every mined decision point with the same history, its reply is kept only when
    replaying it in the env shows no defect, else the sibling / expert reply is used. Unset = no teacher."""
    teacher_temperature: Temperature = 0.0
    teacher_max_new_tokens: int = Field(default=256, ge=1)

    @field_validator("teacher")
    @classmethod
    def _teacher_is_a_model(cls, spec: str | None) -> str | None:
        if spec is not None and PolicySpec.parse(spec).kind not in MODEL_BACKENDS:
            raise ValueError(f"teacher {spec!r} is not a model; give hf:PATH, vllm:PATH or openai:URL[#model]")
        return spec

    def teacher_sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.teacher_temperature, max_new_tokens=self.teacher_max_new_tokens)



def run_dpo_stage(stage: DPOStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.dpo import (
        run_dpo,  # torch and TRL (seconds to import) load when a training stage runs
    )

    start = ctx.model(ctx.recipe.model_source(index))
    pairs_path = stage_dir / PAIRS_FILE
    # Mining on the main process (under `accelerate launch`), the training on every one.
    pairs, counts = main_process_result(lambda: _mine_and_save(stage, index, ctx, pairs_path))
    if not pairs:
        raise ValueError(
            f"stage {stage.id}: no DPO pairs: {counts.episodes} episodes replayed, {counts.defective_turns} defective "
            f"replies, {counts.no_clean_chosen} without a defect-free chosen reply; collect rollouts of a policy that "
            "makes mistakes (policy = \"hf\") or add a pair dataset to `data`"
        )
    result = run_dpo(start.path, [str(pairs_path)], stage_dir, stage, adapter=start.adapter)
    return {
        **result,
        "pairs_file": ctx.relative(pairs_path),
        "pairs_by_reason": reason_counts(pairs),
        "mining": {
            "episodes": counts.episodes,
            "turns": counts.turns,
            "defective_turns": counts.defective_turns,
            "no_clean_chosen": counts.no_clean_chosen,
            "not_replayable": counts.not_replayable,
            "duplicates": counts.duplicates,
            "chosen_from": counts.chosen_from,
            "teacher_rejected": counts.teacher_rejected,
        },
        **trained_model(stage_dir, ctx),
    }


def _mine_and_save(stage: DPOStageConfig, index: int, ctx: RunContext, pairs_path: Path) -> tuple[list[Pair], MiningCounts]:
    counts = MiningCounts()
    pairs = stage_pairs(stage, index, ctx, counts)
    tmp = save_pairs(pairs, pairs_path.with_name(PAIRS_FILE + ".tmp.jsonl"))
    os.replace(tmp, pairs_path)  # a kill mid-write leaves no half file that a rerun would take as whole
    return pairs, counts


def stage_pairs(stage: DPOStageConfig, index: int, ctx: RunContext, counts: MiningCounts) -> list[Pair]:
    """Mined pairs of the trajectory sources, then the pairs of the pair datasets, in `data` order.

    A collect stage's trajectories replay in the env that stage played (its own `env` table, e.g. Iron
    Guard's SQL collect); trajectory files replay in the recipe's env."""
    settings = MiningSettings(verbose_chars=stage.verbose_chars, reasons=tuple(stage.reasons) if stage.reasons else None)
    teacher = _teacher_policy(stage, ctx)
    mined: list[Pair] = []
    imported: list[Pair] = []
    for source in ctx.recipe.data_sources(index):
        path = data_path(source, ctx)
        if not holds_trajectories(path):
            imported += load_pairs(path)
            continue
        collect = ctx.recipe.stage(source) if any(s.id == source for s in ctx.recipe.stages) else None
        env_name, options = ctx.stage_env(collect) if collect is not None else (
            ctx.recipe.env.name,
            with_family_format(ctx.recipe.env.name, ctx.recipe.env_options(), ctx.model_family()))
        trajectories = read_trajectories(path)
        tasks = tasks_of(trajectories, env_name, **options)
        env_factory = partial(make_env, env_name, **options)
        writer = policy_teacher(teacher, stage.teacher_sampling(), env_factory) if teacher is not None else None
        mined += mine_dpo_pairs(trajectories, env_factory, tasks, settings, counts, writer)
    if stage.reasons:
        imported = [p for p in imported if p.reason in stage.reasons]
    return mined + imported


def _teacher_policy(stage: DPOStageConfig, ctx: RunContext) -> Policy | None:
    """The stage's teacher as a policy; `hf:tiny` builds the tiny model into the run's models folder."""
    if stage.teacher is None:
        return None
    spec = PolicySpec.parse(stage.teacher)
    if spec.kind in ("hf", "vllm") and spec.target:
        spec = replace(spec, target=resolve_model(spec.target, ctx.out_dir / MODELS_DIR, ctx.recipe.envs()))
    options = {"device": ctx.recipe.model.device, "dtype": ctx.recipe.model.dtype} if spec.kind == "hf" else {}
    return make_policy(spec.text, **options)


register_stage(DPOStageConfig, run_dpo_stage)
