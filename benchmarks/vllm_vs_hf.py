"""`--policy vllm` (vLLM's CPU build) vs `--policy hf` on a CPU: generated tokens per second, side by side.

The same tiny model (float32), household test tasks, greedy decoding and rollout engine (`run_episodes`), one
episode per task, at `--limit-open` 1 (one episode at a time) and 64 (all at once). Engine start and model load
are not timed: each backend plays one warm-up episode first. These are CPU figures of vLLM's CPU build (and of
transformers on a CPU), not a GPU's. Run in .venv-vllm (`make install-vllm`), which has both backends:

    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --episodes 64 --limit-open 1 64
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import make_policy
from turnforge.policies.base import SamplingParams
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.tiny_model import build_tiny_model

ENV = {"format": "act_line"}


def play(policy, tasks, limit_open: int, max_turns: int, max_new_tokens: int) -> tuple[int, float]:
    """(tokens generated, seconds) of one greedy episode per task, `limit_open` open at once."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    start = time.perf_counter()
    episodes = run_episodes(policy, lambda: make_env("household", **ENV), tasks, 1,
                            RolloutLimits(max_turns=max_turns, max_open=limit_open), params,
                            renderer=policy.renderer, progress=False)
    return sum(e.tokens_generated for e in episodes), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: build the untrained tiny model)")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--limit-open", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.episodes, **ENV)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_tiny_model(f"{tmp}/tiny"))
        rows = []
        for backend in args.backends:
            started = time.perf_counter()
            policy = make_policy(backend, model=model, dtype="float32", **({"device": "cpu"} if backend == "hf" else {}))
            play(policy, tasks[:1], 1, args.max_turns, args.max_new_tokens)  # warm-up (vLLM: its first batch shapes)
            ready = time.perf_counter() - started
            for limit_open in args.limit_open:
                tokens, seconds = play(policy, tasks, limit_open, args.max_turns, args.max_new_tokens)
                rows.append({"backend": backend, "limit_open": limit_open, "episodes": len(tasks), "tokens": tokens,
                             "seconds": round(seconds, 2), "tok_per_s": round(tokens / seconds, 1),
                             "start_s": round(ready, 1)})
                print(json.dumps(rows[-1]), flush=True)
            if backend == "vllm":  # its engine's processes, ended here rather than at interpreter exit
                policy.llm.llm_engine.engine_core.shutdown()
            else:
                policy.close()
            del policy
    for limit_open in args.limit_open:
        by = {r["backend"]: r for r in rows if r["limit_open"] == limit_open}
        if {"hf", "vllm"} <= by.keys():
            print(f"limit-open {limit_open}: vllm/hf = {by['vllm']['tok_per_s'] / by['hf']['tok_per_s']:.2f}x "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":  # vLLM's engine runs in spawned processes, which import this file again
    main()
