"""The run directory: its file names, its owner, the one process that uses it at a time, and `read_run` for what
reads it back.

A run directory belongs to the kind of command that made it: `OWNER_FILE` says which ("recipe": `turnforge run`
and `quickstart`; "eval": `turnforge eval`, and the folders of a recipe's rollout stages; "compare": `turnforge
report --compare`). Another kind is refused before it writes anything, so that an eval never overwrites a recipe
run's summary.json, nor the other way round, nor a comparison a run's report.
A folder of an older version, without the record, is recognised by its files.

A run directory is used by one process at a time (design.md §7): `with locked(out, kind):` holds `OUT/.lock`.

The lock is an advisory `flock` on that file, so the operating system drops it when its process dies: a lock
left by a killed run is simply taken over by the next one, with nothing to clean up. The file says which
process holds it, for the message the second process prints. Under `accelerate launch` the main process holds
it for all of them (`turnforge.launch`); the others wait for its outcome and fail with it.
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

from turnforge.launch import main_process_result

LOCK_FILE = ".lock"
OWNER_FILE = "owner.json"
CONFIG_FILE = "config.toml"
STAGES_DIR = "stages"
STAGE_FILE = "stage.json"
DONE_FILE = "done.json"
SUMMARY_FILE = "summary.json"
RUN_FILE = "run.json"  # an eval's identity (rollouts_file.py)
EPISODES_FILE = "episodes.jsonl"
MODELS_DIR = "models"  # OUT/models/tiny: the offline tiny model, built on first use (a recipe's or an eval's)
TRAINING_KINDS = ("sft", "rft", "dpo", "grpo", "envtune")
OWNERS = {
    "recipe": "`turnforge run` (or `quickstart`)",
    "eval": "`turnforge eval`",
    "compare": "`turnforge report --compare`",
}
"""Owner kind -> the command that writes such a run directory, as messages name it."""


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


def check_outside_runs(out: Path) -> None:
    """An `--out` given on the command line is not inside a folder that a command owns (a run, an eval, a
    comparison, at any depth: `runs/mini/stages`, `runs/mini/eval/expert`): what it wrote there would mix with that
    command's files and overwrite them. Only the owner record counts here (`OWNER_FILE`), not the files an older
    version's folder is recognised by: a `config.toml` in a working folder makes no run of it. The commands' own
    folders inside a run (its stages, its evals) are made by the run itself, which does not come through here."""
    for parent in Path(out).absolute().parents:
        owner = recorded_owner(parent)
        if owner is not None:
            shown = parent if Path(out).is_absolute() else os.path.relpath(parent)  # as --out was written
            raise ValueError(f"--out {out} is inside {shown}, which holds the results of {OWNERS[owner]}; give a "
                             "path outside it")


def recorded_owner(folder: Path) -> str | None:
    """The kind of command that `folder`'s owner record names (a key of `OWNERS`), or None."""
    try:
        kind = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in OWNERS else None


def owner_of(out: Path) -> str | None:
    """The kind of command `out` belongs to (a key of `OWNERS`: "recipe", "eval", "compare"), or None for a new or
    foreign folder."""
    kind = recorded_owner(out)
    if kind is not None:
        return kind
    # An older version wrote no owner record: its files say whose the folder is.
    if (out / CONFIG_FILE).is_file() or (out / STAGES_DIR).is_dir():
        return "recipe"
    if (out / RUN_FILE).is_file() or (out / EPISODES_FILE).is_file():
        return "eval"
    return None


def check_owner(out: Path, kind: str) -> None:
    """Refuse (ValueError) an `out` that another kind of command made: it would overwrite that run's files."""
    owner = owner_of(out)
    if owner is not None and owner != kind:
        raise ValueError(f"{out} holds the results of {OWNERS[owner]}, which {OWNERS[kind]} would overwrite; give another --out")


@contextmanager
def locked(out: str | Path, kind: str) -> Iterator[Path]:
    """Create `out` if needed, hold its lock and record `kind` as its owner; a second process fails at once, saying
    who holds it, and a folder of another kind of command is refused before anything is written in it."""
    out = Path(out)
    check_out_dir(out)
    held: list = []
    main_process_result(lambda: held.append(_acquire(out, kind)))  # the other launched processes hold nothing
    try:
        yield out
    finally:
        for handle in held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _acquire(out: Path, kind: str):
    """The open, flock-ed lock file of `out` (a ValueError naming the holder when another process has it, or the
    command that owns `out` when it is another kind)."""
    check_owner(out, kind)  # checked here, just before the folder is made: the callers also check it early
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
    claim(out, kind)
    return handle


