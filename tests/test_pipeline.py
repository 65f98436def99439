"""The pipeline: stages in order in one run directory; re-running resumes and never redoes finished work."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.eval.metrics import SUMMARY_KEYS
from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe
from turnforge.types import Trajectory

# Scripted policies only: runs in a second, without the model code.
SCRIPTED = """\
name = "scripted"

[env]
name = "household"

[[stages]]
kind = "collect"
tasks = 6

[[stages]]
kind = "eval"
name = "random"
policy = "random"
tasks = 6
samples = 2

[[stages]]
kind = "eval"
name = "expert"
policy = "expert"
tasks = 6
"""


def _quiet() -> Console:
    return Console(quiet=True)


def _run(recipe: Path, out: Path, overrides=(), **kw) -> dict:
    return run_recipe(load_recipe(recipe, overrides=list(overrides)), out, console=_quiet(), **kw)


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "scripted.toml"
    path.write_text(SCRIPTED)
    return path


def _episodes(path: Path) -> list[Trajectory]:
    return [Trajectory.from_json(line) for line in path.read_text().splitlines()]


def test_a_run_writes_the_run_directory(recipe, tmp_path):
    out = tmp_path / "run"
    summary = _run(recipe, out)

    assert json.loads((out / "summary.json").read_text()) == summary
    assert set(summary) >= {"eval", "stages", "wall_s"}
    assert list(summary["eval"]) == ["random", "expert"]
    assert (
        list(summary["eval"]["expert"]) == list(SUMMARY_KEYS) and summary["eval"]["expert"]["success"] == 1.0
    )
    assert summary["eval"]["random"]["n_episodes"] == 12
    assert list(summary["stages"]) == ["collect", "eval-random", "eval-expert"]
    assert {s["status"] for s in summary["stages"].values()} == {"ran"}

    collect = out / "stages/01-collect"
    assert len(_episodes(collect / "trajectories.jsonl")) == 6 and not (collect / "episodes.jsonl").exists()
    done = json.loads((collect / "done.json").read_text())
    assert (
        done["result"]["episodes"] == 6
        and done["result"]["trajectories"] == "stages/01-collect/trajectories.jsonl"
    )
    for name, folder in (("random", "02-eval-random"), ("expert", "03-eval-expert")):
        assert (out / "stages" / folder / "done.json").exists()
        assert (out / "eval" / name / "episodes.jsonl").exists()
    assert load_recipe(out / "config.toml").to_dict() == load_recipe(recipe).to_dict()
    report = (out / "report.md").read_text()
    assert "| success (95% CI) |" in report and "`stages/02-eval-random`" in report and "```toml" in report


def test_a_rerun_skips_every_finished_stage(recipe, tmp_path):
    out = tmp_path / "run"
    first = _run(recipe, out)
    files = {p: p.read_bytes() for p in out.rglob("*.jsonl")}
    second = _run(recipe, out)
    assert {s["status"] for s in second["stages"].values()} == {"skipped"}
    assert {p: p.read_bytes() for p in out.rglob("*.jsonl")} == files
    assert second["eval"] == first["eval"]


def test_a_killed_run_resumes_without_redoing_finished_work(recipe, tmp_path):
    out = tmp_path / "run"
    _run(recipe, out)
    # What a kill during the last stage leaves: no done.json, 3 finished episodes and half of the 4th.
    last = out / "stages/03-eval-expert"
    (last / "done.json").unlink()
    episodes = out / "eval/expert/episodes.jsonl"
    lines = episodes.read_text().splitlines(keepends=True)
    episodes.write_text("".join(lines[:3]) + lines[3][:100])
    collect_before = (out / "stages/01-collect/trajectories.jsonl").read_bytes()

    with pytest.warns(RuntimeWarning, match="unfinished last line"):
        summary = _run(recipe, out)

    assert [s["status"] for s in summary["stages"].values()] == ["skipped", "skipped", "ran"]
    resumed = episodes.read_text().splitlines(keepends=True)
    assert resumed[:3] == lines[:3] and len(resumed) == 6  # the 3 finished episodes were kept, not redone
    assert (out / "stages/01-collect/trajectories.jsonl").read_bytes() == collect_before
    assert summary["eval"]["expert"]["n_episodes"] == 6 and (last / "done.json").exists()


def test_a_collect_stage_killed_mid_way_keeps_its_episodes(recipe, tmp_path):
    out = tmp_path / "run"
    _run(recipe, out)
    collect = out / "stages/01-collect"
    (collect / "done.json").unlink()
    trajectories = collect / "trajectories.jsonl"
    lines = trajectories.read_text().splitlines(keepends=True)
    trajectories.unlink()  # killed before the rename: the episodes are still in episodes.jsonl
    (collect / "episodes.jsonl").write_text("".join(lines[:4]))

    summary = _run(recipe, out)
    assert summary["stages"]["collect"]["status"] == "ran"
    assert trajectories.read_text().splitlines(keepends=True)[:4] == lines[:4]
    assert len(_episodes(trajectories)) == 6


def test_a_changed_finished_stage_stops_the_run_until_restarted(recipe, tmp_path):
    out = tmp_path / "run"
    _run(recipe, out)
    config = (out / "config.toml").read_text()
    with pytest.raises(ValueError) as info:
        _run(recipe, out, overrides=["stages.random.samples=3"])
    message = str(info.value)
    assert "stage 02-eval-random finished with other inputs (samples: 2 -> 3)" in message
    assert "--restart-from eval-random" in message
    assert (out / "config.toml").read_text() == config  # nothing ran, nothing was rewritten

    collect = (out / "stages/01-collect/trajectories.jsonl").read_bytes()
    summary = _run(recipe, out, overrides=["stages.random.samples=3"], restart_from="eval-random")
    assert [s["status"] for s in summary["stages"].values()] == ["skipped", "ran", "ran"]
    assert summary["eval"]["random"]["n_episodes"] == 18
    assert (out / "stages/01-collect/trajectories.jsonl").read_bytes() == collect


def test_an_env_change_is_a_change_of_every_rollout_stage(recipe, tmp_path):
    out = tmp_path / "run"
    _run(recipe, out)
    with pytest.raises(
        ValueError, match=r"01-collect finished with other inputs \(env.options.hints: 'unset' -> True"
    ):
        _run(recipe, out, overrides=["env.options.hints=true"])


def test_a_stage_added_at_the_end_runs_alone(recipe, tmp_path):
    out = tmp_path / "run"
    _run(recipe, out)
    recipe.write_text(
        SCRIPTED
        + '\n[[stages]]\nkind = "eval"\nname = "valid"\npolicy = "expert"\nsplit = "valid_seen"\ntasks = 3\n'
    )
    summary = _run(recipe, out)
    assert [s["status"] for s in summary["stages"].values()] == ["skipped", "skipped", "skipped", "ran"]
    assert summary["eval"]["valid"]["split"] == "valid_seen"


def test_restart_from_an_unknown_stage_is_an_error(recipe, tmp_path):
    with pytest.raises(ValueError, match="--restart-from 'nope' names no single stage"):
        _run(recipe, tmp_path / "run", restart_from="nope")


def test_cli_run_prints_the_comparison_and_writes_the_summary(recipe, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(recipe), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "[1/3] 01-collect" in result.output and "success (95% CI)" in result.output
    assert (out / "summary.json").exists() and (out / "report.md").exists()


MODEL_CODE = ("turnforge.train.sft", "turnforge.models", "turnforge.policies.hf")


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in MODEL_CODE), reason="needs the model and training code"
)
def test_the_quickstart_end_to_end_on_a_tiny_budget(quickstart_run):
    out, summary = quickstart_run

    assert (out / "stages/02-sft/model/config.json").exists()
    assert set(summary["eval"]) == {"base", "sft", "rft", "grpo"}
    for name in ("base", "sft", "rft", "grpo"):
        assert summary["eval"][name]["n_episodes"] == 6 and summary["eval"][name]["policy"] == "hf"
    assert summary["stages"]["sft"]["result"]["steps"] == 2
    assert summary["stages"]["rft"]["result"]["yield"]["sampled"] == 6  # two steps of SFT: nothing kept
    assert summary["stages"]["grpo"]["result"]["steps"] == 1
    assert (out / "plots/sft_loss.png").stat().st_size > 0
    assert "![sft training loss](plots/sft_loss.png)" in (out / "report.md").read_text()
    assert (out / "report.html").exists() and (out / "stages/07-grpo/model/README.md").exists()  # the model card
    again = run_recipe(load_recipe(out / "config.toml"), out, console=_quiet())  # the resolved recipe, as run
    assert {s["status"] for s in again["stages"].values()} == {"skipped"}


KILL_RECIPE = """\
[model]
name = "tiny"

