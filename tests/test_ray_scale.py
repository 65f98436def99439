"""Rollouts on Ray workers (`--ray`): the same episodes and summary as in-process, resume across the two, and a
worker killed mid-run losing nothing. On a local Ray instance with 2 CPUs (about 20 s, most of it Ray's start)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from turnforge.envs.base import load_tasks
from turnforge.rollout import RolloutLimits
from turnforge.rollouts_file import run_eval
from turnforge.rundir import EPISODES_FILE
from turnforge.scale import ScaleConfig

ray = pytest.importorskip("ray")

TIMING_KEYS = ("wall_s", "wall_s_invocation")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _episodes(out: Path) -> dict[tuple[str, int], dict]:
    """The episodes file by (task_id, sample), without the timings (which differ run to run)."""
    lines = [json.loads(line) for line in (out / EPISODES_FILE).read_text(encoding="utf-8").splitlines()]
    by_key = {(e["task_id"], e["sample"]): {k: v for k, v in e.items() if k != "timings"} for e in lines}
    assert len(by_key) == len(lines), "an episode was written twice"
    return by_key


def _summary(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


@pytest.mark.parametrize("policy", ["expert", "random"])
def test_ray_workers_give_the_in_process_episodes_and_summary(local_ray, tmp_path: Path, policy: str):
    args = dict(env="household", env_options={}, policy_spec=policy, split="test", n_tasks=6, samples=2, seed=3)
    here = run_eval(**args, out_dir=tmp_path / "here")
    there = run_eval(**args, out_dir=tmp_path / "ray", scale=ScaleConfig(ray="auto", workers=2))
    assert _episodes(tmp_path / "ray") == _episodes(tmp_path / "here")
    assert _summary(there) == _summary(here)
    assert here["n_episodes"] == 12


def test_a_run_begun_in_process_resumes_on_ray(local_ray, tmp_path: Path):
    args = dict(env="household", env_options={}, policy_spec="random", split="test", n_tasks=6, samples=1, seed=1,
                out_dir=tmp_path / "run")
    whole = run_eval(**args)
    path = tmp_path / "run" / EPISODES_FILE
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:2]), encoding="utf-8")  # as if killed after two episodes
    kept = _episodes(tmp_path / "run")
    resumed = run_eval(**args, scale=ScaleConfig(ray="auto", workers=2))
    assert _summary(resumed) == _summary(whole)
    after = _episodes(tmp_path / "run")
    assert len(after) == 6 and all(after[k] == v for k, v in kept.items())


def test_a_killed_worker_loses_no_finished_episode(local_ray, tmp_path: Path, capfd):
    """Kill a worker after two episodes are on disk: its unfinished episodes are redone by a new worker."""
    out = tmp_path / "killed"
    # Slow steps (0.1 s each, ~10 steps an episode) so that the kill lands mid-run; 2 open episodes per worker.
    args = dict(env="household", env_options={"step_delay_ms": 100}, policy_spec="expert", split="test", n_tasks=8,
                samples=1, seed=0, limits=RolloutLimits(max_open=2))
    seen_at_kill: list[int] = []

    def kill_first_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            path = out / EPISODES_FILE
            done = len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0
            names = sorted(n for n in ray.util.list_named_actors() if n.startswith("turnforge-episodes-"))
            if done >= 2 and names:
                seen_at_kill.append(done)
                ray.kill(ray.get_actor(names[0]))
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_worker)
    killer.start()
    summary = run_eval(**args, out_dir=out, scale=ScaleConfig(ray="auto", workers=2))
    killer.join()
    assert seen_at_kill and seen_at_kill[0] < 8, "the worker was not killed mid-run"
    assert "a Ray worker died" in capfd.readouterr().err
    episodes = _episodes(out)  # each episode exactly once
    assert set(episodes) == {(t.id, 0) for t in load_tasks("household", "test", limit=8)}
    assert summary["success"] == 1.0 and summary["n_episodes"] == 8


def test_without_ray_nothing_imports_it(tmp_path: Path):
    code = (
        "import sys; from turnforge.cli import app\n"
        f"app(['eval', '--env', 'household', '--policy', 'random', '--tasks', '2', '--out', {str(tmp_path / 'e')!r}],"
        " standalone_mode=False)\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_recipe_fans_its_rollout_stages_out_with_cli_ray(local_ray, tmp_path: Path):
    """`turnforge run RECIPE --ray auto --workers 2`: collect and eval stages on Ray, the same results as without."""
    from typer.testing import CliRunner

    from turnforge.cli import app

    recipe = tmp_path / "scripted.toml"
    recipe.write_text('[env]\nname = "household"\n\n[[stages]]\nkind = "collect"\ntasks = 4\n\n'
                      '[[stages]]\nkind = "eval"\npolicy = "random"\ntasks = 4\nsamples = 2\n')
    results = {}
    for name, flags in (("here", []), ("ray", ["--ray", "auto", "--workers", "2"])):
        done = CliRunner().invoke(app, ["run", str(recipe), "--out", str(tmp_path / name), *flags])
        assert done.exit_code == 0, done.output
        results[name] = json.loads((tmp_path / name / "summary.json").read_text(encoding="utf-8"))
    assert _summary(results["ray"]["eval"]["eval"]) == _summary(results["here"]["eval"]["eval"])
    assert 'ray = "auto"' in (tmp_path / "ray" / "config.toml").read_text(encoding="utf-8")
    assert _episodes(tmp_path / "ray" / "eval" / "eval") == _episodes(tmp_path / "here" / "eval" / "eval")


def test_workers_without_ray_is_a_recipe_error(tmp_path: Path):
    from turnforge.recipes import RecipeError, parse_recipe

    with pytest.raises(RecipeError, match="scale"):
        parse_recipe({"scale": {"workers": 4}, "stages": [{"kind": "eval", "policy": "expert"}]})


@pytest.mark.slow  # each worker loads torch and the model (~30 s here)
def test_hf_replicas_on_ray_workers(local_ray, tiny_model_dir: Path, tmp_path: Path):
    """hf policy replicas, one per worker, built from the spec; the driver loads no model."""
    from turnforge.policies.base import SamplingParams

    args = dict(env="household", env_options={"format": "act_line"}, policy_spec="hf", split="test", n_tasks=4,
                samples=1, seed=0, model=str(tiny_model_dir), params=SamplingParams(max_new_tokens=8),
                policy_options={"device": "cpu"}, max_env_errors=0.0)
    here = run_eval(**args, out_dir=tmp_path / "here", limits=RolloutLimits(max_turns=3))
    there = run_eval(**args, out_dir=tmp_path / "ray", limits=RolloutLimits(max_turns=3, max_open=2),
                     scale=ScaleConfig(ray="auto", workers=2))
    assert there["n_episodes"] == here["n_episodes"] == 4
    ray_episodes = _episodes(tmp_path / "ray")
    assert all(e["prompt_ids"] and e["tokens_generated"] > 0 for e in ray_episodes.values())  # token-exact replicas
    # Same model, same settings; not compared token for token: batches of other sizes round differently.
    assert {e["model"] for e in ray_episodes.values()} == {e["model"] for e in _episodes(tmp_path / "here").values()}


def test_ray_workers_play_tool_calls_in_the_models_family_format(local_ray, tmp_path: Path):
    """`--ray` with a Llama 3 model and `format=tool_call`: this process loads no model, yet the workers' envs read
    the family's format (before, each worker refused the episode in one line: the env read Qwen3's)."""
    from turnforge.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny-llama3", family="llama3")
    summary = run_eval(env="household", env_options={"format": "tool_call"}, policy_spec="hf", split="test", n_tasks=2,
                       samples=1, seed=0, model=str(model), out_dir=tmp_path / "ray", policy_options={"device": "cpu"},
                       limits=RolloutLimits(max_turns=2), scale=ScaleConfig(ray="auto", workers=1))
    assert summary["n_episodes"] == 2 and summary["stop_reasons"].get("env_error", 0) == 0
    assert summary["env_options"]["format"] == "tool_call:llama3"
