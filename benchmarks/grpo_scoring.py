"""GRPO's scoring pass on a multi-turn batch: each episode on its own tokens (turnforge) vs TRL's padded batch.

One generation batch of the quickstart's GRPO stage (4 tasks x 8 episodes sampled by the given model, the
quickstart's env and sampling), then the forward + backward of the per-token log-probabilities that GRPO's loss
runs on it, timed `--repeats` times for each way in the same process under bf16 autocast where the CPU has it:
TRL's `_get_per_token_logps_and_entropies` (prompts left-padded, completions right-padded to the batch's
longest, an attention mask), `EpisodeGRPOTrainer`'s (rows sorted by length, 4 at a time, right-padded to the
chunk's longest, no mask; each group's prompt run once), and the same with every row running its own prompt
(the way before prompts were shared: `PROMPT_BLOCK` larger than any prompt). Prints the padded and real token
counts, seconds per pass, the ratios and the largest log-probability difference from TRL's on real completion
tokens, and each way's mean distance from the log-probabilities the rollout sampled with (float32) on the
generated tokens.

    .venv/bin/python benchmarks/grpo_scoring.py --model runs/quickstart/stages/05-rft/model
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from trl import GRPOTrainer

from turnforge.envs.base import load_tasks
from turnforge.models import load_model
from turnforge.recipes import load_recipe
from turnforge.rewards import COMPONENTS
from turnforge.train.grpo import component_reward, grpo_config, task_dataset
from turnforge.train.grpo_rollouts import EpisodeRollouts
from turnforge.train.grpo_trainer import EpisodeGRPOTrainer
from turnforge.train.settings import GRPOSettings

QUICKSTART_ENV = load_recipe("quickstart").env_options()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's RFT model")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model, dtype="float32", device="cpu")
    tasks = load_tasks("household", "train", limit=4, **QUICKSTART_ENV)
    settings = GRPOSettings(steps=1, tasks_per_step=4, num_generations=8, temperature=1.0, top_p=0.9, max_new_tokens=48,
                            max_completion_length=2048, trl={"bf16": True})
    with tempfile.TemporaryDirectory() as out:
        trainer = EpisodeGRPOTrainer(
            model=model, reward_funcs=[component_reward(n) for n in COMPONENTS], args=grpo_config(Path(out), settings),
            train_dataset=task_dataset("household", QUICKSTART_ENV, tasks), processing_class=tokenizer,
            rollout_func=EpisodeRollouts("household", QUICKSTART_ENV, tasks, tokenizer, settings),
        )
        batch = trainer._generate_and_score_completions([trainer.train_dataset[i // 8] for i in range(32)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep, scored = batch["completion_ids"].shape[1], batch["completion_mask"].bool()
    learnt, sampled = scored & batch["tool_mask"].bool(), batch["sampling_per_token_logps"]
    ours = EpisodeGRPOTrainer._get_per_token_logps_and_entropies
    ways = {"episodes apart, prompts shared (turnforge)": (ours, EpisodeGRPOTrainer.PROMPT_BLOCK),
            "episodes apart, prompts not shared": (ours, ids.shape[1] + 1),
            "padded batch (TRL)": (GRPOTrainer._get_per_token_logps_and_entropies, None)}
    seconds, logps = {}, {}
    for _ in range(args.repeats + 1):  # the first pass of each way builds its kernels: not timed
        for name, (score, block) in ways.items():
            trainer.PROMPT_BLOCK = block
            model.zero_grad()
            start = time.perf_counter()
            out, _, _ = score(trainer, model, ids, mask, keep, compute_entropy=True)
            (out * scored).sum().backward()
            seconds.setdefault(name, []).append(time.perf_counter() - start)
            logps[name] = out.detach()
    mean = {name: sum(s[1:]) / args.repeats for name, s in seconds.items()}
    shared, unshared, trls = mean.values()
    print(json.dumps({
        "episodes": ids.shape[0], "padded_tokens": ids.numel(), "real_tokens": int(mask.sum()),
        **{f"{name} s": round(s, 3) for name, s in mean.items()},
        "ratio (TRL / shared)": round(trls / shared, 2),
        "ratio (not shared / shared)": round(unshared / shared, 2),
        **{f"{name} max |logp - TRL's|": float((logps[name] - logps["padded batch (TRL)"])[scored].abs().max())
           for name in list(ways)[:2]},
        # against the float32 log-probabilities the rollout sampled with (the importance ratio's denominator)
        **{f"{name} mean |logp - sampled|": float((logps[name] - sampled)[learnt].abs().mean()) for name in ways},
    }, indent=2))


if __name__ == "__main__":
    main()
