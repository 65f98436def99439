"""Task counts cannot exceed a split (issue 40, defect 5): `--tasks 310` of a 300-task split invented 10 tasks,
and `tasks = 1000000000` printed nothing while memory grew."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli_errors import assert_one_error_line
from turnforge.cli import app
from turnforge.envs.base import load_tasks

runner = CliRunner()


@pytest.mark.parametrize(
    ("env", "split", "options", "size"),
    [("household", "valid_seen", {}, 300), ("sql", "test", {"generate": 5}, 5), ("code", "test", {"generate": 4}, 4),
     ("service", "test", {}, 12)],  # (service cannot tell its size without loading: counted after loading)
)
def test_a_count_beyond_the_split_names_the_split_and_its_size(env, split, options, size):
    assert len(load_tasks(env, split, limit=size, **options)) == size  # the whole split is fine
    with pytest.raises(ValueError, match=rf"split '{split}' has {size} tasks") as caught:
        load_tasks(env, split, limit=size + 10, **options)
    assert f"{size + 10}" in str(caught.value)


def test_eval_tasks_beyond_the_split_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    args = ["eval", "--env", "household", "--split", "valid_seen", "--tasks", "310", "--out", str(out)]
    assert_one_error_line(runner.invoke(app, args), "'valid_seen' has 300 tasks", "310")
    assert not out.exists()


RECIPE = """\
name = "huge"

[env]
name = "household"

[[stages]]
kind = "eval"
name = "first"
policy = "expert"
tasks = 2

[[stages]]
kind = "eval"
name = "random"
policy = "random"
split = "test"
tasks = 1000000000
"""


def test_a_recipe_count_beyond_the_split_stops_it_before_any_stage_runs(tmp_path):
    """The second stage's count is refused before the first runs, and no task of the huge count is built (the
    test would run out of memory or time otherwise)."""
    recipe, out = tmp_path / "huge.toml", tmp_path / "run"
    recipe.write_text(RECIPE)
    assert_one_error_line(runner.invoke(app, ["run", str(recipe), "--out", str(out)]),
                    "'test' has 3000 tasks", "1000000000", "random")
    assert not out.exists()
    # `--check` refuses it as the run does (a recipe that passed --check must not then fail at its start)
    assert_one_error_line(runner.invoke(app, ["run", str(recipe), "--out", str(out), "--check"]),
                          "'test' has 3000 tasks", "1000000000", "random")
    assert not out.exists()


@pytest.mark.parametrize("env", ["sql", "code"])
def test_a_generated_env_refuses_a_count_it_would_build_all_at_once(tmp_path, env):
    """A huge `generate` built every task in memory before the first episode; it is capped with a clear error."""
    result = runner.invoke(app, ["eval", "--env", env, "--env-opt", "generate=1000000000", "--out", str(tmp_path / "out")])
    assert_one_error_line(result, "'generate'", "..100000")
    assert not Path(tmp_path / "out").exists()


def test_a_count_of_a_huge_generated_split_builds_only_what_it_takes():
    assert [t.id for t in load_tasks("code", "test", limit=2, generate=100_000)] == ["gen-test-0", "gen-test-1"]
