"""Environment Tuning (arXiv 2510.10197): GRPO through a curriculum of phases, each from the model the one
before wrote.

A phase has its own tasks, env options (hints on: actionable corrections instead of vague failures), reward
weights and length. The last phase runs without hints, so that the model learns to do without them (the envtune
stage refuses a last phase with hints on, and turns them off there when the env has the option).

    out_dir/PP-<phase>/   each phase's model/, metrics.jsonl, rollouts.jsonl (as `run_grpo` writes them)
    out_dir/metrics.jsonl every phase's metrics, steps numbered on across phases, with a "phase" key
    out_dir/model/        the last phase's model

A killed curriculum resumes at the first phase without its `model/` folder.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.launch import is_main_process, wait_for_everyone
from turnforge.train.grpo import run_grpo
from turnforge.train.settings import METRICS_FILE, MODEL_DIR, GRPOSettings
from turnforge.types import Task


@dataclass
class Phase:
    """One phase of the curriculum: its tasks, the env options they are played with, and its GRPO settings."""

    name: str
    tasks: list[Task]
    env_options: dict[str, Any]
    settings: GRPOSettings


def run_curriculum(model: str, adapter: str | None, env: str, phases: list[Phase], out_dir: Path) -> list[dict[str, Any]]:
    """Train `model` (+ `adapter`) through `phases` in order, in env `env`; returns one result per phase."""
    out_dir = Path(out_dir)
    combined = out_dir / METRICS_FILE
    writes = is_main_process()  # under `accelerate launch` every process trains, the main one writes
    if writes:
        combined.unlink(missing_ok=True)
    results, offset = [], 0
    for k, phase in enumerate(phases):
        phase_dir = out_dir / f"{k + 1:02d}-{phase.name}"
        head = {"phase": phase.name, "tasks": len(phase.tasks), "hints": phase.env_options.get("hints")}
        if not (phase_dir / MODEL_DIR / "config.json").exists():
            result = run_grpo(model, env, phase.env_options, phase.tasks, phase_dir, phase.settings, adapter)
            results.append({**head, **result})
        else:
            results.append({**head, "resumed": True})
        if writes:
            offset = append_metrics(phase_dir / METRICS_FILE, combined, offset, phase.name)
        model, adapter = str(phase_dir / MODEL_DIR), None
    if writes:
        final = out_dir / MODEL_DIR
        if final.exists():
            shutil.rmtree(final)
        shutil.copytree(model, final)
    wait_for_everyone()
    return results


def append_metrics(source: Path, combined: Path, offset: int, phase: str) -> int:
    """Append a phase's metrics.jsonl to the stage's, steps shifted by `offset`; returns the next offset."""
    last = offset
    if source.exists():
        with combined.open("a", encoding="utf-8") as out:
            for line in source.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                entry["step"] = last = offset + int(entry["step"])
                out.write(json.dumps({**entry, "phase": phase}) + "\n")
    return last
