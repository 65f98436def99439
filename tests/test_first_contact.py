"""Issue 40 (defect 10): what a new user meets first answers with one clear line, never a traceback, a silent
misreading or a wait on the Hub."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.envs.base import list_envs
from turnforge.rollouts_file import run_eval

runner = CliRunner()
CLI = [sys.executable, "-c", "from turnforge.cli import app; app()"]


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1
    for needle in needles:
        assert needle in result.output, result.output


@pytest.mark.parametrize("command", [
    ["eval", "--env", "household", "--tasks", "1"],
    ["run", "quickstart"],
    ["run", "quickstart", "--check"],
    ["household", "export", "--n", "1"],
    ["data", "import", "EPISODES", "--schema", "trl-sft"],
    ["data", "export", "EPISODES", "--format", "trl-sft"],
])
def test_out_under_a_file_is_one_line_naming_the_file(tmp_path, command):
    """`--out notes.txt/run` gave a NotADirectoryError (or FileExistsError) traceback."""
    episodes = tmp_path / "episodes.jsonl"
    episodes.write_text("")
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    args = [str(episodes) if a == "EPISODES" else a for a in command]
    result = runner.invoke(app, [*args, "--out", str(notes / "run")])
    _one_line_error(result, f"inside {notes}, which is a file")


@pytest.fixture(scope="module")
def mixed_eval_dir(tmp_path_factory) -> Path:
    """An eval's --out (summary.json, episodes.jsonl) holding 2 successful and 3 failed episodes."""
    root = tmp_path_factory.mktemp("evals")
    run_eval("household", {}, "expert", "test", 2, 1, 0, root / "expert")
    run_eval("household", {}, "random", "test", 5, 1, 0, root / "random", task_ids=["test-00002", "test-00003",
                                                                                      "test-00004"])
    with (root / "expert" / "episodes.jsonl").open("a") as f:
        f.write((root / "random" / "episodes.jsonl").read_text())
    return root / "expert"


def test_view_on_a_busy_port_is_one_line_suggesting_another(mixed_eval_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["view", str(mixed_eval_dir / "episodes.jsonl"), "--port", str(port)])
    _one_line_error(result, f"127.0.0.1:{port}", "--port")


def test_view_takes_an_eval_directory_and_its_success_filter_means_what_it_says(mixed_eval_dir):
    """`view EVAL_OUT` was refused as "not a finished run directory", and `success=true` returned the failed
    episodes (only "1" meant yes)."""
    from turnforge.viewer.server import Viewer

    viewer = Viewer(mixed_eval_dir)
    [source] = viewer.sources
    assert len(viewer.sources[source].rows) == 5

    def successes(value: str) -> list[bool]:
        return [r["success"] for r in viewer.page({"source": source, "success": value})["items"]]

    for yes in ("true", "1", "yes", "True"):
        assert successes(yes) == [True, True]
    for no in ("false", "0", "no"):
        assert successes(no) == [False, False, False]
    with pytest.raises(ValueError, match="success='maybe'"):
        successes("maybe")


def test_importing_a_hub_dataset_offline_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    args = ["data", "import", "hf:nobody/nothing", "--schema", "trl-sft", "--out", str(tmp_path / "x.jsonl")]
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "hf:nobody/nothing" in line and "HF_HUB_OFFLINE" in line


def _commands(command: click.Command, path: list[str]):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


def test_every_help_text_keeps_its_brackets():
    """Rich markup ate `[ray]`, `[scale]`, `[model]`: "Needs turnforge.", "the recipe's )."."""
    brackets = 0
    for path, command in _commands(typer.main.get_command(app), []):
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        shown = " ".join(result.output.split())
        for text in [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]:
            for bracketed in re.findall(r"\S*\[[^\]]*\]\S*", text):
                brackets += 1
                assert " ".join(bracketed.split()) in shown, (path, bracketed)
    assert brackets >= 5  # turnforge[ray], [scale], [model], hf:NAME[:SPLIT], ... were looked at


