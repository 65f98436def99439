"""The hf engine's sampler step: the graph-safe `TurnSampling` vs the per-reply-generator form it replaced.

One decoding step's sampling on random logits [batch, vocab], as the engine calls it (argument rows prepared on
the host, then the tensor work), timed over `--steps` steps after 3 warm-up steps, on this machine's CPU:

- `TurnSampling` (src/turnforge/policies/engine.py): per-request arguments in int32 rows, log_softmax recorded,
  one descending sort only when top-k/top-p are set, an inverse-CDF draw at a hashed uniform per (seed, token).
- the form it replaced (its code at a18a02b, kept here as `generator_form`): rows grouped by settings, each
  sampled row's Gumbel noise over the vocabulary from its own seeded `torch.Generator`, transformers' TopK/TopP
  warpers, log-probs appended in Python — the reason the engine ran eagerly.

    .venv/bin/python benchmarks/engine_sampler.py
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from turnforge.policies.engine import ARG_ROWS, Reply, TurnSampling

SETTINGS = {"greedy": (0.0, 0, 1.0), "T 1.0": (1.0, 0, 1.0), "T 1.0, top-p 0.9": (1.0, 0, 0.9)}


def generator_form(scores: torch.Tensor, replies: list[Reply], generators: list[torch.Generator]) -> list[float]:
    """The previous step (a18a02b's `TurnSampling.__call__` for one settings group), returning the log-probs."""
    temperature, top_k, top_p = replies[0].temperature, replies[0].top_k, replies[0].top_p
    sampled = replies[0].sampled
    scaled = scores / temperature if sampled else scores
    logprobs = torch.log_softmax(scaled, dim=-1)
    if not sampled:
        chosen = scaled.argmax(dim=-1)
    else:
        truncated = scaled
        if top_k > 0:
            truncated = TopKLogitsWarper(top_k)(None, truncated)
        if top_p < 1.0:
            truncated = TopPLogitsWarper(top_p)(None, truncated)
        noise = torch.stack([-torch.log(-torch.log(torch.rand(scores.shape[-1], generator=g).clamp(min=1e-20)))
                             for g in generators])
        chosen = (truncated + noise).argmax(dim=-1)
    return logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()


def turn_sampling_step(sampling: TurnSampling, scores: torch.Tensor, requests: list, storage: torch.Tensor,
                       output_ids: torch.Tensor) -> list[float]:
    sampling.prepare_tensor_args(requests, storage)
    sampling(None, scores, storage)
    sampling.write_outputs(scores.unsqueeze(0), output_ids)
    return output_ids[1, : scores.shape[0]].view(torch.float32).tolist()  # the engine reads its rows back so


def timed(step, steps: int) -> float:
    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936, help="Qwen3's vocabulary by default")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {args.vocab}")
    print("| settings | batch | TurnSampling ms | generator form ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, (temperature, top_k, top_p) in SETTINGS.items():
        for batch in args.batches:
            new, old = measure(temperature, top_k, top_p, batch, args.vocab, args.steps)
            print(f"| {name} | {batch} | {new:.2f} | {old:.2f} | {new / old:.2f} |", flush=True)


def measure(temperature: float, top_k: int, top_p: float, batch: int, vocab: int, steps: int) -> tuple[float, float]:
    """(TurnSampling ms, generator form ms) a step."""
    scores = torch.randn(batch, vocab) * 3
    replies = [Reply(temperature, top_k, top_p, seed=i, sampled=temperature > 0) for i in range(batch)]
    sampling = TurnSampling(graphs=False)
    sampling.replies = {f"r{i}": r for i, r in enumerate(replies)}
    requests = [SimpleNamespace(state=SimpleNamespace(request_id=f"r{i}"), has_new_token=True) for i in range(batch)]
    storage = torch.zeros(ARG_ROWS, batch, dtype=torch.int32)
    output_ids = torch.zeros(2, batch, dtype=torch.int32)
    generators = [torch.Generator().manual_seed(i) for i in range(batch)]
    new = timed(lambda: turn_sampling_step(sampling, scores, requests, storage, output_ids), steps)
    old = timed(lambda: generator_form(scores, replies, generators), steps)
    return new, old

if __name__ == "__main__":
    main()
