"""GPU check at Qwen3-4B's shape: SFT, rollouts and one GRPO step measured in one short run, each part capped.

A `Qwen3ForCausalLM` of a named shape gets random weights (no weights are downloaded; `--shape 4b` is
Qwen3-4B-Instruct-2507's: 36 layers, hidden 2560, 32 query / 8 KV heads of 128, intermediate 9728, vocab 151936,
tied embeddings) and the tiny tokenizer trained on household + tau2 retail text (its ids all lie in Qwen3's
vocab; what the random model samples past it decodes to nothing). It is saved once, as a checkpoint users load,
and each part loads it through turnforge's own code, in a fresh Python process with its own time cap:

  rollouts  household and service (tau2 retail, scripted user) episodes through `run_episodes` with the hf policy
            (transformers' continuous-batching engine, policies/engine.py) at the largest batch first (128, 32, 1),
            the first turn of 128 episodes through the hf policy and through transformers' own `generate_batch`,
            and last the naive loop users write (one episode at a time, `apply_chat_template` + `generate` per
            turn) on the same first tasks: generated tokens/s, and the ratios in the naive rows;
  grpo      one step of `run_grpo` (8 tasks x 8 episodes, LoRA r 64, household): the time split into rollout
            (turnforge's rollout function), scoring (TRL's rewards, advantages, log-probs before the loss) and
            update (the loss's forward + backward), and peak memory; then 3 steps at max_staleness 0 and at 1
            (asynchronous GRPO): episodes trained a minute, the trainer's wait, the generator's busy time;
  sft       TRL SFT through `turnforge.train.sft.build_trainer` at `--seq-len` tokens (2,048), examples packed
            into rows (`packing = "batch"`, SDPA attention: FlashAttention is not in the GPU image), LoRA r 64 and
            full fine-tuning, activation checkpointing on and off, bf16 on a GPU: tokens/s, MFU, peak memory.

Parts run in that order (issue 51: what matters most first).
Each part stops starting rows at its cap, and is killed past it: a row it did not reach reads "not reached:
time", a row that raised "failed: <one line>"; the run itself never fails for a row. `--budget-s` is split
over the parts in proportion to `SHARES`; time a part leaves unused goes to the parts after it.

MFU = 6 * N * tokens / seconds / peak, with N = every parameter that multiplies a token's activations: with tied
embeddings that is all of them (the embedding lookup is free, but the same matrix is the LM head's matmul);
tokens = the real (unpadded) tokens of the timed steps; attention's own FLOPs (torchtitan's 12*L*d*seq term) are
not counted, so it is a lower bound. 6*N assumes weight gradients for all of N: LoRA computes none for the frozen
base (~4*N of work), so its MFU is the model-FLOPs convention, as torchtitan reports it. Peak = `PEAK_BF16`, dense
bf16 (no sparsity) from NVIDIA's data sheets: 989 TFLOP/s for the H100 SXM and for the H200.

    bash benchmarks/gpu_wheels.sh      # on the GPU machine: see BENCHMARKS.md, "GPU check"
    python benchmarks/gpu_check.py --shape 4b --budget-s 480 --out runs/gpu_check
    .venv/bin/python benchmarks/gpu_check.py --device cpu --shape tiny --budget-s 60 --out runs/gpu_check_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES: dict[str, dict] = {
    # Qwen/Qwen3-4B-Instruct-2507's config.json
    "4b": dict(num_hidden_layers=36, hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=262144,
               rope_theta=5_000_000.0, rms_norm_eps=1e-6),
    # The rehearsal: the same vocab (the same logits and sampling code), everything else small enough for a CPU.
    "tiny": dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=256, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768),
}
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12}
"""Dense bf16 FLOP/s (no sparsity), NVIDIA data sheets: H100 SXM 989 TFLOP/s, H100 PCIe 756, H200 989. The first
key found in `torch.cuda.get_device_name()` is used ("NVIDIA H100 80GB HBM3" is the SXM card); none: no MFU."""
SHARES = {"setup": 0.2, "rollouts": 0.3, "grpo": 0.2, "sft": 0.3}
"""Each part's share of the budget (setup: tokenizer, SFT data, the model built and saved; at 4B most of it is
writing the 8 GB checkpoint, not yet timed). What a part leaves unused goes to the parts after it."""
SETUP_MIN_S = 60.0
"""Setup's cap is at least this (nothing runs without it): a budget under 300 s may be overrun by the difference."""
SFT_CONFIGS = [("lora r64", False, True), ("full", False, True), ("lora r64", False, False), ("full", False, False),
               ("lora r64", True, False), ("full", True, False)]
