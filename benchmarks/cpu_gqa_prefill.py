"""Generating on a CPU: transformers' SDPA attention (every key/value head copied per query head, `repeat_kv`, in
each call that encodes more than one token under a mask) vs turnforge's (`models.attention.cpu_gqa`: the grouped
heads passed to SDPA as they are, `enable_gqa`).

An evaluation as the quickstart runs it: the given model, greedy, `--tasks` household test tasks all in one batch,
the hf policy with its prefix cache (each turn encodes the new observation over the episode's cached keys/values).
The two ways alternate `--repeats` times in one process; the time inside the model's forward is split between
encoding (prefill: more than one new token a row) and decoding steps (one).

    .venv/bin/python benchmarks/cpu_gqa_prefill.py --model runs/quickstart/stages/02-sft/model
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

from forward_timing import timed_forward
from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import hf
from turnforge.policies.base import SamplingParams
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits, run_episodes

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.tasks, **QUICKSTART_ENV)
    policy = hf.HFPolicy(args.model, device="cpu", dtype="float32", batch_size=args.tasks)
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    attention = hf.cpu_gqa
    ways = {"transformers' sdpa (repeat_kv)": lambda model: contextlib.nullcontext(),
            "grouped heads in SDPA (turnforge)": attention}
    results = {w: {"wall_s": 0.0, "prefill_s": 0.0, "decode_s": 0.0, "episodes": None} for w in ways}
    for _ in range(args.repeats):
        for way, context in ways.items():
            hf.cpu_gqa = context
            start = time.perf_counter()
            with torch.inference_mode(), timed_forward(policy.model) as seconds:
                trajs = run_episodes(policy, lambda: make_env("household", **QUICKSTART_ENV), tasks, 1,
                                     RolloutLimits(max_open=args.tasks), params, renderer=policy.renderer,
                                     progress=False)
            r = results[way]
            r["wall_s"] += time.perf_counter() - start
            for key in ("prefill_s", "decode_s"):
                r[key] += seconds[key]
            replies = [[t.generated_ids for t in traj.turns] for traj in sorted(trajs, key=lambda t: t.task_id)]
            r["episodes"] = r["episodes"] or replies
            r["success"] = sum(t.score.success for t in trajs) / len(trajs)
    hf.cpu_gqa = attention
    first, second = (results[w]["episodes"] for w in ways)
    same = sum(a == b for a, b in zip(first, second, strict=True))
    print(f"{args.tasks} test tasks, greedy; episodes with the same replies both ways: {same} of {len(first)}\n")
    print("| way | wall per evaluation (s) | in prefill (s) | in decoding steps (s) | success |")
    print("|---|---:|---:|---:|---:|")
    n = args.repeats
    for way, r in results.items():
        print(f"| {way} | {r['wall_s'] / n:.2f} | {r['prefill_s'] / n:.2f} | {r['decode_s'] / n:.2f} | "
              f"{r['success']:.3f} |")
    print(json.dumps({w: {k: v for k, v in r.items() if k != "episodes"} for w, r in results.items()}))


if __name__ == "__main__":
    main()
