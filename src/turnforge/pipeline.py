"""Run a recipe: its stages in order, in one run directory, resumable (design.md §7).

    turnforge run recipes/quickstart.toml --out runs/qs
    turnforge run recipes/alfworld_sft.toml --model Qwen/Qwen3-4B-Instruct-2507 --out runs/alf

The run directory:

    config.toml              the resolved recipe (after --model / --set), rewritten by each invocation
    stages/NN-<id>/          one folder per stage, numbered from 01 in recipe order
      stage.json             written when the stage starts: its inputs and their hash
      done.json              written last, atomically: the hash, the result, the wall time
      trajectories.jsonl     (collect) one Trajectory JSON line per episode
      model/, metrics.jsonl  (sft) the trained model and the training log
    eval/<name>/             (eval) episodes.jsonl + summary.json, as `turnforge eval` writes them
    models/tiny/             the offline tiny model, when [model] name = "tiny"
    summary.json             {"recipe", "model", "eval": {name: summary}, "stages": {id: {...}}, "wall_s"}
    report.md, report.html   the report (evaluations per category, failure modes, stage timings, curves, the recipe)
    plots/                   the learning curves (loss, reward, success, KL, entropy per step)
    stages/NN-<id>/model/README.md   the Hugging Face model card of the final model (`turnforge.card`)

Resuming: re-running the same command skips every stage that has done.json; a stage without it runs
again, keeping what a killed run left (finished episodes of collect and eval stages, SFT checkpoints).
A stage's inputs are its own config plus whatever it reads (the env for rollouts, the base model, the
hashes of the stages whose model or data it uses). When a finished or started stage's inputs changed,
the run stops before anything runs and says what changed: `--restart-from ID` redoes that stage and every
later one; another --out starts afresh. Stages added at the end of a finished recipe simply run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from turnforge.card import write_final_card
from turnforge.envs.base import check_task_count
from turnforge.launch import is_main_process, launched, main_process_result, wait_for_everyone
from turnforge.machine import machine_info
from turnforge.recipes import Recipe, load_recipe
from turnforge.report import comparison_table, write_report
from turnforge.rundir import (
    CONFIG_FILE,
    DONE_FILE,
    STAGE_FILE,
    STAGES_DIR,
    SUMMARY_FILE,
    check_out_dir,
    check_owner,
    locked,
)
from turnforge.stages import EVAL_DIR, RunContext, stage_folder, stage_kind
from turnforge.stages.config import PlaysEnv, StageConfig, TrainStage


@dataclass
class StagePlan:
    """One stage as this run will see it: where it lives and the hash of its inputs."""

    index: int
    stage: StageConfig
    dir: Path
    inputs: dict[str, Any]
    hash: str

    @property
    def label(self) -> str:
        return self.dir.name


def run_recipe(
    recipe: Recipe | str | Path,
    out_dir: str | Path,
    restart_from: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run (or resume) `recipe` in `out_dir`; writes summary.json and report.md and returns the summary.

    Raises ValueError (a RecipeError for the recipe itself) before any stage runs when the recipe is
    invalid or a finished stage's inputs changed.
    """
    # Under `accelerate launch` every process runs this; the main one speaks and writes (launch.py).
    console = console or Console(quiet=not is_main_process())
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    out = Path(out_dir)
    check_out_dir(out)
    check_owner(out, "recipe")  # an eval's folder is refused before anything is planned or written
    plans = plan_stages(recipe, out)
    check_task_counts(recipe, plans)
    if restart_from is None:
        check_resumable(plans)  # before the folder is made: a refused run leaves nothing behind
    with locked(out, "recipe"):  # one process per run dir (a restart deletes stage folders: under the lock too)
        if restart_from is not None:
            main_process_result(lambda: restart(plans, restart_from, out, console))
            check_task_counts(recipe, plans)  # the restarted stages too
            check_resumable(plans)
        _warn_foreign_folders(plans, out, console)
        return _run_plans(recipe, plans, out, console)


def _run_plans(recipe: Recipe, plans: list, out: Path, console: Console) -> dict[str, Any]:
    if is_main_process():
        (out / CONFIG_FILE).write_text(recipe.to_toml(), encoding="utf-8")

    started = time.perf_counter()
    ctx = RunContext(recipe, out)
    if launched() and any("model" in p.inputs for p in plans):
        ctx.share_base_model()  # built once, by the main process, before any stage needs it
    stages = {plan.stage.id: _run_stage(plan, len(plans), ctx, console) for plan in plans}
    summary = {
        "recipe": recipe.name,
        "description": recipe.description,
        "model": recipe.model.name,
        # Built or located in this invocation, when a stage needed it (the tiny model is built once per run dir).
        "base_model_s": None if ctx.base_build_s is None else round(ctx.base_build_s, 3),
        "eval": _eval_summaries(recipe, out),
        "stages": stages,
        "wall_s": round(time.perf_counter() - started, 3),
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
    }
    if is_main_process():
        _write_json(out / SUMMARY_FILE, summary)
        write_report(out)
        card = write_final_card(out)
        if card is not None:
            console.print(f"model card: {card}")
    return summary