[env]
name = "household"

[env.options]
receptacles = 0.3
distractors = 0

[[stages]]
kind = "collect"
policy = "expert"
split = "train"
tasks = 40

[[stages]]
kind = "sft"
data = ["collect"]
max_steps = 300
batch_size = 4
max_length = 512
learning_rate = 3e-3
logging_steps = 1
save_steps = 5
"""


@pytest.mark.slow
def test_twenty_sigkills_during_sft_resume_to_the_same_loss_curve(tmp_path):
    """Issue 17's kill loop for training: SIGKILL `turnforge run` at random moments 20 times (collect and SFT),
    resuming each time from the last checkpoint; the finished run's loss curve equals an uninterrupted run's."""
    import random
    import signal
    import subprocess
    import sys
    import time

    recipe = tmp_path / "kill.toml"
    recipe.write_text(KILL_RECIPE)
    cli = [sys.executable, "-c", "from turnforge.cli import app; app()", "run", str(recipe)]
    out, reference = tmp_path / "killed", tmp_path / "reference"
    rng, kills = random.Random(1), 0
    while kills < 20:
        proc = subprocess.Popen([*cli, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(4.0, 9.0))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    for run in (out, reference):
        done = subprocess.run([*cli, "--out", str(run)], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-2000:]

    def losses(run):
        lines = (run / "stages" / "02-sft" / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}

    killed, clean = losses(out), losses(reference)
    assert sorted(killed) == sorted(clean) == list(range(1, 301)), (kills, sorted(killed))
    assert all(abs(killed[s] - clean[s]) < 1e-4 for s in clean), [(s, killed[s], clean[s]) for s in clean]
    assert kills == 20
