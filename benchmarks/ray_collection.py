"""Env-bound collection on 1..N Ray workers vs the in-process run, on this machine, in one run.

The household env with `step_delay_ms` (each step sleeps, standing in for a sandbox or a simulated user) and the
expert policy: the time goes to the env, not to a model. Every run is `run_eval` end to end (episodes.jsonl
written and fsynced as each episode finishes), with `--limit-open` episodes open per process (the concurrency one
worker has, like one replica's batch or one sandbox pool). Rows:

  in-process, limit_open=M        the default: one process, M episodes at once (env steps in M threads);
  ray, W workers x M              W Ray actors (`--ray auto --workers W`), each with M open episodes;
  in-process, limit_open=W_max*M  one process with as many open episodes as the widest Ray row, for honesty:
                                  on ONE machine a sleep-bound env scales with threads too; Ray's point is
                                  going past one machine (and past one process's GIL for CPU-bound envs).

Ray rows include starting their actors (a Ray instance is started once, before them, and timed apart). Every
row's episodes are checked to equal the in-process ones (timings aside).

    nice .venv/bin/python benchmarks/ray_collection.py                  # ~1.5 min on 2 CPU cores
    nice .venv/bin/python benchmarks/ray_collection.py --workers 1 2 4 8 --tasks 64 --delay-ms 100 --limit-open 4
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import ray

from turnforge.rollout import RolloutLimits
from turnforge.rollouts_file import run_eval
from turnforge.rundir import EPISODES_FILE
from turnforge.scale import ScaleConfig


def collect(out: Path, tasks: int, delay_ms: int, limit_open: int, scale: ScaleConfig | None) -> tuple[float, dict]:
    started = time.perf_counter()
    run_eval("household", {"step_delay_ms": delay_ms}, "expert", "train", tasks, 1, 0, out,
             limits=RolloutLimits(max_open=limit_open), scale=scale)
    wall = time.perf_counter() - started
    episodes = {}
    for line in (out / EPISODES_FILE).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        record.pop("timings")
        episodes[(record["task_id"], record["sample"])] = record
    return wall, episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--delay-ms", type=int, default=100)
    parser.add_argument("--limit-open", type=int, default=4)
    args = parser.parse_args()
    widest = max(args.workers)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = []
        base_wall, base = collect(root / "in-process", args.tasks, args.delay_ms, args.limit_open, None)
        rows.append((f"in-process, limit_open={args.limit_open}", base_wall, True))

        started = time.perf_counter()
        # Logical CPUs: the workers sleep on the env, so a quarter CPU each (worker_cpus) is plenty.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray_start = time.perf_counter() - started
        for w in args.workers:
            scale = ScaleConfig(ray="auto", workers=w, worker_cpus=2 / widest)
            wall, episodes = collect(root / f"ray-{w}", args.tasks, args.delay_ms, args.limit_open, scale)
            rows.append((f"ray, {w} worker{'s' * (w > 1)} x {args.limit_open} open", wall, episodes == base))
        ray.shutdown()

        wide_wall, wide = collect(root / "in-process-wide", args.tasks, args.delay_ms, widest * args.limit_open, None)
        rows.append((f"in-process, limit_open={widest * args.limit_open}", wide_wall, wide == base))

    steps = sum(e["env_steps"] for e in base.values())
    print(f"household expert, {args.tasks} episodes, {steps} env steps x {args.delay_ms} ms sleep "
          f"({steps * args.delay_ms / 1000:.1f} s of env time); Ray instance start {ray_start:.1f} s (not in rows)")
    print(f"{'run':<34} {'wall s':>7} {'episodes/s':>11} {'vs in-process':>14} {'same episodes':>14}")
    for name, wall, same in rows:
        print(f"{name:<34} {wall:>7.2f} {args.tasks / wall:>11.2f} {base_wall / wall:>13.2f}x {str(same):>14}")


if __name__ == "__main__":
    main()
