"""The hf engine's key/value read on a CPU: transformers' read-back vs the same into kept buffers vs one request at a time.

Each layer of each step, transformers' paged cache writes the step's keys and values and reads every open
request's back (`index_select`) into one new tensor for the attention. Side by side, on random keys laid out in
32-token pages as the engine's cache holds them, attention included (one SDPA call per request, as `varlen_sdpa`):

- read-back, fresh tensor: transformers' own `update` (a new tensor each call);
- read-back, kept buffer: `engine.ReusedReads` (the same rows into two buffers reused by every layer and step);
- per request: each request's rows read just before its attention, into a small buffer (tried, not kept:
  BENCHMARKS.md says why);
- in place: attention over rows already contiguous, no read at all (the floor; what the old path's reserved cache
  did).

    .venv/bin/python benchmarks/engine_cpu_reads.py
"""

from __future__ import annotations

import time

import torch

PAGE, HEADS, KV_HEADS, DIM = 32, 4, 2, 64  # the quickstart's tiny model


def case(requests: int, shortest: int, longest: int) -> dict[str, float]:
    torch.manual_seed(0)
    lengths = torch.randint(shortest, longest, (requests,)).tolist()
    pages = [-(-n // PAGE) for n in lengths]
    pool = requests * 2048 // PAGE
    keys, values = torch.randn(pool * PAGE, KV_HEADS, DIM), torch.randn(pool * PAGE, KV_HEADS, DIM)
    order, used, rows = torch.randperm(pool), 0, []
    for n, p in zip(lengths, pages, strict=True):  # each request's pages scattered through the pool
        rows.append((order[used:used + p, None] * PAGE + torch.arange(PAGE)).flatten()[:n])
        used += p
    index = torch.cat(rows)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    query = torch.randn(1, HEADS, requests, DIM)
    kept = torch.empty(len(index), KV_HEADS, DIM), torch.empty(len(index), KV_HEADS, DIM)
    small = torch.empty(longest, KV_HEADS, DIM), torch.empty(longest, KV_HEADS, DIM)

    def attend(k: torch.Tensor, v: torch.Tensor, b: int) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            query[:, :, b:b + 1], k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), enable_gqa=True)

    def packed(k: torch.Tensor, v: torch.Tensor) -> list[torch.Tensor]:
        return [attend(k[bounds[b]:bounds[b + 1]], v[bounds[b]:bounds[b + 1]], b) for b in range(requests)]

    def per_request() -> list[torch.Tensor]:
        out = []
        for b in range(requests):
            r = index[bounds[b]:bounds[b + 1]]
            out.append(attend(torch.index_select(keys, 0, r, out=small[0][:len(r)]),
                              torch.index_select(values, 0, r, out=small[1][:len(r)]), b))
        return out

    forms = {
        "read-back, fresh tensor": lambda: packed(keys.index_select(0, index), values.index_select(0, index)),
        "read-back, kept buffer": lambda: packed(torch.index_select(keys, 0, index, out=kept[0]),
                                                 torch.index_select(values, 0, index, out=kept[1])),
        "per request": per_request,
        "in place": lambda: packed(keys[:len(index)], values[:len(index)]),
    }
    times = {}
    for name, form in forms.items():
        form()
        started = time.perf_counter()
        for _ in range(20):
            form()
        times[name] = (time.perf_counter() - started) / 20 * 1e3
    return times


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per layer (keys and values, attention)")
    for requests, shortest, longest in ((32, 300, 800), (32, 1000, 2000), (200, 300, 1000)):
        times = case(requests, shortest, longest)
        print(f"{requests} requests of {shortest}-{longest} tokens: "
              + ", ".join(f"{name} {ms:.2f}" for name, ms in times.items()), flush=True)


if __name__ == "__main__":
    main()
