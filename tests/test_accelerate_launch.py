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


EVERY_STAGE = """\
name = "every-stage"

[model]
name = "{model}"

[env]
name = "household"
format = "act_line"

[env.options]
max_steps = 3

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
batch_size = {sft_batch}
max_length = 512
logging_steps = 1
learning_rate = 1e-3
packing = "prefix"
{more}
"""

OFFLINE = """
[[stages]]
kind = "dpo"
data = ["collect-mistakes"]
max_steps = 2
batch_size = {batch}
max_length = 512
logging_steps = 1
learning_rate = 1e-3

[[stages]]
kind = "rft"
model = "base"
tasks = 4
samples = 2
max_new_tokens = 12
keep = "best"
min_progress = 0.0
train = {{ max_steps = 2, learning_rate = 1e-2, batch_size = {batch}, max_length = 1024 }}
"""

TRAINING = """
[[stages]]
kind = "grpo"
model = "base"
{grpo}

[[stages]]
kind = "grpo"
name = "credit"
model = "base"
dynamic_sampling = true
step_advantage_weight = 1.0
trl = {{ activation_checkpointing = true }}
{grpo}

[[stages]]
kind = "grpo"
name = "async"
model = "base"
max_staleness = 1
{grpo}

[[stages]]
kind = "envtune"
model = "base"
tasks = 8
tasks_per_step = 2
num_generations = 2
max_new_tokens = 12
learning_rate = 1e-2
rewards = {{ outcome = 1.0, format = 1.0, tool_call = 1.0 }}
[[stages.phases]]
name = "hints"
steps = 1
env = {{ hints = true }}
[[stages.phases]]
name = "plain"
steps = 1

[[stages]]
kind = "distill"
model = "base"
teacher = "sft"
steps = 2
tasks = 8
tasks_per_step = 2
num_generations = 2
max_new_tokens = 12
learning_rate = 1e-3

[[stages]]
kind = "eval"
model = "grpo"
tasks = 2
max_new_tokens = 12
"""

GRPO_FIELDS = """steps = 2
tasks = 8
tasks_per_step = 2
num_generations = 2
max_new_tokens = 12
learning_rate = 1e-2
rewards = { outcome = 1.0, format = 1.0, tool_call = 1.0 }"""


