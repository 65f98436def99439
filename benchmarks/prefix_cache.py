"""The hf policy with and without its per-episode KV prefix cache: same model, tasks and greedy decoding.

Without the cache every turn re-encodes the whole conversation; with it only the new suffix (the last
reply's final token + the observation) is encoded. Prints seconds and episodes/s of both, the ratio, and
whether the episodes are identical (they must be: the cache changes the time, not the tokens).

    .venv/bin/python benchmarks/prefix_cache.py --model runs/quickstart/stages/02-sft/model --tasks 30
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.base import SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.rollout import RolloutLimits, run_episodes

QUICKSTART_ENV = {"format": "act_line", "grammar": "0.3", "expert": "explorer", "receptacles": 0.3,
                  "distractors": 0, "max_steps": 30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's SFT model")
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.tasks, **QUICKSTART_ENV)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    runs = {}
    for cached in (True, False):
        policy = HFPolicy(args.model, device="cpu", dtype="float32", prefix_cache=cached)
        start = time.perf_counter()
        trajs = run_episodes(policy, partial(make_env, "household", **QUICKSTART_ENV), tasks, 1,
                             RolloutLimits(max_open=64), params, renderer=policy.renderer)
        runs[cached] = (time.perf_counter() - start, trajs)
    identical = all(
        [t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns]
        for a, b in zip(runs[True][1], runs[False][1], strict=True)
    )
    turns = sum(len(t.turns) for t in runs[True][1])
    report = {
        "episodes": len(tasks),
        "turns": turns,
        "cache_s": round(runs[True][0], 2),
        "no_cache_s": round(runs[False][0], 2),
        "ratio": round(runs[False][0] / runs[True][0], 2),
        "identical_episodes": identical,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
