"""Run directories: each belongs to the kind of command that made it, and what reads one back says plainly when
it cannot (issue 40, defects 2 and 10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_errors import assert_one_error_line
from turnforge.cli import app
from turnforge.rundir import OWNER_FILE

runner = CliRunner()

RECIPE = """\
name = "scripted"

[env]
name = "household"

[[stages]]
kind = "eval"
name = "random"
policy = "random"
tasks = 2
"""


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(tmp_path: Path, out: Path):
    recipe = tmp_path / "scripted.toml"
    recipe.write_text(RECIPE)
    return runner.invoke(app, ["run", str(recipe), "--out", str(out)])


def _eval(out: Path):
    return runner.invoke(app, ["eval", "--env", "household", "--tasks", "2", "--out", str(out)])


@pytest.fixture
def recipe_run(tmp_path) -> Path:
    out = tmp_path / "recipe-run"
    assert _run(tmp_path, out).exit_code == 0
    return out


@pytest.fixture
def eval_run(tmp_path) -> Path:
    out = tmp_path / "eval-run"
    assert _eval(out).exit_code == 0
    return out


@pytest.mark.parametrize("old", [False, True], ids=["owner-recorded", "older-version"])
def test_eval_onto_a_recipe_run_is_refused_before_anything_is_written(recipe_run, old):
    """Issue 40.2: `eval --out` onto a recipe run overwrote its summary.json (exit 0), and `report` then crashed."""
    if old:  # a run directory of an older version: recognised by its files
        (recipe_run / OWNER_FILE).unlink(missing_ok=True)
    before = _files(recipe_run)
    assert_one_error_line(_eval(recipe_run), "turnforge run", "another --out")
    assert _files(recipe_run) == before
    assert runner.invoke(app, ["report", str(recipe_run)]).exit_code == 0


@pytest.mark.parametrize("old", [False, True], ids=["owner-recorded", "older-version"])
def test_run_onto_an_eval_directory_is_refused_before_anything_is_written(tmp_path, eval_run, old):
    if old:
        (eval_run / OWNER_FILE).unlink(missing_ok=True)
    before = _files(eval_run)
    assert_one_error_line(_run(tmp_path, eval_run), "turnforge eval", "another --out")
    assert _files(eval_run) == before


@pytest.mark.parametrize("old", [False, True], ids=["owner-recorded", "older-version"])
def test_the_same_kind_resumes_its_own_directory(tmp_path, recipe_run, eval_run, old):
    if old:
        for out in (recipe_run, eval_run):
            (out / OWNER_FILE).unlink(missing_ok=True)
    resumed = _run(tmp_path, recipe_run)
    assert resumed.exit_code == 0 and "finished earlier, skipped" in resumed.output
    resumed = _eval(eval_run)
    assert resumed.exit_code == 0 and "2 of 2 episodes already done" in resumed.output


def test_a_recipe_run_records_its_owner_and_its_eval_stages_theirs(recipe_run, eval_run):
    assert json.loads((recipe_run / OWNER_FILE).read_text())["kind"] == "recipe"
    assert json.loads((eval_run / OWNER_FILE).read_text())["kind"] == "eval"
    assert json.loads((recipe_run / "eval" / "random" / OWNER_FILE).read_text())["kind"] == "eval"


def _summary_cut_short(run: Path) -> None:
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text[: len(text) // 2])


def _summary_of_an_eval(run: Path) -> None:  # what defect 2 left behind
    (run / "summary.json").write_text(json.dumps({"env": "household", "split": "test", "n_episodes": 2}))


def _summary_not_an_object(run: Path) -> None:
    (run / "summary.json").write_text("[1, 2]\n")


def _summary_stage_without_kind(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    del next(iter(summary["stages"].values()))["kind"]
    (run / "summary.json").write_text(json.dumps(summary))


def _summary_eval_without_success(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    del summary["eval"]["random"]["success"]
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture(autouse=True)
def _no_server(monkeypatch):
    """`view` serves until Ctrl-C: here it returns at once, so that a run dir it accepts shows as exit 0."""

    class Served:
        server_address = ("127.0.0.1", 0)

        def serve_forever(self):
            pass

        def server_close(self):
            pass

    monkeypatch.setattr("turnforge.viewer.server.make_server", lambda *a, **k: Served())


@pytest.mark.parametrize("command", ["report", "card", "view"])
@pytest.mark.parametrize(
    "damage",
    [_summary_cut_short, _summary_of_an_eval, _summary_not_an_object, _summary_stage_without_kind,
     _summary_eval_without_success],
)
def test_a_bad_summary_is_one_clear_line_for_every_reader(recipe_run, command, damage):
    """Issue 40.10: a malformed, truncated or foreign summary.json gave `report` a traceback (KeyError)."""
    damage(recipe_run)
    assert_one_error_line(runner.invoke(app, [command, str(recipe_run)]), str(recipe_run / "summary.json"))


@pytest.mark.parametrize("command", ["report", "card"])
def test_report_and_card_of_an_eval_directory_say_which_command_reads_it(eval_run, command):
    assert_one_error_line(runner.invoke(app, [command, str(eval_run)]), "turnforge eval", "turnforge run")


def test_view_of_an_eval_directory_browses_its_episodes(eval_run):
    result = runner.invoke(app, ["view", str(eval_run)])
    assert result.exit_code == 0 and "2 episodes in 1 files" in result.output, result.output


def test_a_comparison_is_not_written_over_a_run(recipe_run, eval_run, tmp_path):
    """`report --compare --out` onto a run replaced that run's report.md with the comparison."""
    before = _files(recipe_run)
    result = runner.invoke(app, ["report", str(recipe_run), str(recipe_run), "--compare", "--out", str(recipe_run)])
    assert_one_error_line(result, "turnforge run", "another --out")
    assert _files(recipe_run) == before
    compare = tmp_path / "compare"
    assert runner.invoke(app, ["report", str(recipe_run), str(recipe_run), "--compare", "--out", str(compare)]).exit_code == 0
    assert runner.invoke(app, ["report", str(recipe_run), str(recipe_run), "--compare", "--out", str(compare)]).exit_code == 0
    assert_one_error_line(_eval(compare), "turnforge report --compare", "another --out")


