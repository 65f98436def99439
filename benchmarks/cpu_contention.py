"""The CPU path alone vs beside one busy process (`yes > /dev/null`): the hf eval and a fixed number of SFT steps.

Each workload runs as a user runs it, in a process of its own: `turnforge eval --env household --policy hf --model
TINY --tasks 10` (the whole invocation timed) and the quickstart's SFT stage for `--sft-steps` steps on expert
episodes (`turnforge run` with `--restart-from sft`; the stage's wall time from its done.json). Each runs alone and
beside one `yes > /dev/null`, under each thread setting (`--settings`), alternating, in one run:

- `torch`: torch's own default, one OpenMP thread per core (`OMP_NUM_THREADS` = the cores; what turnforge did);
- `turnforge`: turnforge's default (`turnforge.machine.cpu_threads`: the cores other processes leave free);
- `1`: one thread (`OMP_NUM_THREADS=1`);
- `torch, passive`: torch's count with OpenMP's waiting threads asleep at once (`OMP_WAIT_POLICY=PASSIVE`).

    .venv/bin/python benchmarks/cpu_contention.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from turnforge.machine import machine_info
from turnforge.tiny_model import build_tiny_model

TURNFORGE = str(Path(sys.executable).with_name("turnforge"))
CORES = len(os.sched_getaffinity(0))
SETTINGS = {"torch": {"OMP_NUM_THREADS": str(CORES)}, "turnforge": {}, "1": {"OMP_NUM_THREADS": "1"},
            "torch, passive": {"OMP_NUM_THREADS": str(CORES), "OMP_WAIT_POLICY": "PASSIVE"}}

SFT_RECIPE = """
name = "cpu_contention_sft"
[model]
name = "{model}"
[env]
name = "household"
format = "act_line"
[env.options]
grammar = "0.3"
expert = "explorer"
receptacles = 0.3
distractors = 0
thoughts = "goal"
max_steps = 30
[[stages]]
kind = "collect"
name = "collect"
policy = "expert"
split = "train"
tasks = 400
[[stages]]
kind = "sft"
name = "sft"
data = ["collect"]
max_steps = {steps}
learning_rate = 3e-3
batch_size = 8
max_length = 1024
warmup_ratio = 0.05
logging_steps = 5
packing = "prefix"
trl = {{ bf16 = true }}
"""


def environment(setting: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    return env | SETTINGS[setting]


def run_eval(model: str, out: Path, setting: str) -> float:
    """Seconds of the whole `turnforge eval` invocation."""
    started = time.perf_counter()
    subprocess.run([TURNFORGE, "eval", "--env", "household", "--policy", "hf", "--model", model, "--tasks", "10",
                    "--out", str(out)], check=True, env=environment(setting), capture_output=True)
    return time.perf_counter() - started


def run_sft(recipe: Path, out: Path, setting: str) -> float:
    """Seconds of the SFT stage (its done.json), the collected episodes reused."""
    subprocess.run([TURNFORGE, "run", str(recipe), "--out", str(out), "--restart-from", "sft"], check=True,
                   env=environment(setting), capture_output=True)
    return json.loads((out / "stages" / "02-sft" / "done.json").read_text())["wall_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--settings", nargs="+", default=["torch", "turnforge"], choices=sorted(SETTINGS))
    parser.add_argument("--workloads", nargs="+", default=["eval", "sft"], choices=["eval", "sft"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = str(build_tiny_model(root / "tiny"))
        recipe = root / "sft.toml"
        recipe.write_text(SFT_RECIPE.format(model=model, steps=args.sft_steps))
        subprocess.run([TURNFORGE, "run", str(recipe), "--out", str(root / "sft")], check=True, capture_output=True)
        times: dict[tuple[str, str, str], list[float]] = {}
        for r in range(args.rounds):
            for workload in args.workloads:
                for setting in args.settings:
                    for load in ("alone", "beside yes"):
                        busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if load != "alone" else None
                        try:
                            seconds = (run_eval(model, root / f"eval-{r}-{setting}-{load}", setting)
                                       if workload == "eval" else run_sft(recipe, root / "sft", setting))
                        finally:
                            if busy:
                                busy.kill()
                                busy.wait()
                        times.setdefault((workload, setting, load), []).append(seconds)
                        print(json.dumps({"workload": workload, "setting": setting, "load": load,
                                          "seconds": round(seconds, 1)}), flush=True)
    print(f"\n{json.dumps(machine_info())}\n")
    print("| workload | threads | alone (s) | beside `yes` (s) | beside / alone |")
    print("|---|---|---|---|---:|")
    for workload in args.workloads:
        for setting in args.settings:
            alone, beside = times[(workload, setting, "alone")], times[(workload, setting, "beside yes")]
            print(f"| {workload} | {setting} | {', '.join(f'{t:.1f}' for t in alone)} | "
                  f"{', '.join(f'{t:.1f}' for t in beside)} | {min(beside) / min(alone):.2f}x |")


if __name__ == "__main__":
    main()