def test_every_training_stage_over_two_processes(household_sft_model_dir: Path, tmp_path: Path):
    """`accelerate launch` (DDP, 2 gloo processes) of `turnforge run` on a recipe with every stage that trains: sft,
    dpo, rft's training, grpo (plain; checkpointing + dynamic sampling + GiGPO step credit; async k = 1), envtune and
    distill, then an eval. Exit 0 on both; each process played its own episodes; a step is the recipe's global batch
    (tasks_per_step x num_generations episodes over both); the files count the gathered episodes; one process
    printed and wrote. SFT's, DPO's and RFT's training losses equal one process's on the same global batch (2 + 2 rows
    = 4 rows)."""
    recipe = tmp_path / "every.toml"
    recipe.write_text(EVERY_STAGE.format(model=household_sft_model_dir, sft_batch=2,
                                         more=OFFLINE.format(batch=1) + TRAINING.format(grpo=GRPO_FIELDS)))
    out, ranks = tmp_path / "run", tmp_path / "ranks"
    ranks.mkdir()
    script = Path(__file__).parent / "launched" / "run_cli_ranks.py"
    done = _launch(str(script), str(ranks), "run", str(recipe), "--out", str(out), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    seen = [json.loads((ranks / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["world_size"] for s in seen] == [2, 2] and seen[0]["backend"] == "gloo"
    stages = {p.parent.name.split("-", 1)[1]: json.loads(p.read_text())["result"]
              for p in (out / "stages").glob("*/done.json")}
    assert set(stages) >= {"sft", "dpo", "rft", "grpo", "grpo-credit", "grpo-async", "envtune", "distill"}, stages

    # Each process played episodes of its own: TRL hands each its share of a step's groups (different tasks); the
    # async workers draw their own tasks, with their own seeds.
    # (keyed by the folder the rollouts log to: a stage's, or an envtune phase's)
    played = [{folder.split("-", 1)[1]: p for folder, p in s["played"].items()} for s in seen]
    assert set(played[0]) == set(played[1]) == {"grpo", "grpo-credit", "grpo-async", "hints", "plain", "distill"}
    for stage in played[0]:
        mine, theirs = ({(task, tuple(ids)) for task, ids in p[stage]} for p in played)
        assert mine and theirs and not mine & theirs, stage  # no episode played by both
        if stage not in ("grpo-credit", "grpo-async"):  # (their replacement / own draws may meet a task again)
            assert not {t for t, _ in mine} & {t for t, _ in theirs}, stage  # TRL's shards: different tasks

    # A step = tasks_per_step x num_generations = 4 episodes over both processes; the files count them gathered.
    for stage in ("grpo", "grpo-credit", "grpo-async"):
        lines = [json.loads(x) for x in next((out / "stages").glob(f"*-{stage}/rollouts.jsonl")).read_text().splitlines()]
        assert [x["episodes"] for x in lines] == [4, 4], stage
        assert stages[stage]["episodes"] == 8 and stages[stage]["steps"] == 2
        assert sum(len(p[stage]) for p in played) == 8 or stage == "grpo-credit"  # + dynamic sampling's re-plays
    async_ids = [uid for x in (json.loads(line) for line in next((out / "stages").glob("*-grpo-async/rollouts.jsonl"))
                                .read_text().splitlines()) for uid in x["group_ids"]]
    assert any(uid.endswith("/1") for uid in async_ids) and any("/" not in uid for uid in async_ids)

    # One process printed: the comparison table and the closing line once (both processes' stdout is this pipe).
    assert done.stdout.count("wrote ") == 1 and done.stdout.count("every-stage: evaluation") == 1, done.stdout

    # SFT, DPO and RFT's training over 2 processes x n rows = one process with 2n rows: the same loss, step by step
    # (TRL averages tokens over the processes; rft's sampling is the main process's, so its kept episodes are too).
    alone = tmp_path / "alone.toml"
    alone.write_text(EVERY_STAGE.format(model=household_sft_model_dir, sft_batch=4, more=OFFLINE.format(batch=2)))
    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    single = run_recipe(load_recipe(alone), tmp_path / "alone", console=None)["stages"]
    for stage in ("sft", "dpo", "rft"):
        assert single[stage]["result"]["train_loss"] == pytest.approx(stages[stage]["train_loss"], rel=1e-4), stage


def test_a_launch_asked_for_two_processes_that_starts_one_is_refused(tmp_path: Path):
    """`accelerate launch --cpu --num_processes 2` runs the command once: its first line says so, nothing runs."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    command = [accelerate, "launch", "--cpu", "--num_processes", "2", "-m", "turnforge", "run", "quickstart",
               "--out", str(tmp_path / "qs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    # turnforge's first line (after accelerate's own notes on its defaults); accelerate then exits 1 with its traceback
    assert done.returncode != 0 and done.stdout == "", done.stdout[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert ours[0].startswith("error: accelerate launch was asked for several processes but started one"), done.stderr
    assert not (tmp_path / "qs").exists()


def test_an_fsdp_launch_on_cpu_processes_is_refused(tmp_path: Path):
    """accelerate makes FSDP of GPU process groups only: on CPU processes configs/accelerate/fsdp.yaml would train as
    DDP. Refused, in one line from the main process; nothing runs."""
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    command = [accelerate, "launch", "--config_file", str(CONFIGS / "fsdp.yaml"), "--num_processes", "2",
               "--main_process_port", "29518", "-m", "turnforge", "run", "quickstart", "--out", str(tmp_path / "qs")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert ours == ["error: an FSDP launch on a machine without a GPU would train as DDP (accelerate turns FSDP on "
                    "for GPU processes only): on a CPU launch with configs/accelerate/ddp.yaml"], done.stderr[-2000:]
    assert not (tmp_path / "qs").exists()


def test_main_process_work_forgets_the_last_trainers_zero3_config():
    """A ZeRO-3 trainer leaves transformers' global DeepSpeed config set: a model the main process then loads alone
    would be partitioned with collectives the waiting processes never join. `forget_zero3` (run by every process as
    `main_process_result` starts) drops it, through transformers' own setter (which must keep existing)."""
    from transformers.integrations import deepspeed

    from turnforge.launch import forget_zero3

    class Zero3:
        def is_zero3(self) -> bool:
            return True

    config = Zero3()
    deepspeed.set_hf_deepspeed_config(config)
    assert deepspeed.is_deepspeed_zero3_enabled()
    forget_zero3()
    assert not deepspeed.is_deepspeed_zero3_enabled()