@pytest.mark.parametrize("width", [60, 80, 200])
def test_envs_shows_every_help_and_choice_whole_at_any_width(width):
    """At 80 columns (a pipe's width) the options table cut its help column mid-word ("JSO" for "JSON)")."""
    result = runner.invoke(app, ["envs"], terminal_width=width)
    assert result.exit_code == 0 and "…" not in result.output
    shown = " ".join(result.output.split())
    for spec in list_envs():
        for option in spec.options:
            assert " ".join(option.help.split()) in shown, (spec.name, option.name)
            for choice in option.choices or ():
                assert f" {choice} " in f" {shown} ".replace("|", " "), (spec.name, choice)


def test_ctrl_c_during_hf_generation_is_short_and_says_the_run_resumes(tiny_model_dir, tmp_path):
    """Ctrl-C while the model generated printed 140-170 lines of "Task exception was never retrieved"."""
    out = tmp_path / "hf"
    args = ["eval", "--env", "household", "--policy", "hf", "--model", str(tiny_model_dir), "--tasks", "20",
            "--limit-open", "8", "--max-new-tokens", "64", "--out", str(out)]
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # pytest may ignore it
    try:
        deadline = time.monotonic() + 120
        while not (out / "episodes.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the file opens once the model is loaded: the episodes are generating
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert "never retrieved" not in stderr and "Traceback" not in stderr
    assert len(stderr.splitlines()) < 12, stderr
    assert "the same command resumes" in stderr.splitlines()[-1]


def test_ctrl_c_in_a_training_stage_says_the_same_command_resumes(tmp_path, monkeypatch):
    """Ctrl-C during SFT exited without a word on resuming; now it says what re-running keeps (exit 130)."""
    from turnforge.stages import registry

    def interrupted(stage, index, stage_dir, ctx):
        checkpoint = stage_dir / "checkpoints" / "checkpoint-5"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text("{}")
        raise KeyboardInterrupt

    sft = registry.stage_kind("sft")
    monkeypatch.setitem(registry._KINDS, "sft", registry.StageKind("sft", sft.config, interrupted))
    out = tmp_path / "qs"
    result = runner.invoke(app, ["run", "quickstart", "--out", str(out), "--set", "stages.collect.tasks=2"])
    assert result.exit_code == 130, result.output
    assert "interrupted in [2/8] 02-sft: finished stages are kept; the same command resumes, this stage from " \
           f"{out / 'stages/02-sft/checkpoints/checkpoint-5'}" in result.output


def test_model_tiny_means_the_offline_tiny_model(tmp_path, monkeypatch):
    """`eval --model tiny` asked the Hub for 63 s, then named an internal function (resolve_model)."""
    out = tmp_path / "tiny"
    args = ["eval", "--env", "household", "--policy", "hf", "--model", "tiny", "--tasks", "1", "--max-turns", "1",
            "--max-new-tokens", "4", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "models" / "tiny" / "config.json").is_file()  # built offline, as a recipe's
    assert json.loads((out / "run.json").read_text())["model"] == "tiny"

    missing = runner.invoke(app, ["eval", "--env", "household", "--policy", "hf", "--model", "/no/such/model",
                                  "--out", str(tmp_path / "missing")])
    _one_line_error(missing, '"tiny"')
    assert "resolve_model" not in missing.output


def test_a_missing_local_model_is_refused_before_the_hub_is_asked(tmp_path, monkeypatch):
    """Issue 53: `--model runs/nothere` (one slash, as a Hub id has) was tried on the Hub for ~52 s. A path whose first
    folder exists here is local; only what could be a Hub id is looked up there."""
    from turnforge.models.loading import looks_local

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # were it asked, the Hub would be (and the line would differ)
    result = runner.invoke(app, ["eval", "--env", "household", "--policy", "hf", "--model", "runs/nothere",
                                 "--out", "out"])
    _one_line_error(result, "model folder runs/nothere does not exist")
    assert not (tmp_path / "out").exists()
    assert [looks_local(spec) for spec in ("runs/nothere", "./m", "~/m", "/m", "a/b/c")] == [True] * 5
    assert [looks_local(spec) for spec in ("Qwen/Qwen3-4B-Instruct-2507", "gpt2", "nothere/model")] == [False] * 3


def test_serve_model_tiny_builds_and_serves_the_tiny_model(tmp_path):
    """Issue 53: `serve --model tiny` sent the user to the 15-minute quickstart; it builds the tiny model (the one
    `eval --model tiny` builds for the same env) and serves it under the name tiny."""
    import httpx

    command = [*CLI, "serve", "--model", "tiny", "--port", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = proc.stdout.readline()  # "serving tiny at http://127.0.0.1:PORT (Ctrl-C stops)", once it listens
        assert line.startswith("serving tiny at "), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split()[3]
        # The socket listens before uvicorn starts: the kernel queues the connection and uvicorn answers it then.
        assert [m["id"] for m in httpx.get(f"{url}/models", timeout=60).json()["data"]] == ["tiny"]
        reply = httpx.post(f"{url}/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "go to fridge 1"}], "max_tokens": 3})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert "Traceback" not in stderr and "Loading weights" not in stderr, stderr
    assert not list(tmp_path.iterdir())  # built in a temporary folder, removed at exit


def test_bad_sampling_values_fail_before_a_model_loads_and_leave_nothing(tmp_path, monkeypatch):
    """`--temperature -1` was refused only after the model loaded, leaving an empty --out behind."""
    import turnforge.rollouts_file as rollouts_file

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(rollouts_file, "make_policy", no_model)
    out = tmp_path / "bad"
    args = ["eval", "--env", "household", "--policy", "hf", "--model", "some/model", "--temperature", "-1",
            "--top-p", "1.5", "--top-k", "-2", "--max-new-tokens", "0", "--out", str(out)]
    result = runner.invoke(app, args)
    _one_line_error(result, "temperature", "top_p", "top_k", "max_new_tokens")
    assert not out.exists()


def test_check_refuses_absurd_training_values_all_at_once():
    """`learning_rate = 1e9` and `max_length = 10` passed --check (the SFT failed, or diverged, minutes later)."""
    from turnforge.recipes import load_recipe
    from turnforge.recipes.loading import RecipeError

    bad = ["stages.sft.learning_rate=1e9", "stages.sft.max_length=10", "stages.rft.train.max_length=100",
           "stages.grpo.learning_rate=1.0"]
    with pytest.raises(RecipeError) as caught:
        load_recipe("quickstart", overrides=bad)
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == len(bad), lines
    for pair in bad:
        [line] = [x for x in lines if x.strip().startswith(f"--set {pair}:")]
        assert "expected" in line
    load_recipe("quickstart", overrides=["stages.sft.learning_rate=0.5", "stages.sft.max_length=128"])  # still fine


HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "openenv", "fastapi", "ray", "vllm")


def test_help_version_and_envs_import_no_heavy_library():
    """Issue 53: `turnforge --help`, `--version` and `envs` took ~5.3 s each, importing torch, TRL, PEFT and datasets
    before parsing the command line. In one process: every command's --help, --version and envs, then the modules
    they imported (their time is not asserted: the machine's load decides it; what is imported decides the rest)."""
    walk = """
import sys
import typer
from typer.testing import CliRunner
from turnforge.cli import app

def commands(command, path):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, [*path, name])

runner = CliRunner()
calls = [[*path, "--help"] for path in commands(typer.main.get_command(app), [])] + [["--version"], ["envs"]]
for args in calls:
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and result.output, (args, result.output)
print(len(calls), " ".join(sorted(sys.modules)))
"""
    result = subprocess.run([sys.executable, "-c", walk], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    count, modules = result.stdout.split(" ", 1)
    assert int(count) >= 16  # the commands and groups, each with --help
    imported = {name.split(".")[0] for name in modules.split()}
    assert imported & set(HEAVY) == set()
    assert "turnforge.cli" in modules.split() and "turnforge.envs.household" in modules.split()  # envs listed them


def test_out_anywhere_inside_a_run_or_an_eval_is_refused_naming_its_owner(tmp_path, monkeypatch):
    """Issue 53: `eval --out runs/mini/stages` (or runs/mini/eval, runs/mini/eval/expert) wrote episodes.jsonl,
    summary.json and owner.json inside the run, and rewrote eval/expert's summary; only the run folder itself was
    protected."""
    from turnforge.rundir import claim

    monkeypatch.chdir(tmp_path)
    run = Path("runs/mini")
    (run / "stages").mkdir(parents=True)
    claim(run, "recipe")  # what `turnforge run` records in its folder
    run_eval("household", {}, "expert", "test", 1, 1, 0, run / "eval" / "expert")  # a recipe's eval stage's folder
    summary = (run / "eval" / "expert" / "summary.json").read_text()
    expert_eval = ["eval", "--env", "household", "--tasks", "1"]
    for out in ("runs/mini/stages", "runs/mini/eval", "runs/mini/eval/expert", "runs/mini/eval/expert/again"):
        result = runner.invoke(app, [*expert_eval, "--out", out])
        owner = "runs/mini/eval/expert" if out.endswith("again") else "runs/mini"
        _one_line_error(result, f"--out {out} is inside {owner}, which holds the results of `turnforge")
    for command in (["run", "quickstart", "--check"], ["household", "export", "--n", "1"]):
        _one_line_error(runner.invoke(app, [*command, "--out", "runs/mini/stages/x"]), "inside runs/mini")
    episodes = str(run / "eval" / "expert" / "episodes.jsonl")
    _one_line_error(runner.invoke(app, ["data", "import", episodes, "--schema", "trl-sft", "--out",
                                        "runs/mini/data.jsonl"]), "inside runs/mini")
    assert sorted(p.name for p in (run / "stages").iterdir()) == [] and not (run / "stages" / "owner.json").exists()
    assert (run / "eval" / "expert" / "summary.json").read_text() == summary
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["expert"]
    assert runner.invoke(app, [*expert_eval, "--out", "runs/other"]).exit_code == 0  # beside it: fine


def test_usage_errors_are_one_error_line_like_the_commands_own():
    """Issue 53: click's usage errors printed a usage block and `Error: ...`, the commands' refusals `error: ...`."""
    for args, says in ((["eval", "--env", "household"], "Missing option '--out'"),
                       (["eval", "--env", "household", "--out", "x", "--tasks", "many"], "Invalid value for '--tasks'"),
                       (["nosuch"], "No such command 'nosuch'")):
        result = runner.invoke(app, args)
        _one_line_error(result, says)
        assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output


def test_normal_runs_hide_the_libraries_deprecations_but_not_turnforges_warnings():
    """Issue 53: transformers' `past_key_values` FutureWarning showed in normal runs: it is attributed to turnforge's
    `generate(...)` line, which the "ours stay visible" filter let through."""
    import warnings

    from turnforge.cli import quiet_libraries

    with warnings.catch_warnings(record=True) as caught:
        quiet_libraries()
        warnings.warn_explicit("past_key_values is deprecated", FutureWarning, "hf.py", 170, module="turnforge.policies.hf")
        warnings.warn_explicit("greedy samples are identical", UserWarning, "rollouts_file.py", 1,
                               module="turnforge.rollouts_file")
        warnings.warn_explicit("experimental feature", UserWarning, "grpo_trainer.py", 1, module="trl.trainer")
    assert [str(w.message) for w in caught] == ["greedy samples are identical"]
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # transformers' "Loading weights" bars read it
