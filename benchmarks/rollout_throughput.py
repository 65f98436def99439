"""Batched rollouts vs the naive loop: the same model, env, tasks and greedy decoding, in one run.

turnforge: `run_episodes` with `HFPolicy` — every open episode's next turn in one left-padded batched
`generate`, token-exact prompts. The peer: the loop users write by hand — one episode at a time,
`apply_chat_template` + `generate` per turn (batch of 1). Both stop an episode at the env's end, at
`--max-turns`, or after 5 unparsable replies in a row. Prints tokens/s and episodes/s of each and the ratio.

    .venv/bin/python benchmarks/rollout_throughput.py --model runs/quickstart/stages/02-sft/model --tasks 32
    .venv/bin/python benchmarks/rollout_throughput.py --tasks 32          # builds the untrained tiny model
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from turnforge.envs.base import load_tasks, make_env
from turnforge.formats.base import FormatError
from turnforge.models import load_model
from turnforge.policies.base import SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.tiny_model import build_tiny_model


def naive(model_path: str, env_options: dict, tasks, max_turns: int, max_new_tokens: int) -> tuple[int, float]:
    """One episode at a time, one `generate` per turn. Returns (tokens generated, seconds)."""
    model, tok = load_model(model_path, device="cpu", dtype="float32")
    env = make_env("household", **env_options)
    tokens, start = 0, time.perf_counter()
    for task in tasks:
        messages = [m.to_dict() for m in env.reset(task)]
        bad_in_a_row = 0
        for _ in range(max_turns):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            new = out[0, ids["input_ids"].shape[1]:]
            tokens += len(new)
            text = tok.decode(new, skip_special_tokens=True)
            parsed = env.format.parse(text)
            bad_in_a_row = bad_in_a_row + 1 if isinstance(parsed, FormatError) else 0
            result = env.step(parsed)
            messages += [{"role": "assistant", "content": text}] + [m.to_dict() for m in result.messages]
            if result.done or bad_in_a_row >= 5:
                break
    return tokens, time.perf_counter() - start


def batched(model_path: str, env_options: dict, tasks, max_turns: int, max_new_tokens: int) -> tuple[int, float]:
    policy = HFPolicy(model_path, device="cpu", dtype="float32", batch_size=len(tasks))
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    start = time.perf_counter()
    trajs = run_episodes(policy, lambda: make_env("household", **env_options), tasks, 1,
                         RolloutLimits(max_turns=max_turns, max_format_errors=5, max_open=len(tasks)), params,
                         renderer=policy.renderer)
    return sum(t.tokens_generated for t in trajs), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: build the untrained tiny model)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--env-opt", action="append", default=[], help="KEY=VALUE household option")
    args = parser.parse_args()
    torch.manual_seed(0)
    env_options = dict(pair.split("=", 1) for pair in args.env_opt)
    tasks = load_tasks("household", "test", limit=args.tasks)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = args.model or str(build_tiny_model(f"{tmp}/tiny"))
        tok_b, s_b = batched(model_path, env_options, tasks, args.max_turns, args.max_new_tokens)
        tok_n, s_n = naive(model_path, env_options, tasks, args.max_turns, args.max_new_tokens)
    row = {
        "tasks": len(tasks), "model": args.model or "tiny (untrained)",
        "naive_tokens_per_s": round(tok_n / s_n, 1), "batched_tokens_per_s": round(tok_b / s_b, 1),
        "naive_episodes_per_s": round(len(tasks) / s_n, 3), "batched_episodes_per_s": round(len(tasks) / s_b, 3),
        "ratio_episodes_per_s": round(s_n / s_b, 2), "naive_tokens": tok_n, "batched_tokens": tok_b,
    }
    print(f"{'loop':<28}{'tokens/s':>12}{'episodes/s':>12}{'tokens':>10}")
    print(f"{'naive (1 episode, batch 1)':<28}{row['naive_tokens_per_s']:>12}{row['naive_episodes_per_s']:>12}{tok_n:>10}")
    print(f"{'turnforge batched':<28}{row['batched_tokens_per_s']:>12}{row['batched_episodes_per_s']:>12}{tok_b:>10}")
    print(f"ratio (episodes/s): {row['ratio_episodes_per_s']}x")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