"""(tuning, activation checkpointing, Liger kernels through TRL's `use_liger_kernel`: fused linear cross-entropy
over the vocabulary, RMSNorm, SwiGLU, RoPE): issue 51's question first (Liger's gain at the first run's best
setting, no checkpointing), then that setting without Liger, then checkpointing (the first run's slower rows)."""
ROLLOUT_ENVS = ("household", "service")
GRPO_ROW = "grpo step, 8 tasks x 8 episodes, LoRA r64, household"
GRPO_ASYNC_KS = (0, 1)
GRPO_ASYNC_STEPS = 3
"""Async GRPO (issue 61): the same GRPO at max_staleness 0 and 1 for 3 steps (one step at k = 1 has nothing to
overlap: its first call waits for its groups), episodes trained a minute side by side."""


def grpo_async_row(k: int) -> str:
    return f"grpo {GRPO_ASYNC_STEPS} steps at max_staleness {k}, 8 tasks x 8 episodes, LoRA r64, household"


def planned_rows(batches: list[int]) -> list[tuple[str, str]]:
    """(part, row) of every row the table holds, in the order they run: by importance (issue 51) — the hf engine
    at the largest batches first, transformers' own `generate_batch` on the same first turns, the GRPO step, SFT,
    and last the naive loop, whose rate the rollout rows' ratios are taken against."""
    rows = [("rollouts", rollout_row(env, b)) for b in sorted(batches, reverse=True) for env in ROLLOUT_ENVS]
    rows += [("rollouts", first_turn_row(engine, max(batches))) for engine in ("hf policy", "continuous batching")]
    rows += [("rollouts", f"{env} naive loop, batch 1") for env in ROLLOUT_ENVS]
    rows += [("grpo", GRPO_ROW)] + [("grpo", grpo_async_row(k)) for k in GRPO_ASYNC_KS]
    rows += [("sft", sft_row(tuning, ckpt, liger)) for tuning, ckpt, liger in SFT_CONFIGS]
    return rows


def sft_row(tuning: str, checkpointing: bool, liger: bool) -> str:
    return f"sft {tuning}, checkpointing {'on' if checkpointing else 'off'}{', Liger' if liger else ''}"


def rollout_row(env: str, batch: int) -> str:
    return f"{env} hf rollouts, batch {batch}"


def first_turn_row(engine: str, batch: int) -> str:
    return f"household first turn x{batch}, {engine}"


