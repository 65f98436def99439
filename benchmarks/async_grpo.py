"""Asynchronous vs synchronous GRPO (issue 61): k = max_staleness 0, 1, 2 on household with long-tailed env waits.

Each setting trains the tiny model (built offline) with `run_grpo` for `--steps` steps on household, every episode's
env steps sleeping a wait drawn once per episode from a log-normal distribution (median `--median-ms`, sigma
`--sigma`: with 1.5, one episode in ten waits ~7x the median a step, one in a hundred ~33x), seeded by the task id
and sample so that k = 0 and k = 1 see the same waits for the same episodes. Figures per run:

- episodes trained per minute (the episodes TRL trained / the training's wall time);
- trainer idle share: the time `rollout_func` blocked the step (k = 0: the whole rollout; k > 0: the wait for
  finished groups), over the wall time;
- generator idle share: 1 - the time at least one group was playing, over the wall time (k = 0: 1 - the rollouts' time);
- the drawn-task reward per step (rollouts.jsonl's `drawn_reward`).

k = 0 runs with two seeds, so the seed-to-seed spread of the reward curve is known.

    .venv/bin/python benchmarks/async_grpo.py --steps 12 --out /tmp/async_grpo.json

Measure on a quiet machine only: the figures are wall-time ratios, and another process on the cores moves them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import tempfile
import time
from pathlib import Path

from turnforge.envs.base import load_tasks
from turnforge.envs.household.env import HouseholdEnv
from turnforge.machine import machine_info
from turnforge.recipes import load_recipe
from turnforge.tiny_model import build_tiny_model
from turnforge.train.grpo import GRPOSettings, run_grpo

ENV = {"format": "act_line", "max_steps": 6, "step_delay_ms": 1}  # > 0: env steps run in worker threads


def long_tailed_waits(median_ms: float, sigma: float) -> None:
    """Each household episode's steps sleep a log-normal wait drawn from its task id (and reset count)."""
    reset = HouseholdEnv.reset
    counts: dict[str, int] = {}

    def drawn_reset(self, task):
        n = counts[task.id] = counts.get(task.id, 0) + 1
        seed = int(hashlib.sha256(f"{task.id}:{n}".encode()).hexdigest()[:12], 16)
        self.step_delay_s = median_ms / 1000 * math.exp(sigma * random.Random(seed).gauss(0.0, 1.0))
        return reset(self, task)

    HouseholdEnv.reset = drawn_reset


# With a trained start model (`--model`, e.g. the quickstart's SFT model): the env it learnt, its episodes cut at 10
# steps, and the quickstart's GRPO reward (success + 0.5 x subgoal progress), so that rewards differ within groups.
TRAINED_ENV = {**load_recipe("quickstart").env_options(), "max_steps": 10, "step_delay_ms": 1}


def one_run(model: Path, k: int, seed: int, steps: int, out: Path, trained: bool) -> dict:
    env = TRAINED_ENV if trained else ENV
    tasks = load_tasks("household", "train", limit=32, **{k_: v for k_, v in env.items() if k_ != "step_delay_ms"})
    rewards = {"outcome": 1.0, "progress": 0.5} if trained else {"outcome": 1.0, "format": 1.0, "tool_call": 1.0}
    settings = GRPOSettings(steps=steps, tasks_per_step=2, num_generations=4, max_new_tokens=48 if trained else 16,
                            learning_rate=1e-4 if trained else 1e-3, seed=seed, max_staleness=k, rewards=rewards)
    started = time.perf_counter()
    result = run_grpo(str(model), "household", env, tasks, out, settings)
    wall = time.perf_counter() - started
    lines = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    waited = sum(x.get("trainer_wait_s", x["wall_s"]) for x in lines)
    busy = lines[-1]["generator_busy_s"] if k else sum(x["wall_s"] for x in lines)
    return {
        "k": k, "seed": seed, "steps": result["steps"], "episodes": result["episodes"], "wall_s": round(wall, 1),
        "episodes_per_min": round(result["episodes"] / wall * 60, 2),
        "trainer_idle_share": round(waited / wall, 3),
        "generator_idle_share": round(max(0.0, 1 - busy / wall), 3),
        "drawn_reward": [round(x["drawn_reward"], 4) for x in lines],
        "stale_dropped_groups": sum(x.get("stale_dropped_groups", 0) for x in lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--median-ms", type=float, default=40.0)
    parser.add_argument("--sigma", type=float, default=1.5)
    parser.add_argument("--runs", default="0:0,0:1,1:0,2:0", help="k:seed pairs")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--model", type=Path, default=None,
                        help="a start model trained on household (the quickstart's SFT model); default: the untrained tiny")
    args = parser.parse_args()
    long_tailed_waits(args.median_ms, args.sigma)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_tiny_model(Path(tmp) / "tiny")
        for pair in args.runs.split(","):
            k, seed = (int(x) for x in pair.split(":"))
            rows.append(one_run(model, k, seed, args.steps, Path(tmp) / f"k{k}-s{seed}", args.model is not None))
            print(json.dumps(rows[-1]), flush=True)
    report = {"machine": machine_info(), "env": TRAINED_ENV if args.model else ENV, "model": str(args.model), "waits": {"median_ms": args.median_ms, "sigma": args.sigma},
              "rows": rows}
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
