"""Stages `grpo` and `envtune`: multi-turn GRPO (`turnforge.train.grpo`) on the recipe's env.

`grpo` trains once on its task filter. `envtune` (Environment Tuning, arXiv 2510.10197) runs GRPO
through its phases in order — each phase with its own tasks, env options (hints on/off), reward weights and
length — every phase starting from the model the previous one wrote; the last phase runs without hints.

    stages/NN-grpo/               model/, metrics.jsonl (TRL's logs), rollouts.jsonl (per generation batch)
    stages/NN-envtune/PP-<phase>/ the same per phase; stages/NN-envtune/model is the last phase's model

A killed envtune stage resumes at the first phase without its `model/` folder.

    turnforge run quickstart --out runs/qs      # its stage `grpo`
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from turnforge.envs.base import load_tasks
from turnforge.stages.context import RunContext
from turnforge.types import Task


def select_tasks(
    env: str,
    options: dict[str, Any],
    split: str,
    limit: int | None,
    categories: list[str] | None,
    difficulty: tuple[float, float] | None,
) -> list[Task]:
    """The first `limit` tasks of `split` that are in `categories` (all when empty) and within `difficulty`."""
    tasks = load_tasks(env, split, **options)
    if categories:
        known = {t.category for t in tasks}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise ValueError(f"categories {unknown} do not occur in {env} {split}; categories: {sorted(known)}")
        tasks = [t for t in tasks if t.category in categories]
    if difficulty is not None:
        low, high = difficulty
        tasks = [t for t in tasks if low <= float(t.data.get("difficulty", 0.0)) <= high]
    return tasks[:limit] if limit is not None else tasks


def run_grpo_stage(stage: Any, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.grpo import run_grpo

    start = ctx.model(ctx.recipe.model_source(index))
    env, options = ctx.recipe.stage_env(stage)
    tasks = select_tasks(env, options, stage.split, stage.tasks, stage.categories, stage.difficulty)
    result = run_grpo(start.path, env, options, tasks, stage_dir, stage.settings(), start.adapter)
    return {**result, **_outputs(stage_dir, ctx), "tasks": len(tasks)}


def run_envtune_stage(stage: Any, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.grpo import METRICS_FILE, MODEL_DIR, run_grpo

    start = ctx.model(ctx.recipe.model_source(index))
    model, adapter = start.path, start.adapter
    phases = []
    combined = stage_dir / METRICS_FILE
    combined.unlink(missing_ok=True)
    offset = 0
    for k, phase in enumerate(stage.phases):
        phase_dir = stage_dir / f"{k + 1:02d}-{phase.name}"
        env, stage_options = ctx.recipe.stage_env(stage)
        options = {**stage_options, **phase.env}
        if k == len(stage.phases) - 1 and "hints" in _env_option_names(env):
            options["hints"] = False  # Environment Tuning: the last phase learns to do without them
        categories = phase.categories if phase.categories is not None else stage.categories
        tasks = select_tasks(
            env, options, stage.split, phase.tasks or stage.tasks, categories, phase.difficulty or stage.difficulty
        )
        overrides: dict[str, Any] = {"steps": phase.steps, "rewards": dict(phase.rewards), "merge": True}
        if phase.learning_rate is not None:
            overrides["learning_rate"] = phase.learning_rate
        if not (phase_dir / MODEL_DIR / "config.json").exists():
            result = run_grpo(model, env, options, tasks, phase_dir, stage.settings(**overrides), adapter)
            phases.append({"phase": phase.name, "tasks": len(tasks), "hints": options.get("hints"), **result})
        else:
            phases.append({"phase": phase.name, "tasks": len(tasks), "hints": options.get("hints"), "resumed": True})
        offset = _append_metrics(phase_dir / METRICS_FILE, combined, offset, phase.name)
        model, adapter = str(phase_dir / MODEL_DIR), None
    final = stage_dir / MODEL_DIR
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(model, final)
    return {"phases": phases, **_outputs(stage_dir, ctx)}


def _append_metrics(source: Path, combined: Path, offset: int, phase: str) -> int:
    """Append a phase's metrics.jsonl to the stage's, steps shifted by `offset`; returns the next offset."""
    last = offset
    if source.exists():
        with combined.open("a", encoding="utf-8") as out:
            for line in source.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                entry["step"] = last = offset + int(entry["step"])
                out.write(json.dumps({**entry, "phase": phase}) + "\n")
    return last


def _outputs(stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    from turnforge.train.grpo import METRICS_FILE, MODEL_DIR, ROLLOUTS_FILE

    model_dir = stage_dir / MODEL_DIR
    out = {"model": ctx.relative(model_dir), "adapter": (model_dir / "adapter_config.json").exists()}
    for key, name in (("metrics", METRICS_FILE), ("rollouts", ROLLOUTS_FILE)):
        if (stage_dir / name).exists():
            out[key] = ctx.relative(stage_dir / name)
    return out


def _env_option_names(env: str) -> set[str]:
    from turnforge.envs.base import get_env_spec

    return {opt.name for opt in get_env_spec(env).options}
