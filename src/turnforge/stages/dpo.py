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

import json
import os
from functools import partial
from pathlib import Path
from typing import Any

from turnforge.data.dpo_pairs import (
    MiningCounts,
    MiningSettings,
    Pair,
    load_pairs,
    mine_dpo_pairs,
    reason_counts,
    save_pairs,
)
from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.recipes import DPOStageConfig
from turnforge.stages.context import RunContext
from turnforge.stages.sft import data_path
from turnforge.types import Task, Trajectory

PAIRS_FILE = "pairs.jsonl"
# The keys that mark a JSON line as a Trajectory (as train/sft.py tells trajectories from conversations).
_TRAJECTORY_KEYS = frozenset({"task_id", "turns", "score", "stop_reason"})


def run_dpo_stage(stage: DPOStageConfig, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.dpo import METRICS_FILE, MODEL_DIR, run_dpo

    start = ctx.model(ctx.recipe.model_source(index))
    counts = MiningCounts()
    pairs = stage_pairs(stage, index, ctx, counts)
    pairs_path = stage_dir / PAIRS_FILE
    tmp = save_pairs(pairs, stage_dir / (PAIRS_FILE + ".tmp.jsonl"))
    os.replace(tmp, pairs_path)  # a kill mid-write leaves no half file that a rerun would take as whole
    if not pairs:
        raise ValueError(
            f"stage {stage.id}: no DPO pairs: {counts.episodes} episodes replayed, {counts.defective_turns} defective "
            f"replies, {counts.no_clean_chosen} without a defect-free chosen reply; collect rollouts of a policy that "
            "makes mistakes (policy = \"hf\") or add a pair dataset to `data`"
        )
    result = run_dpo(start.path, [str(pairs_path)], stage_dir, stage.settings(), adapter=start.adapter)
    model_dir = stage_dir / MODEL_DIR
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
        },
        "model": ctx.relative(model_dir),
        "adapter": (model_dir / "adapter_config.json").exists(),
        "metrics": ctx.relative(stage_dir / METRICS_FILE),
    }


def stage_pairs(stage: DPOStageConfig, index: int, ctx: RunContext, counts: MiningCounts) -> list[Pair]:
    """Mined pairs of the trajectory sources, then the pairs of the pair datasets, in `data` order.

    A collect stage's trajectories replay in the env that stage played (its own `env` table, e.g. Iron
    Guard's SQL collect); trajectory files replay in the recipe's env."""
    settings = MiningSettings(verbose_chars=stage.verbose_chars, reasons=tuple(stage.reasons) if stage.reasons else None)
    mined: list[Pair] = []
    imported: list[Pair] = []
    for source in ctx.recipe.data_sources(index):
        path = data_path(source, ctx)
        if not _holds_trajectories(path):
            imported += load_pairs(path)
            continue
        collect = ctx.recipe.stage(source) if any(s.id == source for s in ctx.recipe.stages) else None
        env_name, raw_options = ctx.recipe.stage_env(collect) if collect is not None else (
            ctx.recipe.env.name, ctx.recipe.env_options())
        options = get_env_spec(env_name).coerce_options(raw_options)
        trajectories = _read_trajectories(Path(path))
        tasks = _tasks_of(trajectories, env_name, options)
        mined += mine_dpo_pairs(trajectories, partial(make_env, env_name, **options), tasks, settings, counts)
    if stage.reasons:
        imported = [p for p in imported if p.reason in stage.reasons]
    return mined + imported


def _holds_trajectories(path: str) -> bool:
    """A JSONL file whose first record is a Trajectory (not a pair)."""
    if path.startswith("hf:") or not path.endswith((".jsonl", ".json")) or not Path(path).is_file():
        return False
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False  # load_pairs reports the bad line with its place
    return isinstance(record, dict) and record.keys() >= _TRAJECTORY_KEYS


def _read_trajectories(path: Path) -> list[Trajectory]:
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(Trajectory.from_json(line))
                except (KeyError, TypeError, ValueError) as e:
                    raise ValueError(f"{path}:{lineno}: not a trajectory ({type(e).__name__}: {e})") from e
    return out


def _tasks_of(trajectories: list[Trajectory], env_name: str, options: dict[str, Any]) -> dict[str, Task]:
    """The tasks the trajectories played, from the env's splits (each split loaded once)."""
    wrong_env = {t.env for t in trajectories} - {env_name}
    if wrong_env:
        raise ValueError(f"dpo mining replays in env {env_name!r}, but some trajectories come from {sorted(wrong_env)}")
    tasks: dict[str, Task] = {}
    for split in sorted({t.split for t in trajectories}):
        tasks |= {task.id: task for task in load_tasks(env_name, split, **options)}
    return tasks