def test_a_comparison_takes_eval_folders_and_runs_alike(recipe_run, eval_run, tmp_path):
    """Issue 60: `report A B --compare` on two `turnforge eval` folders was refused ("not of a recipe run"), though the
    README calls it "evaluations side by side". An eval folder is one column named after it; a run, one per eval."""
    random_run = tmp_path / "eval-random"
    made = runner.invoke(app, ["eval", "--env", "household", "--tasks", "2", "--policy", "random", "--out", str(random_run)])
    assert made.exit_code == 0, made.output
    out = tmp_path / "compare"
    result = runner.invoke(app, ["report", str(eval_run), str(random_run), "--compare", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "| metric | eval-run | eval-random | Δ |" in report and "| success (95% CI) | 100.0% (" in report
    assert "- `eval-run`: `turnforge eval` of `expert` on household, split test" in report
    assert "| stop reason | eval-run | eval-random |" in report  # the sections every report has, from the episodes
    mixed = runner.invoke(app, ["report", str(recipe_run), str(eval_run), "--compare", "--out", str(tmp_path / "mixed")])
    assert mixed.exit_code == 0, mixed.output
    assert "| metric | recipe-run:random | eval-run | Δ |" in (tmp_path / "mixed" / "report.md").read_text()
    (tmp_path / "nothing").mkdir()
    refused = runner.invoke(app, ["report", str(eval_run), str(tmp_path / "nothing"), "--compare", "--out", str(out)])
    assert_one_error_line(refused, "neither a `turnforge run` directory nor a `turnforge eval` folder")
    (random_run / "summary.json").unlink()
    refused = runner.invoke(app, ["report", str(eval_run), str(random_run), "--compare", "--out", str(out)])
    assert_one_error_line(refused, "has no summary.json", "re-run the `turnforge eval`")