def plan_stages(recipe: Recipe, out: Path) -> list[StagePlan]:
    """Every stage with its folder and input hash, in order (a stage's hash covers the stages it reads)."""
    plans: list[StagePlan] = []
    hashes: dict[str, str] = {}
    for index, stage in enumerate(recipe.stages):
        inputs = stage_inputs(recipe, index, hashes)
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
        hashes[stage.id] = digest
        plans.append(StagePlan(index, stage, out / stage_folder(index, stage.id), inputs, digest))
    return plans


def stage_inputs(recipe: Recipe, index: int, hashes: dict[str, str]) -> dict[str, Any]:
    """What a stage's results depend on: its config, the env (rollouts), the model and data it reads."""
    stage = recipe.stages[index]
    inputs: dict[str, Any] = {"stage": stage.hash_inputs()}
    if isinstance(stage, PlaysEnv):
        name, options = recipe.stage_env(stage)
        inputs["env"] = {"name": name, "options": options}
    reads = [s for s in recipe.data_sources(index) if s in hashes]
    if isinstance(stage, TrainStage) or getattr(stage, "policy", None) == "hf":
        source = recipe.model_source(index)
        if source is None:
            fields = {"name"} if isinstance(stage, TrainStage) else {"name", "dtype"}
            if recipe.model.family is not None:  # out of the hash unset: runs made before it keep their stages
                fields.add("family")
            inputs["model"] = recipe.model.model_dump(mode="json", include=fields)
        else:
            reads.append(source)
    if hasattr(stage, "model_reads"):  # more models than its start model (distill: its teacher)
        reads += stage.model_reads(recipe.stages[:index])
    inputs["reads"] = {source: hashes[source] for source in reads}
    return inputs


def check_task_counts(recipe: Recipe, plans: list[StagePlan]) -> None:
    """Refuse a stage's `tasks` beyond its split before any stage runs (a finished stage is not asked again)."""
    for plan in plans:
        limit = getattr(plan.stage, "tasks", None)
        if limit is None or not isinstance(plan.stage, PlaysEnv) or (plan.dir / DONE_FILE).exists():
            continue
        name, options = recipe.stage_env(plan.stage)
        try:
            check_task_count(name, plan.stage.split, limit, **options)
        except ValueError as e:
            raise ValueError(f"stage {plan.stage.id}: {e}") from None


def check_resumable(plans: list[StagePlan]) -> None:
    """Refuse to mix: a stage whose folder holds work done with other inputs stops the run (ValueError)."""
    problems, first = [], None
    for plan in plans:
        done = _read_json(plan.dir / DONE_FILE)
        started = _read_json(plan.dir / STAGE_FILE)
        recorded = done or started
        if recorded is None or recorded.get("hash") == plan.hash:
            continue
        first = first or plan.stage.id
        before = (started or {}).get("inputs", {})
        what = "finished" if done else "was started"
        problems.append(
            f"stage {plan.label} {what} with other inputs ({describe_changes(before, plan.inputs)})"
        )
    if problems:
        raise ValueError(
            "; ".join(problems)
            + f". Re-run with --restart-from {first} to redo it and every later stage, or use another --out"
        )


def describe_changes(before: dict[str, Any], now: dict[str, Any]) -> str:
    """Say what changed, e.g. "learning_rate: 0.001 -> 0.0001; reads collect, which changed" (5 items at most)."""
    old, new = _flatten(before), _flatten(now)
    changes = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        if key.startswith("reads."):
            changes.append(f"reads {key.removeprefix('reads.')}, which changed")
        else:
            name = key.removeprefix("stage.")
            changes.append(f"{name}: {old.get(key, 'unset')!r} -> {new.get(key, 'unset')!r}")
    if not changes:
        return "its record is from another version of the recipe"
    return "; ".join(changes[:5]) + ("; ..." if len(changes) > 5 else "")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def restart(plans: list[StagePlan], ref: str, out: Path, console: Console) -> None:
    """Delete the work of stage `ref` (id, name, number or folder) and of every stage after it."""
    matches = [p for p in plans if ref in (p.stage.id, p.label, str(p.index + 1), f"{p.index + 1:02d}")]
    if not matches:
        matches = [p for p in plans if p.stage.name == ref]
    if len(matches) != 1:
        raise ValueError(
            f"--restart-from {ref!r} names no single stage; stages: {', '.join(p.stage.id for p in plans)}"
        )
    for plan in plans[matches[0].index :]:
        targets = [plan.dir]
        if plan.stage.kind == "eval":
            targets.append(out / EVAL_DIR / plan.stage.name)
        for target in targets:
            if target.exists():
                shutil.rmtree(target)
                console.print(f"removed {target}")


