"""Top-p on a CPU: the hf policy's `TopP` (the nucleus looked for among each row's 64 most likely tokens) vs
transformers' `TopPLogitsWarper` (the whole vocabulary sorted at every decoding step).

A sampled rollout as the quickstart's RFT and GRPO stages run them: the given model, temperature 1, top_p 0.9,
`--tasks` household train tasks x `--samples` episodes in one batch. The two ways alternate `--repeats` times in
one process; the seconds inside the top-p processor and the rollout's wall are summed per way, and the episodes of
the two ways are compared (the same kept tokens give the same seeded draws, so they must be equal).

    .venv/bin/python benchmarks/top_p.py --model runs/quickstart/stages/05-rft/model
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import TopPLogitsWarper

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import hf
from turnforge.policies.base import SamplingParams
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits, run_episodes

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def timed(cls, seconds: dict[str, float]):
    """`cls` whose calls add their seconds to `seconds["top_p_s"]`."""

    class Timed(cls):
        def __call__(self, input_ids, scores):
            start = time.perf_counter()
            out = super().__call__(input_ids, scores)
            seconds["top_p_s"] += time.perf_counter() - start
            return out

    return Timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tasks = load_tasks("household", "train", limit=args.tasks, **QUICKSTART_ENV)
    width = args.tasks * args.samples
    policy = hf.HFPolicy(args.model, device="cpu", dtype="float32", batch_size=width)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=48, seed=7)
    ours = hf.TopP
    ways = {"transformers' TopPLogitsWarper (whole vocabulary sorted)": TopPLogitsWarper,
            "TopP (the 64 most likely tokens first, turnforge)": ours}
    results = {w: {"wall_s": 0.0, "top_p_s": 0.0} for w in ways}
    episodes = {}
    for _ in range(args.repeats):
        for way, cls in ways.items():
            seconds = {"top_p_s": 0.0}
            hf.TopP = timed(cls, seconds)
            start = time.perf_counter()
            with torch.inference_mode():
                trajs = run_episodes(policy, lambda: make_env("household", **QUICKSTART_ENV), tasks, args.samples,
                                     RolloutLimits(max_open=width), params, renderer=policy.renderer, progress=False)
            results[way]["wall_s"] += time.perf_counter() - start
            results[way]["top_p_s"] += seconds["top_p_s"]
            episodes[way] = sorted((t.task_id, t.sample, [x.generated_ids for x in t.turns]) for t in trajs)
            results[way]["tokens"] = sum(len(x.generated_ids) for t in trajs for x in t.turns)
    hf.TopP = ours
    first, second = episodes.values()
    same = sum(a == b for a, b in zip(first, second, strict=True))
    print(f"{args.tasks} train tasks x {args.samples} samples, temperature 1, top_p 0.9; episodes with the same "
          f"replies both ways: {same} of {len(first)}\n")
    print("| way | wall a rollout (s) | in top-p (s) | tokens generated |")
    print("|---|---:|---:|---:|")
    n = args.repeats
    for way, r in results.items():
        print(f"| {way} | {r['wall_s'] / n:.2f} | {r['top_p_s'] / n:.2f} | {r['tokens']} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
