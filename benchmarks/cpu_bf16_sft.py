"""SFT step time and memory on a CPU: float32 vs bf16 autocast (padded to 128, as turnforge does) vs bf16 unpadded,
bf16 with each batch's episodes packed into rows (`packing = "batch"`), and bf16 with the prefix every episode of a
batch shares (the system prompt and the room's opening) run once (`packing = "prefix"`): its rows all at once, with
TRL's fused LM head scoring every position or (as turnforge does, `train.lm_head`) the labelled ones only, then
sorted by length and run 4, 2 (as turnforge does) or 1 at a time, each chunk cut to its own longest row.

The quickstart's setting: the tiny model, 8 household expert episodes a step (~570 tokens each, with the goal
THOUGHT lines), TRL's SFTTrainer.
One run times the chosen modes on the same data in turn: the mean step over all steps (oneDNN's kernel builds
in the first steps included) and in steady state (the steps after `--warmup`); memory is the process's resident
size after the steps (each mode in its own process, so one's caches do not count against another's). The "vs"
columns compare each mode with the first one run.

    .venv/bin/python benchmarks/cpu_bf16_sft.py --steps 80 --warmup 20 [--modes 6,5,7,8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# mode -> (SFTSettings fields, the `trl` table, SharedPrefixSFTTrainer attributes); "labelled_only": False leaves
# TRL's fused head as TRL patched it (every position scored)
PREFIX = ({"packing": "prefix"}, {"bf16": True})
MODES = {
    "float32": ({}, {"bf16": False}, {}),
    "bf16, padded to 128": ({}, {"bf16": True}, {}),
    "bf16, unpadded": ({}, {"bf16": True, "pad_to_multiple_of": None}, {}),
    "bf16, padded to 128, packed per batch": ({"packing": "batch"}, {"bf16": True}, {}),
    "bf16, shared prefix run once, 8 rows at once": (*PREFIX, {"ROWS_PER_CHUNK": 8}),
    "bf16, shared prefix run once, 8 rows at once, TRL's head on every position":
        (*PREFIX, {"ROWS_PER_CHUNK": 8, "labelled_only": False}),
    "bf16, shared prefix run once, sorted rows 4 at a time": (*PREFIX, {"ROWS_PER_CHUNK": 4}),
    "bf16, shared prefix run once, sorted rows 2 at a time": (*PREFIX, {"ROWS_PER_CHUNK": 2}),
    "bf16, shared prefix run once, one row at a time": (*PREFIX, {"ROWS_PER_CHUNK": 1}),
}


def child(mode: str, steps: int, warmup: int, work: Path) -> None:
    from transformers import TrainerCallback

    import turnforge.train.sft
    from turnforge.envs.base import load_tasks, make_env
    from turnforge.models import load_model
    from turnforge.policies.scripted import ExpertPolicy
    from turnforge.recipes import load_recipe
    from turnforge.rollout import run_episodes
    from turnforge.tiny_model import build_tiny_model
    from turnforge.train.settings import SFTSettings
    from turnforge.train.sft import (
        SharedPrefixSFTTrainer,
        build_dataset,
        build_trainer,
        prefix_chunks,
        shared_prefix_length,
    )

    fields, trl, attributes = MODES[mode]
    attributes = dict(attributes)
    if not attributes.pop("labelled_only", True):  # the peer: TRL's fused head as TRL patched it
        turnforge.train.sft.score_labelled_only = lambda trainer: None
    for name, value in attributes.items():
        setattr(SharedPrefixSFTTrainer, name, value)

    options = load_recipe("quickstart").env_options()
    model_dir, data = work / "tiny", work / "episodes.jsonl"
    if not model_dir.exists():
        build_tiny_model(model_dir)
    if not data.exists():
        tasks = load_tasks("household", "train", limit=400, **options)
        trajs = run_episodes(ExpertPolicy(), lambda: make_env("household", **options), tasks, 1)
        data.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajs))
    # an explicit pad_to_multiple_of (None: unpadded) wins over turnforge's 128
    settings = SFTSettings(max_steps=steps, learning_rate=3e-3, batch_size=8, max_length=1024, logging_steps=10_000,
                           trl=dict(trl), **fields)
    lm, tokenizer = load_model(str(model_dir), dtype="float32", device="cpu")
    dataset, _ = build_dataset([str(data)], tokenizer, settings)
    trainer = build_trainer(lm, tokenizer, dataset, work / mode.replace(" ", "_").replace(",", ""), settings)
    loader = trainer.get_train_dataloader()  # what the steps compute on: rows x padded width
    def tokens(batch) -> int:  # a shared prefix is computed for one row, not for each
        if not isinstance(trainer, SharedPrefixSFTTrainer):
            return batch["input_ids"].numel()
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        p = shared_prefix_length(ids, labels, mask, trainer.PREFIX_BLOCK)
        if p == 0:
            return ids.numel()
        return p + sum(len(rows) * (width - p) for rows, width in
                       prefix_chunks(labels, mask, p, trainer.ROWS_PER_CHUNK, trainer.PREFIX_BLOCK))

    computed = sum(tokens(batch) for batch in loader) / len(loader)
    ends: list[float] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    trainer.add_callback(StepEnds())
    start = time.perf_counter()
    trainer.train()
    seconds = (ends[-1] - start) / steps
    steady = (ends[-1] - ends[warmup - 1]) / (steps - warmup)
    rss_gb = int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**30
    print(json.dumps({"mode": mode, "s_per_step": seconds, "steady_s_per_step": steady, "rss_gb": rss_gb,
                      "tokens_per_step": computed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the steady-state mean")
    parser.add_argument("--modes", help="comma-separated 1-based numbers of the modes to run (default: all); the "
                        "first one run is the reference of the 'vs' columns")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and fewer than --steps")
    if args.child:
        child(args.child, args.steps, args.warmup, Path(args.work))
        return
    with tempfile.TemporaryDirectory() as work:
        rows = []
        names = list(MODES)
        for mode in [names[int(k) - 1] for k in args.modes.split(",")] if args.modes else names:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                                  "--warmup", str(args.warmup), "--work", work],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base, steady = rows[0]["s_per_step"], rows[0]["steady_s_per_step"]
    print(f"| mode | s / step, all {args.steps} | vs the first | s / step after {args.warmup} | vs the first | "
          "tokens computed a step (padding included) | resident GB after the steps |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['mode']} | {row['s_per_step']:.3f} | {base / row['s_per_step']:.2f}x | "
              f"{row['steady_s_per_step']:.3f} | {steady / row['steady_s_per_step']:.2f}x | "
              f"{row['tokens_per_step']:.0f} | {row['rss_gb']:.2f} |")


if __name__ == "__main__":
    main()
