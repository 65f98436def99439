"""GRPO's rollouts on a CPU: the model in its own dtype (turnforge, `train.grpo_rollouts.own_precision`) vs under the bf16
autocast accelerate wraps a mixed-precision model's forward in (what TRL's own generation runs).

The quickstart's GRPO batch: 4 train tasks x 8 episodes, temperature 1, top_p 0.9, with the given model prepared by
accelerate for bf16 mixed precision, as the GRPO trainer prepares it. Each way plays the same batch `--repeats`
times, the two ways alternating, in one process. Sampling is seeded, but the two ways compute in different
precisions, so their episodes can differ in length: the per-decoding-step time is the like-for-like figure, and
the wall per batch is printed beside the tokens generated.

    .venv/bin/python benchmarks/grpo_rollout_precision.py --model runs/quickstart/stages/05-rft/model
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import time

import torch
from accelerate import Accelerator

from forward_timing import timed_forward
from turnforge.envs.base import load_tasks, make_env
from turnforge.models import load_model
from turnforge.policies.base import SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.grpo_rollouts import own_precision

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    model = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(model)
    model.eval()
    tasks = load_tasks("household", "train", limit=4, **QUICKSTART_ENV)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=48, seed=7)
    ways = {"bf16 autocast (accelerate's wrapper)": contextlib.nullcontext, "own dtype, float32 (turnforge)":
            functools.partial(own_precision, model)}
    results: dict[str, dict[str, float]] = {w: {"wall_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "tokens": 0}
                                            for w in ways}
    for _ in range(args.repeats):
        for way, context in ways.items():
            with context(), timed_forward(model) as steps:
                policy = HFPolicy.from_model(model, tokenizer, batch_size=32)
                start = time.perf_counter()
                with torch.inference_mode():
                    trajs = run_episodes(policy, lambda: make_env("household", **QUICKSTART_ENV), tasks, 8,
                                         RolloutLimits(max_open=32), params, renderer=policy.renderer, progress=False)
                wall = time.perf_counter() - start
            r = results[way]
            r["wall_s"] += wall
            r["decode_s"] += steps["decode_s"]
            r["decode_steps"] += steps["decode_steps"]
            r["tokens"] += sum(len(t.generated_ids) for traj in trajs for t in traj.turns)
    print("| way | wall per batch (s) | tokens generated per batch | decoding steps per batch | ms per decoding step |")
    print("|---|---:|---:|---:|---:|")
    for way, r in results.items():
        n = args.repeats
        print(f"| {way} | {r['wall_s'] / n:.2f} | {r['tokens'] / n:.0f} | {r['decode_steps'] / n:.0f} | "
              f"{1000 * r['decode_s'] / max(r['decode_steps'], 1):.2f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