def run_part(part: str, args: argparse.Namespace, work: Path, cap_s: float) -> str | None:
    """Run `part` in a fresh Python process for at most `cap_s` seconds, its output in OUT/<part>.log; None when it
    ended by itself, else the status of the rows it left ("not reached: time", or "failed: <why>")."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--work", str(work),
           "--deadline", str(time.time() + cap_s), *forwarded(args)]
    log = Path(args.out) / f"{part}.log"
    with log.open("w") as out:
        try:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=cap_s + 5, cwd=REPO).returncode
        except subprocess.TimeoutExpired:  # the child is killed: its rows written so far are kept
            return "not reached: time"
    if code == 0:
        return None
    if code < 0:  # no traceback to quote: the kernel's OOM killer sends SIGKILL
        return f"failed: {part} process killed by signal {-code} (out of host memory?), log {log.name}"
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return f"failed: {lines[-1].strip() if lines else f'exit code {code}'} (log {log.name})"


def forwarded(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--shape", args.shape, "--seq-len", str(args.seq_len), "--sft-steps",
            str(args.sft_steps), "--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens),
            "--batches", ",".join(map(str, args.batches)), "--retail-dir", str(args.retail_dir)]


def run_check(args: argparse.Namespace) -> dict:
    """Setup and every part, each under its cap; the rows as measured or as their part left them. The model and
    the parts' files live in a temporary folder (a 4B checkpoint is 8 GB: never under OUT), removed at the end."""
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    try:
        return run_parts(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_parts(args: argparse.Namespace, work: Path) -> dict:
    end = time.time() + args.budget_s
    left_shares = sum(SHARES.values())
    ended: dict[str, str | None] = {}
    for part, share in SHARES.items():
        cap = max((end - time.time()) * share / left_shares, SETUP_MIN_S if part == "setup" else 1.0)
        left_shares -= share
        if part != "setup" and ended.get("setup"):
            ended[part] = f"failed: setup: {ended['setup']}"
            continue
        started = time.time()
        ended[part] = run_part(part, args, work, cap)
        print(f"gpu_check: {part} {time.time() - started:.0f} s of {cap:.0f} s: {ended[part] or 'done'}", flush=True)
    rows = collect_rows(work, ended, args.batches)
    setup = read_json(work / "setup.json")
    return {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "budget_s": args.budget_s, "shape": args.shape, "seq_len": args.seq_len, **setup, "rows": rows}


def collect_rows(work: Path, ended: dict[str, str | None], batches: list[int]) -> list[dict]:
    measured = {}
    for path in work.glob("rows_*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a part killed while writing a row: that row was not finished
                continue
            measured[(row["part"], row["row"])] = row
    rows = []
    for part, name in planned_rows(batches):
        row = measured.get((part, name)) or {"part": part, "row": name, "status": ended.get(part) or "not reached: time"}
        rows.append(row)
    return rows


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


COLUMNS = [("part", "part"), ("row", "row"), ("status", "status"), ("tokens/s", "tokens_per_s"), ("MFU %", "mfu_pct"),
           ("vs naive", "ratio_vs_naive"), ("peak GiB", "peak_gib"), ("detail", "detail")]


def markdown(result: dict) -> str:
    head = (f"GPU check: {result.get('device_name', '?')}, shape {result['shape']} "
            f"({result.get('parameters', '?')} parameters), {result['date']}, torch {result.get('torch', '?')}, "
            f"transformers {result.get('transformers', '?')}, trl {result.get('trl', '?')}, peft {result.get('peft', '?')}\n"
            f"command: `{result['command']}`\n\n")
    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in result["rows"]:
        cells = [row.get(key, "") for _, key in COLUMNS]
        lines.append("| " + " | ".join("" if c is None else str(c).replace("|", "/") for c in cells) + " |")
    return head + "\n".join(lines) + "\n"


def batch_list(text: str) -> list[int]:
    try:
        batches = sorted({int(b) for b in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batches takes sizes separated by commas (1,32,128), got {text!r}") from None
    if batches[0] < 1:
        raise argparse.ArgumentTypeError(f"--batches sizes must be at least 1, got {text!r}")
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (the rehearsal)")
    parser.add_argument("--out", default="runs/gpu_check", help="writes OUT/gpu_check.json and OUT/gpu_check.md")
    parser.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time, split over the parts")
    parser.add_argument("--seq-len", type=int, default=2048, help="SFT tokens per packed row")
    parser.add_argument("--sft-steps", type=int, default=3, help="timed SFT steps per row, after one warm-up step")
    parser.add_argument("--max-turns", type=int, default=4, help="assistant turns per rollout / GRPO episode")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per assistant turn")
    parser.add_argument("--batches", type=batch_list, default=[1, 32, 128], help="rollout batch sizes, e.g. 1,32,128")
    parser.add_argument("--retail-dir", type=Path, default=REPO.parent / "shared" / "data" / "tau2" / "retail",
                        help="tau2 retail's folder (db.json, policy.md, tasks.json)")
    parser.add_argument("--part", choices=sorted(SHARES), help=argparse.SUPPRESS)  # one part, in a child process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_check_parts import run_one_part

        run_one_part(args)
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run_check(args)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
