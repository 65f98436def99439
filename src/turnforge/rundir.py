"""The run directory: its file names, the one process that uses it at a time, and `read_run` for what reads it back.

A run directory is used by one process at a time (design.md §7): `with locked(out):` holds `OUT/.lock`.

The lock is an advisory `flock` on that file, so the operating system drops it when its process dies: a lock
left by a killed run is simply taken over by the next one, with nothing to clean up. The file says which
process holds it, for the message the second process prints. Under `accelerate launch` the main process holds
it for all of them (`turnforge.scale.processes`); the others wait for its outcome and fail with it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.scale.processes import main_process_result

LOCK_FILE = ".lock"
CONFIG_FILE = "config.toml"
STAGE_FILE = "stage.json"
DONE_FILE = "done.json"
SUMMARY_FILE = "summary.json"
MODELS_DIR = "models"  # OUT/models/tiny: the offline tiny model, built on first use (a recipe's or an eval's)
TRAINING_KINDS = ("sft", "rft", "dpo", "grpo", "envtune")


def check_out_dir(out: Path) -> None:
    """An output folder must be a folder (or not exist yet, under folders only)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; give a folder for the run's results")
    check_out_parents(out)


def check_out_parents(out: Path) -> None:
    """Nothing can be written under a file: `--out notes.txt/run` is refused at once, naming the file (mkdir would
    fail later with a bare NotADirectoryError)."""
    for parent in Path(out).parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"--out {out} is inside {parent}, which is a file, not a folder; give a path outside it")
            return


@contextmanager
def locked(out: str | Path) -> Iterator[Path]:
    """Create `out` if needed and hold its lock; a second process fails at once, saying who holds it."""
    out = Path(out)
    check_out_dir(out)
    held: list = []
    main_process_result(lambda: held.append(_acquire(out)))  # the other launched processes hold nothing
    try:
        yield out
    finally:
        for handle in held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _acquire(out: Path):
    """The open, flock-ed lock file of `out` (a ValueError naming the holder when another process has it)."""
    out.mkdir(parents=True, exist_ok=True)
    handle = (out / LOCK_FILE).open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(
            f"{out} is in use by {holder}; wait for it to finish, or give another --out"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"turnforge pid {os.getpid()}\n")
    handle.flush()
    return handle


@dataclass
class RunFiles:
    """A finished (or resumed) run directory as the report, the model card and the viewer read it."""

    dir: Path
    summary: dict[str, Any]
    """summary.json: {"recipe", "model", "eval": {name: summary}, "stages": {id: {kind, dir, status, wall_s, result}}}."""
    recipe_toml: str

    def path(self, relative: str) -> Path:
        """A path written in done.json (relative to the run directory; absolute ones stay as they are)."""
        return self.dir / relative

    def eval_episodes(self) -> dict[str, Path]:
        """Eval name -> its episodes.jsonl, in recipe order (those that exist)."""
        out = {}
        for stage in self.summary["stages"].values():
            summary = stage["result"].get("summary") if stage["kind"] == "eval" else None
            if summary and (self.path(summary).parent / "episodes.jsonl").exists():
                out[self.path(summary).parent.name] = self.path(summary).parent / "episodes.jsonl"
        return out

    def final_model(self) -> tuple[str, Path, bool] | None:
        """(stage id, folder, is an adapter) of the last training stage that saved a model of its own; None if none."""
        for stage_id, stage in reversed(self.summary["stages"].items()):
            result = stage["result"]
            model = result.get("model")
            # a stage that kept the model it started from (RFT with nothing kept) names a model outside its folder
            if stage["kind"] in TRAINING_KINDS and model and self.path(model).is_relative_to(self.path(stage["dir"])):
                return stage_id, self.path(model), bool(result.get("adapter"))
        return None


def is_run_dir(path: Path) -> bool:
    """A finished `turnforge run` directory (an eval's --out has a summary.json too, but no config.toml)."""
    return (path / SUMMARY_FILE).is_file() and (path / CONFIG_FILE).is_file()


def read_run(run_dir: str | Path) -> RunFiles:
    """The run directory `run_dir` (summary.json + config.toml); a clear error when it is none."""
    run_dir = Path(run_dir)
    summary_file = run_dir / SUMMARY_FILE
    if not is_run_dir(run_dir):
        raise FileNotFoundError(
            f"{run_dir} is not a finished run directory (no {SUMMARY_FILE} or {CONFIG_FILE}); "
            "give the --out of a `turnforge run`, or finish the run first"
        )
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    return RunFiles(run_dir, summary, (run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