def claim(out: Path, kind: str) -> None:
    """Record `kind` as the owner of the existing folder `out` (checked with `check_owner` first)."""
    if not (out / OWNER_FILE).exists():
        (out / OWNER_FILE).write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")


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
    """A finished `turnforge run` directory, whose summary.json the report, card and viewer read (an eval's --out
    has a summary.json too, but is owned by `turnforge eval`; a killed run has none yet)."""
    return path.is_dir() and owner_of(path) == "recipe" and (path / SUMMARY_FILE).is_file() and (path / CONFIG_FILE).is_file()


def read_run(run_dir: str | Path) -> RunFiles:
    """The run directory `run_dir` (summary.json + config.toml); a clear error (ValueError, FileNotFoundError) when
    it is none, or when its summary.json is cut short, edited or another command's."""
    run_dir = Path(run_dir)
    summary_file = run_dir / SUMMARY_FILE
    if owner_of(run_dir) == "eval":
        raise ValueError(
            f"{run_dir} holds the results of {OWNERS['eval']} (which printed them), not of a recipe run; "
            f"give the --out of {OWNERS['recipe']}"
        )
    if not is_run_dir(run_dir):
        raise FileNotFoundError(
            f"{run_dir} is not a finished run directory (no {SUMMARY_FILE} or {CONFIG_FILE}); "
            "give the --out of a `turnforge run`, or finish the run first"
        )
    redo = f"re-run the `turnforge run` command that made {run_dir} to write it again"
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{summary_file} is not valid JSON ({e}): cut short or edited; {redo}") from None
    problem = run_summary_problem(summary)
    if problem:
        raise ValueError(f"{summary_file} is no recipe run's summary: {problem}; {redo}")
    return RunFiles(run_dir, summary, (run_dir / CONFIG_FILE).read_text(encoding="utf-8"))


def read_eval(eval_dir: str | Path) -> dict[str, Any]:
    """The summary.json of a `turnforge eval` folder (its --out); a clear error (ValueError, FileNotFoundError) when
    it has none yet, or when it is cut short, edited or not an evaluation's."""
    eval_dir = Path(eval_dir)
    summary_file = eval_dir / SUMMARY_FILE
    redo = f"re-run the `turnforge eval` command that made {eval_dir} (it resumes) to write it again"
    if not summary_file.is_file():
        raise FileNotFoundError(f"{eval_dir} has no {SUMMARY_FILE}: its `turnforge eval` did not finish; {redo}")
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{summary_file} is not valid JSON ({e}): cut short or edited; {redo}") from None
    lacking = [key for key in EVAL_KEYS_READ if key not in summary] if isinstance(summary, dict) else list(EVAL_KEYS_READ)
    if lacking:
        raise ValueError(f"{summary_file} is no evaluation's summary: it has no {', '.join(map(repr, lacking))}; {redo}")
    return summary


RUN_SUMMARY_KEYS = ("recipe", "model", "eval", "stages")
STAGE_KEYS = ("kind", "dir", "status", "wall_s", "result")
EVAL_KEYS_READ = (
    "env", "split", "policy", "samples_per_task", "n_episodes", "success", "success_ci", "pass@k", "pass^k",
    "mean_reward", "mean_progress", "mean_turns", "stop_reasons", "by_category",
)  # fmt: skip
"""The keys of an evaluation's summary that the report and the model card read."""


def run_summary_problem(summary: Any) -> str | None:
    """What makes `summary` unreadable as a recipe run's summary.json (None when nothing does)."""
    if not isinstance(summary, dict):
        return f"it holds a JSON {type(summary).__name__}, not an object"
    missing = [key for key in RUN_SUMMARY_KEYS if key not in summary]
    if missing:
        foreign = " (it is the summary of a `turnforge eval`)" if "n_episodes" in summary else ""
        return f"it has no {', '.join(map(repr, missing))}{foreign}"
    for table, keys in (("stages", STAGE_KEYS), ("eval", EVAL_KEYS_READ)):
        if not isinstance(summary[table], dict):
            return f"{table!r} is not an object"
        for name, entry in summary[table].items():
            lacking = [key for key in keys if key not in entry] if isinstance(entry, dict) else list(keys)
            if lacking:
                return f"{table}.{name} has no {', '.join(map(repr, lacking))}"
            if table == "stages" and not isinstance(entry["result"], dict):
                return f"stages.{name}.result is not an object"
    return None
