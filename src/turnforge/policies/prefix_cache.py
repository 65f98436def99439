"""Per-episode KV caches kept between turns, for the hf policy (what vLLM's prefix caching gives for free).

In a token-exact rollout an episode's next prompt is its last prompt + the ids just generated + the
observation's ids, so the keys and values of everything but the new suffix are already known. Without this
cache every turn re-encodes the whole conversation (the cost grows with the square of the episode length;
on a CPU it was ~85 % of a quickstart evaluation). With it, a batch is laid out per row as

    [pads | cached ids (keys/values from the cache)] [pads | new suffix ids] -> generate

with attention-mask zeros on both pad runs; positions come from the mask's running sum, so every token keeps
the RoPE position it had when it was first encoded. After `generate`, each row's real positions (cached +
suffix + its generated ids but the last, whose keys were never computed) are gathered back into its entry.
A prompt that does not extend its entry (a history window re-renders the prompt) is encoded afresh.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [kv_heads, tokens, head_dim]


@dataclass
class Entry:
    ids: list[int]
    layers: Layers

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class PrefixCache:
    """Episode key -> (ids encoded so far, their keys/values); entries of closed episodes are dropped.

    At most `max_bytes` are held (a 4B model's keys/values take ~150 KB per token): an entry that would pass
    the budget is not stored, and that episode's next turn is encoded afresh.
    """

    def __init__(self, max_bytes: int = 4 << 30) -> None:
        self.entries: dict[Hashable, Entry] = {}
        self.max_bytes = max_bytes
        self.held = 0  # bytes of the entries held (summing them at every store cost a batch of n episodes n^2 steps)

    def store(self, key: Hashable, entry: Entry) -> None:
        self._drop(key)
        size = entry.nbytes
        if self.held + size <= self.max_bytes:
            self.entries[key] = entry
            self.held += size

    def cached_length(self, key: Hashable, ids: Sequence[int]) -> int:
        """How many leading ids of `ids` are cached for `key` (0 unless the entry is a proper prefix)."""
        entry = self.entries.get(key)
        if entry is None or len(entry.ids) >= len(ids) or list(ids[: len(entry.ids)]) != entry.ids:
            return 0
        return len(entry.ids)

    def forget(self, keys: Iterable[Hashable]) -> None:
        """Drop the entries of these (ended) episodes."""
        for key in keys:
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.held -= entry.nbytes


def batch_layout(
    prompts: list[list[int]], cached: list[int], pad: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(input_ids, attention_mask, P, S) on `device`: each row = left-padded cached part (width P) + left-padded
    suffix (width S)."""
    width_cached = max(cached)
    width_suffix = max(len(p) - n for p, n in zip(prompts, cached, strict=True))
    rows, masks = [], []
    for ids, n in zip(prompts, cached, strict=True):
        suffix = ids[n:]
        gap_c, gap_s = width_cached - n, width_suffix - len(suffix)
        rows.append([pad] * gap_c + list(ids[:n]) + [pad] * gap_s + list(suffix))
        masks.append([0] * gap_c + [1] * n + [0] * gap_s + [1] * len(suffix))
    return torch.tensor(rows, device=device), torch.tensor(masks, device=device), width_cached, width_suffix


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of a buffer with room for `reserve` more positions.

    transformers' DynamicLayer appends each generated token with `torch.cat`, which copies the whole cache every
    step (~28 % of a CPU evaluation of the tiny model); here a step writes one position in place. The buffer
    doubles if a call outgrows it. Only appending is supported (no beam search, no cropping): what
    `HFPolicy.generate` does.
    """

    def __init__(self, reserve: int) -> None:
        super().__init__()
        self.reserve = reserve
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if not self.is_initialized or end > self._keys.shape[-2]:
            self._grow(key_states, end)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        return self._advance(end)

    def prefill(self, rows: list[tuple[torch.Tensor, torch.Tensor] | None], width: int, like: torch.Tensor) -> None:
        """Start as `width` positions: row i's (keys, values) right-aligned, zeros (masked) before it; written
        straight into the buffer (no `width`-sized tensor copied in a second time)."""
        template = next(r for r in rows if r is not None)[0]
        self._grow(template.new_empty(len(rows), template.shape[0], 0, template.shape[2], device=like.device), width)
        for i, row in enumerate(rows):
            if row is not None:
                n = row[0].shape[-2]
                self._keys[i, :, width - n : width] = row[0]
                self._values[i, :, width - n : width] = row[1]
        self._advance(width)

    def _advance(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def _grow(self, like: torch.Tensor, end: int) -> None:
        room = max(end + self.reserve, 2 * self.length)
        keys = like.new_zeros(like.shape[0], like.shape[1], room, like.shape[3])
        values = torch.zeros_like(keys)
        if self.is_initialized:
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self.dtype, self.device, self.is_initialized = like.dtype, like.device, True
        self._keys, self._values = keys, values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a ReservedLayer cache only grows (HFPolicy's generate never crops)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a ReservedLayer cache keeps its rows (HFPolicy's generate never drops one)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a ReservedLayer cache keeps its rows (no beam search in HFPolicy)")


def reserved_cache(config, reserve: int) -> DynamicCache:
    """An empty DynamicCache of `ReservedLayer`s (one per decoder layer of `config`)."""
    cache = DynamicCache(config=config)
    cache.layers = [ReservedLayer(reserve) for _ in cache.layers]
    return cache


def batch_cache(entries: list[Entry | None], cached: list[int], width: int, config, like: torch.Tensor,
                reserve: int = 0) -> DynamicCache:
    """A cache of `width` positions (room for `reserve` more): row i's entry right-aligned, zeros (masked) before it."""
    cache = reserved_cache(config, reserve)
    if width == 0:
        return cache
    for index, layer in enumerate(cache.layers):
        layer.prefill([entry.layers[index] if n else None for entry, n in zip(entries, cached, strict=True)], width, like)
    return cache


def gather_rows(cache: DynamicCache, positions: list[torch.Tensor], rows: list[int]) -> list[Layers]:
    """For each of `rows`, the keys/values at `positions[j]` (indices along the sequence axis) of every layer."""
    out: list[Layers] = [[] for _ in rows]
    for layer in cache.layers:
        for j, (row, where) in enumerate(zip(rows, positions, strict=True)):
            out[j].append((layer.keys[row, :, where].clone(), layer.values[row, :, where].clone()))
    return out
