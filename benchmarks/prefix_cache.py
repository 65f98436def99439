"""The hf policy with and without its per-episode KV prefix cache: same model, tasks and greedy decoding.

Without the cache every turn re-encodes the whole conversation; with it only the new suffix (the last
reply's final token + the observation) is encoded. A third way keeps the prefix cache but hands `generate`
transformers' own DynamicCache, which appends each generated token with `torch.cat` (a copy of the whole
cache per token), instead of turnforge's `ReservedLayer`s (written in place). Prints seconds of each, the
ratios, and whether the episodes are identical (they must be: the caches change the time, not the tokens).

    .venv/bin/python benchmarks/prefix_cache.py --model runs/quickstart/stages/02-sft/model --tasks 64 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from transformers import DynamicCache

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import hf
from turnforge.policies.base import SamplingParams
from turnforge.rollout import RolloutLimits, run_episodes

QUICKSTART_ENV = {"format": "act_line", "grammar": "0.3", "expert": "explorer", "receptacles": 0.3,
                  "distractors": 0, "max_steps": 30}


def dynamic_batch_cache(entries, cached, width, config, like, reserve=0):
    """The peer: the same per-row layout in transformers' own DynamicCache (its layers append with torch.cat)."""
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers if width else 0):
        template = next(e for e in entries if e is not None).layers[layer][0]
        keys = torch.zeros(len(entries), template.shape[0], width, template.shape[2], dtype=template.dtype)
        values = torch.zeros_like(keys)
        for i, (entry, n) in enumerate(zip(entries, cached, strict=True)):
            if n:
                keys[i, :, width - n :], values[i, :, width - n :] = entry.layers[layer]
        cache.update(keys, values, layer)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's SFT model")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.tasks, **QUICKSTART_ENV)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    reserved = hf.batch_cache
    runs = {}
    for way in ("reserved", "dynamic", "no_cache"):
        # "dynamic": the same batches and prefix cache, with transformers' own cache layers in generate.
        hf.batch_cache = dynamic_batch_cache if way == "dynamic" else reserved
        policy = hf.HFPolicy(args.model, device="cpu", dtype="float32", prefix_cache=way != "no_cache")
        start = time.perf_counter()
        trajs = run_episodes(policy, partial(make_env, "household", **QUICKSTART_ENV), tasks, 1,
                             RolloutLimits(max_open=64), params, renderer=policy.renderer)
        runs[way] = (time.perf_counter() - start, trajs)
    hf.batch_cache = reserved
    identical = all(
        [t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns] == [t.generated_ids for t in c.turns]
        for a, b, c in zip(runs["reserved"][1], runs["dynamic"][1], runs["no_cache"][1], strict=True)
    )
    turns = sum(len(t.turns) for t in runs["reserved"][1])
    report = {
        "episodes": len(tasks),
        "turns": turns,
        **{f"{way}_s": round(runs[way][0], 2) for way in runs},
        "dynamic / reserved": round(runs["dynamic"][0] / runs["reserved"][0], 2),
        "no_cache / reserved": round(runs["no_cache"][0] / runs["reserved"][0], 2),
        "identical_episodes": identical,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
