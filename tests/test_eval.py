"""The evaluation runner (files, resume, replay) and the CLI, on the real household env."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.eval.metrics import SUMMARY_KEYS
from turnforge.policies.base import SamplingParams
from turnforge.rollouts_file import run_eval
from turnforge.types import Trajectory

runner = CliRunner()


def _eval(out, policy="expert", n_tasks=6, samples=1, **kw) -> dict:
    return run_eval("household", {}, policy, "test", n_tasks, samples, seed=0, out_dir=out, **kw)


def _episodes(out) -> list[Trajectory]:
    return [Trajectory.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_run_eval_writes_every_file_and_key(tmp_path):
    out = tmp_path / "expert"
    summary = _eval(out)
    assert list(summary) == list(SUMMARY_KEYS)
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["success"] == 1.0 and summary["n_episodes"] == 6 and summary["n_tasks"] == 6
    assert summary["stop_reasons"] == {"success": 6} and summary["pass@k"] == {"1": 1.0}
    run = json.loads((out / "run.json").read_text())
    assert {k: run[k] for k in ("env", "split", "policy", "samples", "seed", "n_tasks")} == {
        "env": "household", "split": "test", "policy": "expert", "samples": 1, "seed": 0, "n_tasks": 6,
    }  # fmt: skip
    episodes = _episodes(out)
    # appended as they finish (completion order), one per (task, sample)
    assert sorted(e.key for e in episodes) == [(f"test-{i:05d}", 0) for i in range(6)]
    for e in episodes:
        assert e.category and e.messages and e.stop_reason and e.score.success


def test_resume_after_a_kill_finishes_the_run_without_redoing_episodes(tmp_path):
    out = tmp_path / "random"
    first = _eval(out, policy="random", n_tasks=10)
    path = out / "episodes.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 10
    # what a kill mid-write leaves: 4 complete episodes and half of the 5th
    path.write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])

    with pytest.warns(RuntimeWarning, match="unfinished last line"):
        second = _eval(out, policy="random", n_tasks=10)

    resumed = path.read_text().splitlines(keepends=True)
    assert len(resumed) == 10 and resumed[:4] == lines[:4]
    assert sorted(e.key for e in _episodes(out)) == sorted((f"test-{i:05d}", 0) for i in range(10))
    # wall_s is the run's time across resumes (it grows); wall_s_invocation is each invocation's own
    assert second["wall_s"] > second["wall_s_invocation"] and second["wall_s"] >= first["wall_s"]
    for summary in (first, second):
        summary.pop("wall_s"), summary.pop("wall_s_invocation")
    assert second == first

    # nothing left to do: a third run adds nothing and gives the same summary
    third = _eval(out, policy="random", n_tasks=10)
    third.pop("wall_s"), third.pop("wall_s_invocation")
    assert path.read_text().splitlines(keepends=True) == resumed and third == first


def test_a_different_run_in_the_same_out_dir_is_refused(tmp_path):
    out = tmp_path / "run"
    _eval(out, n_tasks=2)
    before = (out / "episodes.jsonl").read_text()
    with pytest.raises(ValueError, match="holds a different run.*policy"):
        _eval(out, policy="random", n_tasks=2)
    with pytest.raises(ValueError, match="n_tasks"):
        _eval(out, n_tasks=3)
    assert (out / "episodes.jsonl").read_text() == before


def test_a_run_json_written_before_a_sampling_field_existed_resumes(tmp_path):
    """Its missing field held the default then: an interrupted eval resumes after an upgrade that adds one."""
    out = tmp_path / "run"
    first = _eval(out, n_tasks=2)
    run = json.loads((out / "run.json").read_text())
    del run["sampling"]["explore"]
    (out / "run.json").write_text(json.dumps(run))
    (out / "summary.json").unlink()
    again = _eval(out, n_tasks=2)
    assert again["success"] == first["success"] and again["sampling"]["explore"] == 1.0
    with pytest.raises(ValueError, match="sampling"):
        _eval(out, n_tasks=2, params=SamplingParams(explore=0.5))


@pytest.mark.parametrize("policy,samples", [("random", 2), ("expert", 1)])
def test_replay_reproduces_a_saved_run(tmp_path, policy, samples):
    original = _eval(tmp_path / "original", policy=policy, samples=samples)
    saved = tmp_path / "original" / "episodes.jsonl"
    # as the issue writes it: no --tasks, so the replay plays the tasks its file holds
    args = ["eval", "--env", "household", "--policy", f"replay:{saved}", "--out", str(tmp_path / "replayed")]
    result = runner.invoke(app, [*args, "--samples", str(samples)])
    assert result.exit_code == 0, result.output
    replayed = json.loads((tmp_path / "replayed" / "summary.json").read_text())

    def outcomes(out):
        return {
            e.key: (e.score.success, e.score.reward, e.score.progress, e.stop_reason) for e in _episodes(out)
        }

    assert outcomes(tmp_path / "replayed") == outcomes(tmp_path / "original")
    assert replayed["n_episodes"] == original["n_episodes"]
    for key in ("success", "mean_reward", "mean_progress", "mean_turns", "stop_reasons", "pass@k", "pass^k"):
        assert replayed[key] == original[key]


def test_cli_envs_lists_household_with_its_options():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0, result.output
    for text in ("household", "pick_and_place_simple", "valid_seen", "grammar", "hints"):
        assert text in result.output


def test_cli_eval_runs_and_prints_the_table(tmp_path):
    out = tmp_path / "cli"
    args = ["eval", "--env", "household", "--policy", "expert", "--tasks", "3", "--out", str(out)]
    result = runner.invoke(app, [*args, "--env-opt", "hints=true", "--env-opt", "grammar=0.4"])
    assert result.exit_code == 0, result.output
    assert "success" in result.output and "pass@k" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_episodes"] == 3 and summary["success"] == 1.0
    assert json.loads((out / "run.json").read_text())["env_options"] == {"hints": True, "grammar": "0.4"}


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--env-opt", "hints"], "not KEY=VALUE"),
        (["--env-opt", "colour=red"], "has no option 'colour'"),
        (["--env-opt", "grammar=0.9"], "not one of"),
        (["--policy", "vllm", "--model", "Qwen/Qwen3-4B-Instruct-2507"], 'pip install "turnforge[vllm]"'),
        (["--policy", "hf", "--model", "/no/such/model"], "model folder /no/such/model does not exist"),
        (["--policy", "sometimes"], "unknown policy"),
        (["--split", "nope"], "has no split"),
        (["--limit-open", "0"], "--limit-open must be at least 1"),
    ],
)
def test_cli_eval_bad_input_is_one_clear_line(tmp_path, extra, message):
    args = ["eval", "--env", "household", "--tasks", "1", "--out", str(tmp_path / "bad"), *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_replaying_a_dbbench_run_reproduces_its_score(tmp_path):
    """Issue 11: DBBench's prompt holds an assistant turn of the env's own (the few-shot "Ok."); a replay of the
    run's episodes.jsonl takes the policy's replies only (`Trajectory.reply_indices()`), so it scores as the run did."""
    original = run_eval("sql", {"generate": 12}, "expert", "train", 6, 1, 0, tmp_path / "original")
    saved = tmp_path / "original" / "episodes.jsonl"
    replayed = run_eval("sql", {"generate": 12}, f"replay:{saved}", "train", None, 1, 0, tmp_path / "replayed")
    assert original["success"] == 1.0
    assert replayed["success"] == original["success"] and replayed["n_episodes"] == 6


def test_a_replay_that_matches_no_selected_task_is_an_error(tmp_path):
    """Issue 17: a replay file of other tasks used to give 0 % "gave_up" without a word."""
    _eval(tmp_path / "original", policy="expert", n_tasks=2)
    saved = tmp_path / "original" / "episodes.jsonl"
    args = ["eval", "--env", "household", "--split", "train", "--policy", f"replay:{saved}", "--out", str(tmp_path / "r")]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "holds replies for none of the" in result.output
    assert "pass the run's --split" in result.output and not (tmp_path / "r" / "episodes.jsonl").exists()


def test_an_out_dir_is_used_by_one_process_and_a_killed_ones_lock_is_taken_over(tmp_path):
    """Issue 17: two evals on one --out wrote every episode twice. The second now fails at once, naming the
    holder; after the first is killed (SIGKILL), a rerun takes the lock over and resumes."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    cli = [sys.executable, "-c", "from turnforge.cli import app; app()"]
    args = ["eval", "--env", "household", "--policy", "expert", "--tasks", "8", "--out", str(out),
            "--env-opt", "step_delay_ms=150", "--limit-open", "2"]
    first = subprocess.Popen([*cli, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / "episodes.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        # stopped, it holds the folder however long the second takes to start (4-5 s of imports; under CI's load the
        # first, left running, once finished its 8 episodes before the second looked, and the second resumed them)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert f"in use by turnforge pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    third = runner.invoke(app, args)
    assert third.exit_code == 0, third.output
    assert sorted(e.task_id for e in _episodes(out)) == sorted({e.task_id for e in _episodes(out)})  # none twice
    assert len(_episodes(out)) == 8


def test_out_pointing_at_a_file_is_one_line(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    result = runner.invoke(app, ["eval", "--env", "household", "--tasks", "1", "--out", str(target)])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output and "Traceback" not in result.output


def test_env_errors_fail_the_command_with_their_cause_and_are_redone_on_resume(tmp_path):
    """Issue 17: an unreachable database gave 0 % success and exit 0, and a rerun did not retry."""
    out = tmp_path / "bogus"
    args = ["eval", "--env", "sql", "--env-opt", "generate=3", "--env-opt", "db_url=bogus://x", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "3 of 3 episodes ended in an env error" in result.output
    assert "bogus" in result.output and "Traceback" not in result.output
    assert (out / "summary.json").exists() and len(_episodes(out)) == 3  # written all the same

    ok = tmp_path / "ok"
    _eval(ok, n_tasks=3)
    lines = (ok / "episodes.jsonl").read_text().splitlines()
    broken = json.loads(lines[1])
    broken["stop_reason"] = "env_error"
    (ok / "episodes.jsonl").write_text("\n".join([lines[0], json.dumps(broken), lines[2]]) + "\n")
    summary = _eval(ok, n_tasks=3)  # the env-error episode is played again; its new line replaces the old
    assert summary["success"] == 1.0 and summary["n_episodes"] == 3 and len(_episodes(ok)) == 4


def test_version_and_run_help_list_what_a_new_user_needs():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("turnforge ")
    result = runner.invoke(app, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0 and "quickstart" in result.output and "agentbench_ironguard" in result.output


@pytest.mark.slow
def test_twenty_sigkills_during_an_eval_lose_nothing_and_duplicate_nothing(tmp_path):
    """Issue 17's kill/resume loop: SIGKILL an eval at random moments 20 times, resuming each time; the finished
    run holds every episode exactly once, with the same outcomes as an uninterrupted run."""
    import random
    import signal
    import subprocess
    import sys
    import time

    cli = [sys.executable, "-c", "from turnforge.cli import app; app()"]
    args = ["eval", "--env", "household", "--policy", "random", "--tasks", "30", "--samples", "2",
            "--env-opt", "step_delay_ms=60", "--limit-open", "4"]  # ~45 s of steps: kills land mid-run
    out, reference = tmp_path / "killed", tmp_path / "reference"
    rng = random.Random(0)
    kills = 0
    while kills < 20:
        proc = subprocess.Popen([*cli, *args, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(1.0, 3.0))
        if proc.poll() is not None:
            break  # it finished before the kill
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    assert subprocess.run([*cli, *args, "--out", str(out)], capture_output=True, timeout=600).returncode == 0
    assert subprocess.run([*cli, *args, "--out", str(reference)], capture_output=True, timeout=600).returncode == 0
    keys = [e.key for e in _episodes(out)]
    assert kills == 20 and sorted(keys) == sorted(set(keys)) and len(keys) == 60, (kills, len(keys))

    def outcomes(run):
        return sorted((e.key, e.score.success, e.stop_reason, len(e.turns)) for e in _episodes(run))

    assert outcomes(out) == outcomes(reference)


def test_envs_never_cuts_a_choice():
    """Issue 17: long choices (BFCL's category names) were cut with an ellipsis."""
    result = runner.invoke(app, ["envs"], terminal_width=80)
    assert result.exit_code == 0 and "…" not in result.output
    assert "multi_turn_long_context" in result.output.replace("\n", "").replace(" ", "") or "bfcl" not in result.output


def test_household_export_to_a_file_is_one_line(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    result = runner.invoke(app, ["household", "export", "--n", "1", "--out", str(target)])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output and "Traceback" not in result.output