def _run_stage(plan: StagePlan, total: int, ctx: RunContext, console: Console) -> dict[str, Any]:
    stage = plan.stage
    where = f"[{plan.index + 1}/{total}] {plan.label}"
    done = _read_json(plan.dir / DONE_FILE)
    wait_for_everyone()  # every launched process has read done.json before the main one may write it
    status = "skipped"
    if done is not None:
        console.print(f"{where}: finished earlier, skipped")
    else:
        status = "ran"
        console.print(f"{where}: {stage.kind} ...")
        if is_main_process():
            plan.dir.mkdir(parents=True, exist_ok=True)
            _write_json(plan.dir / STAGE_FILE, {"id": stage.id, "hash": plan.hash, "inputs": plan.inputs})
        started = time.perf_counter()
        run = stage_kind(stage.kind).run
        try:
            if isinstance(stage, TrainStage):  # every launched process: TRL's trainer spreads the steps over them
                result = run(stage, plan.index, plan.dir, ctx)
            else:  # rollouts, evaluation: the main process alone, the others wait for its result
                result = main_process_result(lambda: run(stage, plan.index, plan.dir, ctx))
        except KeyboardInterrupt:
            if is_main_process():
                print(f"interrupted in {where}: {resume_note(plan)}", file=sys.stderr)
            raise
        done = {
            "id": stage.id,
            "kind": stage.kind,
            "hash": plan.hash,
            "wall_s": round(time.perf_counter() - started, 3),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "result": result,
        }
        if is_main_process():
            _write_json(plan.dir / DONE_FILE, done)
        console.print(f"{where}: done in {done['wall_s']:.1f} s")
    ctx.registered(stage.id, done["result"])
    return {
        "kind": stage.kind,
        "dir": str(plan.dir.relative_to(ctx.out_dir)),
        "status": status,
        "wall_s": done["wall_s"],
        "result": done["result"],
    }


def resume_note(plan: StagePlan) -> str:
    """What re-running the same command keeps of an interrupted stage (said on Ctrl-C, so a user knows to re-run)."""
    kept = "finished stages are kept; the same command resumes"
    if not isinstance(plan.stage, TrainStage):
        return f"{kept} (this stage's finished episodes are kept too)"
    # Imported here: it imports transformers, which `--check` and scripted stages do without.
    from turnforge.train.runtime import CHECKPOINT_DIR, last_complete_checkpoint

    checkpoint = last_complete_checkpoint(plan.dir / CHECKPOINT_DIR)
    if checkpoint is None:
        return f"{kept}, this stage from its first step (it saved no checkpoint yet; save_steps sets how often)"
    return f"{kept}, this stage from {checkpoint}"


def _eval_summaries(recipe: Recipe, out: Path) -> dict[str, dict[str, Any]]:
    return {
        s.name: json.loads((out / EVAL_DIR / s.name / "summary.json").read_text(encoding="utf-8"))
        for s in recipe.stages
        if s.kind == "eval"
    }


def _warn_foreign_folders(plans: list[StagePlan], out: Path, console: Console) -> None:
    """Stage folders of another recipe version (a stage removed or moved) are left alone, and named."""
    stages_dir = out / STAGES_DIR
    if not stages_dir.is_dir():
        return
    known = {p.dir.name for p in plans}
    for folder in sorted(stages_dir.iterdir()):
        if folder.name not in known:
            console.print(f"[yellow]note:[/] {folder} is no stage of this recipe; left as it is")


def print_comparison(summary: dict[str, Any], console: Console | None = None) -> None:
    """The run's evaluations side by side (base vs sft ...), when it has any; a row gives each one's do-nothing
    floor where its env computes one (the service env; `report.comparison_rows`)."""
    if summary["eval"]:
        table = comparison_table(summary["eval"], title=f"{summary['recipe']}: evaluation")
        (console or Console()).print(table)


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None  # cut short by a kill: as if absent (done.json is written atomically, so not that one)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomic: a kill leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
