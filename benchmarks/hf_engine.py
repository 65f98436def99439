"""The hf backend on transformers' continuous-batching engine vs the batched-`generate` path it replaced.

Same model, env, tasks and settings, in one process: household episodes at several `--limit-open` values, each
path's generated tokens/s and episodes/s, the ratio, and how many tokens the model ran (prefill + decode; the
engine's count says what its shared prefix blocks saved). Greedy (the default), the episodes are compared token by
token; sampled (`--temperature`, GRPO's rollouts: `--split train --samples 8 --temperature 1 --top-p 0.9`), each
path draws its own, so the ratio is of generated tokens a second. The old path is `benchmarks/hf_generate_path.py`
(its code at 268e1ee).

    .venv/bin/python benchmarks/hf_engine.py --model runs/quickstart/stages/02-sft/model --tasks 64 --open 1 8 64
    .venv/bin/python benchmarks/hf_engine.py --model M --split train --tasks 16 --samples 8 --open 32 \
        --temperature 1 --top-p 0.9
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import hf_generate_path  # noqa: E402  (the old path, kept beside this script)
from turnforge.envs.base import load_tasks, make_env  # noqa: E402
from turnforge.policies.hf import HFPolicy  # noqa: E402
from turnforge.recipes import load_recipe  # noqa: E402
from turnforge.rollout import RolloutLimits, run_episodes  # noqa: E402
from turnforge.types import SamplingParams  # noqa: E402

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def play(policy, tasks, open_: int, params: SamplingParams, max_turns: int, samples: int = 1) -> tuple[float, list]:
    started = time.perf_counter()
    trajs = run_episodes(policy, lambda: make_env("household", **QUICKSTART_ENV), tasks, samples,
                         RolloutLimits(max_turns=max_turns, max_open=open_), params, renderer=policy.renderer,
                         progress=False)
    return time.perf_counter() - started, trajs


def counted(model) -> list[int]:
    """A running count of the tokens the model's forward takes (a forward pre-hook)."""
    seen = [0]

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            seen[0] += ids.numel() if ids.dim() > 1 and ids.shape[0] > 1 else ids.shape[-1]

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's SFT model")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--open", type=int, nargs="+", default=[1, 8, 64], help="episodes alive at once")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=int, default=1, help="episodes per task (GRPO's group: 8)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, and episodes compared")
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    tasks = load_tasks("household", args.split, limit=args.tasks, **QUICKSTART_ENV)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=0)
    rows = []
    for open_ in args.open:
        runs = {}
        for name, cls in (("generate (before)", hf_generate_path.HFPolicy), ("engine (turnforge)", HFPolicy)):
            policy = cls(args.model, device="cpu", dtype="float32", batch_size=open_)
            play(policy, tasks[:1], 1, params, 1)  # warm-up (first-call costs), not timed
            ran = counted(policy.model)
            seconds, trajs = play(policy, tasks, open_, params, args.max_turns, args.samples)
            generated = sum(len(t.generated_ids) for traj in trajs for t in traj.turns)
            runs[name] = (seconds, trajs, generated, ran[0])
            print(f"open {open_:>3} {name:<20} {seconds:7.1f} s  {generated / seconds:8.1f} tok/s  "
                  f"{len(trajs) / seconds:6.2f} episodes/s  model ran {ran[0]} tokens", flush=True)
            if hasattr(policy, "close"):
                policy.close()
        (old_s, old, old_gen, old_ran), (new_s, new, new_gen, new_ran) = runs.values()
        row = {"open": open_, "generate_s": round(old_s, 2), "engine_s": round(new_s, 2),
               "generate_tok_s": round(old_gen / old_s, 1), "engine_tok_s": round(new_gen / new_s, 1),
               "tokens_run_generate": old_ran, "tokens_run_engine": new_ran}
        if params.temperature == 0:  # the same episodes: the same work, compared token by token
            same = [[t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns]
                    for a, b in zip(old, new, strict=True)]
            row |= {"speedup": round(old_s / new_s, 2), "identical_episodes": f"{sum(same)}/{len(same)}"}
        else:  # each path its own draws (its own sampler): the episodes differ, so generated tokens a second compare
            row["speedup_tok_s"] = round((new_gen / new_s) / (old_gen / old_s), 2)
        rows.append(row)
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
