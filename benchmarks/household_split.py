"""Generating the household splits: each task type's goal choices computed once (`scene.goal_options`, cached)
vs once per task (the cache cleared before every task, as the generator did before).

Both ways generate the same train and test splits (the quickstart's knobs) in one process, alternating, and the
tasks are checked equal.

    .venv/bin/python benchmarks/household_split.py --repeats 3
"""

from __future__ import annotations

import argparse
import time

from turnforge.envs.household import scene

KNOBS = scene.Knobs(receptacles=0.3, distractors=0)


def per_task() -> list[dict]:
    """The peer: the goal choices listed anew for every task."""
    tasks = []
    for split in ("train", "test"):
        for i in range(scene.SPLIT_SIZES[split]):
            scene.goal_options.cache_clear()
            tasks.append(scene.generate_task(split, i, 0, KNOBS))
    return tasks


def cached() -> list[dict]:
    scene.goal_options.cache_clear()  # each repeat pays for the first listing again
    return [t for split in ("train", "test") for t in scene.generate_split(split, None, 0, KNOBS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    seconds = {"listed once per task": 0.0, "cached per task type (turnforge)": 0.0}
    results = {}
    for _ in range(args.repeats):
        for way, run in zip(seconds, (per_task, cached), strict=True):
            start = time.perf_counter()
            results[way] = run()
            seconds[way] += time.perf_counter() - start
    first, second = results.values()
    assert first == second, "the two ways generated different tasks"
    n = len(first)
    base = seconds["listed once per task"]
    print(f"| way | s for the train and test splits ({n:,} tasks) | ratio |")
    print("|---|---:|---:|")
    for way, s in seconds.items():
        print(f"| {way} | {s / args.repeats:.2f} | {base / s:.1f}× |")


if __name__ == "__main__":
    main()
