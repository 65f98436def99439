"""A recipe under `accelerate launch` with 2 CPU processes (gloo): SFT and DPO steps spread over both, which agree on
the loss; the stages that do not train run on the main process alone; only it writes the run directory's files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).parents[1] / "configs" / "accelerate"

RECIPE = """\
name = "two-processes"

[model]
name = "{model}"

[env]
name = "household"
format = "act_line"

[[stages]]
kind = "collect"
tasks = 8

[[stages]]
kind = "collect"
name = "mistakes"
policy = "random"
tasks = 4

[[stages]]
kind = "sft"
data = ["collect"]
max_steps = 2
batch_size = 2
max_length = 512
logging_steps = 1

[[stages]]
kind = "dpo"
data = ["collect-mistakes"]
max_steps = 1
batch_size = 1
max_length = 512
logging_steps = 1

[[stages]]
kind = "eval"
policy = "random"
tasks = 2
"""


@pytest.mark.parametrize("name", ["ddp", "fsdp", "deepspeed_zero2", "deepspeed_zero3"])
def test_the_shipped_accelerate_configs_load(name: str):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert config.distributed_type.value == {"ddp": "MULTI_GPU", "fsdp": "FSDP"}.get(name, "DEEPSPEED")


def _launch(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    command = [accelerate, "launch", "--config_file", str(CONFIGS / "ddp.yaml"), "--num_processes", "2",
               "--main_process_port", "29517", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # ~50 s: two processes each import torch and TRL, twice
def test_sft_and_dpo_steps_over_two_processes(tiny_model_dir: Path, tmp_path: Path):
    recipe = tmp_path / "two.toml"
    recipe.write_text(RECIPE.format(model=tiny_model_dir))
    out, ranks = tmp_path / "run", tmp_path / "ranks"
    ranks.mkdir()
    script = Path(__file__).parent / "launched" / "run_recipe_ranks.py"
    done = _launch(str(script), str(recipe), str(out), str(ranks))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    seen = [json.loads((ranks / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["world_size"] for s in seen] == [2, 2] and seen[0]["backend"] == "gloo"
    main, other = (s["results"] for s in seen)
    for stage in ("sft", "dpo"):
        assert main[stage]["steps"] == other[stage]["steps"] == {"sft": 2, "dpo": 1}[stage]
        assert main[stage]["train_loss"] == pytest.approx(other[stage]["train_loss"], abs=1e-6)
    assert main["eval"] == other["eval"]  # the main process's evaluation, handed to the other one

    # One writer: one metrics line per step (not one per process), every stage done once, the lock released.
    done_files = sorted(p.parent.name for p in (out / "stages").glob("*/done.json"))
    assert done_files == ["01-collect", "02-collect-mistakes", "03-sft", "04-dpo", "05-eval"]
    assert len((out / "stages" / "03-sft" / "metrics.jsonl").read_text().splitlines()) == 2
    assert (out / "summary.json").exists() and (out / "eval" / "eval" / "episodes.jsonl").exists()

    # The same command again resumes: every stage skipped, the run directory's lock taken and released again.
    again = _launch(str(script), str(recipe), str(out), str(ranks))
    assert again.returncode == 0, again.stderr[-3000:]
    for r in (0, 1):
        resumed = json.loads((ranks / f"rank{r}.json").read_text())
        assert set(resumed["status"].values()) == {"skipped"}
        assert resumed["results"]["sft"]["train_loss"] == main["sft"]["train_loss"]  # read from main's done.json
