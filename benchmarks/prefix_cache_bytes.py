"""The hf policy's prefix cache: the bytes it holds counted as entries come and go (turnforge, `PrefixCache.held`) vs
summed over every entry at each store (the way before: a turn of n open episodes made n stores of n sums).

The store pattern of an evaluation as the quickstart runs it, without the model: `--episodes` episodes open at once,
each turn one store per episode of its grown keys/values (the quickstart tiny model's shape: 4 layers, 2 key/value
heads of 64, float32; 260 tokens at the first turn, 30 more a turn), for `--turns` turns, then every episode
forgotten. The two ways alternate `--repeats` times in one process and must end holding the same bytes.

    .venv/bin/python benchmarks/prefix_cache_bytes.py
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from turnforge.policies.prefix_cache import Entry, PrefixCache

LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64


class SummingPrefixCache(PrefixCache):
    """The peer: the store as it was, summing every held entry's size before each store."""

    def store(self, key, entry: Entry) -> None:
        self._drop(key)
        held = sum(e.nbytes for e in self.entries.values())
        if held + entry.nbytes <= self.max_bytes:
            self.entries[key] = entry
            self.held += entry.nbytes


def play(cache: PrefixCache, episodes: int, turns: int, layers: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> int:
    """Every turn's stores, then the episodes forgotten; the bytes held at the last turn."""
    for turn in range(turns):
        for e in range(episodes):
            cache.store(e, Entry(ids=[], layers=layers[turn]))
    held = cache.held
    cache.forget(range(episodes))
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    # A turn's entries share tensors (only their sizes are read): the memory of one episode, not of all.
    layers = [[(torch.empty(KV_HEADS, 260 + 30 * t, HEAD_DIM), torch.empty(KV_HEADS, 260 + 30 * t, HEAD_DIM))
               for _ in range(LAYERS)] for t in range(args.turns)]
    ways = {"summed at every store (before)": SummingPrefixCache, "counted as held (turnforge)": PrefixCache}
    results = {w: {"wall_s": 0.0, "held": None} for w in ways}
    for _ in range(args.repeats):
        for way, cls in ways.items():
            start = time.perf_counter()
            held = play(cls(), args.episodes, args.turns, layers)
            results[way]["wall_s"] += time.perf_counter() - start
            results[way]["held"] = held
    assert len({r["held"] for r in results.values()}) == 1, results
    print(f"{args.episodes} episodes x {args.turns} turns, {args.repeats} repeats; bytes held at the last turn both ways: "
          f"{results[next(iter(ways))]['held']}\n")
    print("| way | wall for the evaluation's stores (s) |")
    print("|---|---:|")
    for way, r in results.items():
        print(f"| {way} | {r['wall_s'] / args.repeats:.3f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
