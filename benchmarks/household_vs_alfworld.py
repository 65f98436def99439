"""Household (native) vs the real ALFWorld engine: the same exported tasks, the same expert plans.

Exports the first N test tasks as ALFWorld games, takes the native expert's plan for each, then steps
that plan through both engines (reset included, planner off in ALFWorld: policy_commands are not
requested), checks the transcripts are identical, and prints steps/s of each and the ratio.

    .venv/bin/python benchmarks/household_vs_alfworld.py --tasks 24
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.household.alfworld_engine import normalize_observation
from turnforge.envs.household.export import export_games
from turnforge.types import Message


def play(env, task, plan: list[str], normalize) -> tuple[list[str], float]:
    """Reset and step the plan; returns the transcript and the seconds spent in step() alone."""
    transcript = [normalize(env.reset(task)[1].content)]
    start = time.perf_counter()
    for command in plan:
        result = env.step(Message("assistant", command))
        transcript.append(normalize(result.messages[0].content))
    return transcript, time.perf_counter() - start


def timed(env, tasks, plans, repeats: int, normalize=lambda s: s):
    """(steps/s with resets counted, steps/s of step() alone, transcripts)."""
    start, steps, step_s, transcripts = time.perf_counter(), 0, 0.0, []
    for _ in range(repeats):
        transcripts = []
        for task, plan in zip(tasks, plans, strict=True):
            transcript, seconds = play(env, task, plan, normalize)
            transcripts.append(transcript)
            steps += len(plan)
            step_s += seconds
    return steps / (time.perf_counter() - start), steps / step_s, transcripts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--native-repeats", type=int, default=50)
    args = parser.parse_args()

    tasks = load_tasks("household", "test", limit=args.tasks)
    native = make_env("household", grammar="0.4")
    plans = []
    for task in tasks:
        native.reset(task)
        plan, result = [], None
        while result is None or not result.done:
            plan.append(native.expert_reply().content)
            result = native.step(Message("assistant", plan[-1]))
        plans.append(plan)

    with tempfile.TemporaryDirectory() as out:
        export_games(tasks, out)
        games = load_tasks("alfworld", "test", data_dir=out)
        by_id = {g.id: g for g in games}
        real = make_env("alfworld", planner=False)
        real_sps, real_step_sps, real_transcripts = timed(real, [by_id[t.id] for t in tasks], plans, 1, normalize_observation)

    native_sps, native_step_sps, native_transcripts = timed(native, tasks, plans, args.native_repeats)
    identical = native_transcripts == real_transcripts
    row = {
        "tasks": len(tasks),
        "steps_per_task": round(sum(map(len, plans)) / len(plans), 1),
        "alfworld_steps_per_s": round(real_sps, 1),
        "household_steps_per_s": round(native_sps, 1),
        "ratio": round(native_sps / real_sps, 1),
        "alfworld_step_only_per_s": round(real_step_sps, 1),
        "household_step_only_per_s": round(native_step_sps, 1),
        "ratio_step_only": round(native_step_sps / real_step_sps, 1),
        "identical_transcripts": identical,
    }
    print(f"{'engine':<22}{'steps/s (with reset)':>22}{'steps/s (step only)':>22}")
    print(f"{'alfworld (TextWorld)':<22}{real_sps:>22.1f}{real_step_sps:>22.1f}")
    print(f"{'household (native)':<22}{native_sps:>22.1f}{native_step_sps:>22.1f}")
    print(f"ratio {row['ratio']}x with resets, {row['ratio_step_only']}x step only, on {len(tasks)} tasks; "
          f"identical transcripts: {identical}")
    print(json.dumps(row))
    if not identical:
        raise SystemExit("transcripts differ: the speed comparison is void")


if __name__ == "__main__":
    main()
