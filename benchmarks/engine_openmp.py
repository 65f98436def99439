"""The hf engine on a CPU after the calling thread trained: its idle OpenMP workers released vs kept.

The engine runs the model on its loop's thread; the thread that trained (or loaded a model) keeps the OpenMP workers
its parallel regions made. With GNU OpenMP, more workers in the process than cores makes every team sleep between
regions (`engine.release_idle_openmp`, called when a policy is set up). Side by side in one process, on the same
model and episodes: a few SGD steps of the model on this thread (as a stage that trains before it evaluates), then
a greedy evaluation, with the thread's workers kept (the policy's release turned off) and released (as turnforge
does), alternating. Greedy episodes are compared token by token: the work is the same.

    .venv/bin/python benchmarks/engine_openmp.py --model runs/quickstart/stages/02-sft/model --tasks 200
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import turnforge.policies.hf as hf
from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.engine import release_idle_openmp
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import SamplingParams

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def train_a_little(model) -> None:
    """Parallel regions on this thread, as a training stage leaves them (the weights are put back after)."""
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, model.config.vocab_size, (8, 256))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.load_state_dict(saved)
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's SFT model")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2, help="kept/released pairs, alternating")
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.tasks, **QUICKSTART_ENV)
    params = SamplingParams(temperature=0.0, max_new_tokens=48, seed=0)
    policy = hf.HFPolicy(args.model, device="cpu", dtype="float32", batch_size=len(tasks))
    model, tokenizer = policy.model, policy.tokenizer
    policy.close()
    times: dict[str, list[float]] = {"kept": [], "released": []}
    episodes = {}
    for _ in range(args.rounds):
        for mode in ("kept", "released"):
            train_a_little(model)
            hf.release_idle_openmp = release_idle_openmp if mode == "released" else (lambda: None)
            policy = hf.HFPolicy.from_model(model, tokenizer, batch_size=len(tasks))
            started = time.perf_counter()
            trajs = run_episodes(policy, lambda: make_env("household", **QUICKSTART_ENV), tasks, 1,
                                 RolloutLimits(max_turns=30, max_open=len(tasks)), params, renderer=policy.renderer,
                                 progress=False)
            times[mode].append(time.perf_counter() - started)
            policy.close()
            episodes[mode] = [[t.generated_ids for t in traj.turns] for traj in trajs]
            print(f"{mode:<9} {times[mode][-1]:6.1f} s", flush=True)
    hf.release_idle_openmp = release_idle_openmp
    same = sum(a == b for a, b in zip(episodes["kept"], episodes["released"], strict=True))
    kept, released = min(times["kept"]), min(times["released"])
    print(json.dumps({"episodes": len(tasks), "kept_s": [round(t, 1) for t in times["kept"]],
                      "released_s": [round(t, 1) for t in times["released"]], "speedup": round(kept / released, 2),
                      "identical_episodes": f"{same}/{len(tasks)}", "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
