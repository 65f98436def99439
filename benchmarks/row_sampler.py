"""The hf policy's per-row sampler against transformers' own sampling, per decoding step, at two vocabularies.

`RowSampler` draws each row's Gumbel noise from that row's own generator (one `torch.rand(vocab)` per row,
in a Python loop) so that a reply does not depend on what shares its batch; transformers samples the whole
batch at once (softmax, then one `torch.multinomial` from the global generator). This times one decoding
step's sampling of each, on random logits: the tiny model's vocabulary as measured (963) and Qwen3's (151,936), batch 8
and 64. Prints milliseconds per step and the ratio.

    .venv/bin/python benchmarks/row_sampler.py                   # CPU
    .venv/bin/python benchmarks/row_sampler.py --device cuda     # a GPU
"""

from __future__ import annotations

import argparse
import time

import torch

from turnforge.policies.hf import RowSampler


def per_row(scores: torch.Tensor, sampler: RowSampler) -> torch.Tensor:
    return sampler(None, scores).argmax(-1)


def global_multinomial(scores: torch.Tensor) -> torch.Tensor:
    """transformers' `_sample` step: softmax over the processed scores, one multinomial draw per row."""
    return torch.multinomial(torch.softmax(scores.float(), dim=-1), num_samples=1).squeeze(1)


def ms_per_step(step, steps: int, device: str) -> float:
    for _ in range(5):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    print(f"{'vocab':>8} {'batch':>6} {'RowSampler ms':>14} {'multinomial ms':>15} {'ratio':>6}")
    for vocab in (963, 151_936):
        for batch in (8, 64):
            scores = torch.randn(batch, vocab, device=args.device)
            sampler = RowSampler(list(range(batch)))
            ours = ms_per_step(lambda: per_row(scores, sampler), args.steps, args.device)  # noqa: B023
            peer = ms_per_step(lambda: global_multinomial(scores), args.steps, args.device)  # noqa: B023
            print(f"{vocab:>8} {batch:>6} {ours:>14.3f} {peer:>15.3f} {ours / peer:>6.2f}")


if __name__ == "__main__":
    main()
