"""The hf backend before the continuous-batching engine, kept for side-by-side measurement only (not in src/).

Left-padded batched `generate` with a hand-written per-episode KV prefix cache, a per-row Gumbel sampler, a
log-prob recorder and CPU grouped-query attention: what `turnforge.policies.hf` did up to commit 268e1ee, copied
here whole (its three modules in one file) so that `benchmarks/hf_engine.py` runs both paths in one process.
"""

# ruff: noqa: E402  (three modules concatenated whole, each with its imports)
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "turnforge_cpu_gqa_sdpa"


def cpu_gqa_sdpa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa_attention_forward`, but several query tokens with a mask over grouped key/value heads
    go to SDPA as they are (`enable_gqa=True`) instead of after `repeat_kv`."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not kwargs.get("output_attentions")
    if groups > 1 and query.shape[2] > 1 and attention_mask is not None and plain:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True,
        )
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


AttentionInterface.register(NAME, cpu_gqa_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks as "sdpa" builds


@contextmanager
def cpu_gqa(model) -> Iterator[None]:
    """Within the block, a model on a CPU that uses "sdpa" attention uses `cpu_gqa_sdpa_forward` instead."""
    config = getattr(model, "config", None)
    device = next(model.parameters()).device
    if config is None or device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"




from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

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





import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from turnforge.formats.chat_template import ChatTemplateRenderer
from turnforge.policies import hf as engine_hf
from turnforge.policies.base import (
    Generation,
    Prompt,
    SamplingParams,
    explores,
    model_context,
    prompt_ids,
    refuse_overlong,
)
from turnforge.policies.hf import finish_generation, row_seed  # the rules both paths share

# Generation settings the model's own generation_config.json must not slip in (HF fills unset fields from it,
# e.g. Qwen3's top_k=20): sampling is configured here, in `_processors`, and nowhere else.
_NEUTRAL = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repetition_penalty=1.0,
                no_repeat_ngram_size=0, epsilon_cutoff=0.0, eta_cutoff=0.0)


class HFPolicy(engine_hf.HFPolicy):
    """The old hf policy: loading as the new one (`__init__`, `from_model`), generating with batched `generate`.
    The new one's last constructor argument (`prefix_sharing`) is this one's `prefix_cache`."""

    max_in_flight = 1  # batches come from the rollout's queue, one call at a time

    def _setup(
        self, model_id: str, model, tokenizer, window: int | None, batch_size: int, prefix_cache: bool = True
    ) -> None:
        self.model_id = model_id
        self.model, self.tokenizer = model, tokenizer
        self.renderer = ChatTemplateRenderer(self.tokenizer, window=window)
        self.batch_size = batch_size
        eos = self.model.generation_config.eos_token_id
        extra = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.stop_ids = sorted({self.tokenizer.eos_token_id, *extra})
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix_cache else None
        self._engine = None  # the new policy's; `close` then has nothing to stop
        self._engine_lock = threading.Lock()
        self.max_context = model_context(self.model.config)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        """One reply per prompt, in order; prompts run in chunks of `batch_size`, shortest first (less padding), the
        prompts encoded afresh apart from those that extend their episode's cached prefix. A prompt with no room
        for `max_new_tokens` in the model's context is refused (`refuse_overlong`), never cut or run past it."""
        ids = [prompt_ids(p, self.renderer) for p in prompts]
        out: list[Generation | None] = [None] * len(ids)
        for i, refusal in refuse_overlong(ids, params.max_new_tokens, self.max_context).items():
            out[i] = refusal
        # Token-exact prompts extend the episode's last one: its keys/values are reused (`prefix_cache`).
        keys = [(p.task.id, p.sample) if p.ids is not None and self.prefix_cache is not None else None for p in prompts]
        seeds = [row_seed(params.seed, p, row) for p, row in zip(prompts, ids, strict=True)]
        sampled = [explores(params, p) for p in prompts]
        # Episodes that go on from their cached keys/values run apart from prompts encoded afresh: in one batch every
        # row would be padded to a fresh prompt's whole length (in a rollout, a new episode joining old ones).
        cached = [self.prefix_cache.cached_length(key, row) if key is not None else 0 for key, row in zip(keys, ids, strict=True)]
        for fresh in (True, False):
            left = (i for i in range(len(ids)) if out[i] is None and (cached[i] == 0) is fresh)
            order = sorted(left, key=lambda i: len(ids[i]))
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = self._generate_batch(
                    [ids[i] for i in chunk], params, [keys[i] for i in chunk], [seeds[i] for i in chunk],
                    [cached[i] for i in chunk], [sampled[i] for i in chunk],
                )
                for i, gen in zip(chunk, batch, strict=True):
                    out[i] = gen
        return out  # type: ignore[return-value]

    def release(self, keys: list[tuple[str, int]]) -> None:
        """The rollout is done with these episodes: drop their prefix-cache entries."""
        if self.prefix_cache is not None:
            self.prefix_cache.forget(keys)

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams, keys: list, seeds: list[int],
                        cached: list[int], sampled: list[bool]) -> list[Generation]:
        """`cached[i]`: how many leading ids of prompt i the prefix cache holds for `keys[i]` (0: encoded afresh);
        `sampled[i]`: row i is sampled, else greedy (`SamplingParams.explore`)."""
        if min(len(p) for p in prompts) == 0:
            raise ValueError("an empty prompt: the hf policy needs at least one prompt token")
        cache = self.prefix_cache
        pad = self.tokenizer.pad_token_id
        input_ids, attention_mask, width_cached, width_suffix = batch_layout(prompts, cached, pad, self.device)
        entries = [cache.entries[k] if n else None for k, n in zip(keys, cached, strict=True)] if cache else []
        # Room for the suffix and the reply: generating then writes each new position in place.
        reserve = width_suffix + params.max_new_tokens
        past = batch_cache(entries, cached, width_cached, self.model.config, input_ids, reserve)
        recorder = SampledLogprobs()
        # Sampling is done by `RowSampler` (each row from its own generator), so generate itself decodes greedily.
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=False,
            eos_token_id=self.stop_ids,
            pad_token_id=pad,
            stop_strings=list(params.stop) or None,
            return_dict_in_generate=True,
            **_NEUTRAL,
        )
        with cpu_gqa(self.model):  # a turn's prompt over its cached prefix: no copy of the cache per attention call
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=past,
                generation_config=config,
                logits_processor=_processors(params, recorder, seeds, sampled),
                tokenizer=self.tokenizer if params.stop else None,
            )
        width = width_cached + width_suffix
        new = output.sequences[:, width:]
        logprobs = recorder.logprobs(new).tolist()
        gens = [self._finish(row, lp, params.stop) for row, lp in zip(new.tolist(), logprobs, strict=True)]
        if cache is not None:
            self._remember(output.past_key_values, prompts, cached, keys, gens, width_cached, width_suffix)
        return gens

    def _remember(self, past, prompts, cached, keys, gens, width_cached: int, width_suffix: int) -> None:
        """Store each episode's keys/values: its cached part, its suffix, and its reply but the last token."""
        rows, positions = [], []
        for i, (ids, n, key, gen) in enumerate(zip(prompts, cached, keys, gens, strict=True)):
            if key is None or not gen.ids:
                continue
            start = width_cached + width_suffix
            suffix = len(ids) - n
            where = torch.cat([
                torch.arange(width_cached - n, width_cached),
                torch.arange(start - suffix, start),
                torch.arange(start, start + len(gen.ids) - 1),
            ])
            rows.append((i, key, list(ids) + gen.ids[:-1]))
            positions.append(where.to(self.device))  # indexes the cache's tensors, which live on the model's device
        if not rows:
            return
        picked = [i for i, _, _ in rows]
        layers = gather_rows(past, positions, picked)
        for (_, key, ids), entry_layers in zip(rows, layers, strict=True):
            self.prefix_cache.store(key, Entry(ids, entry_layers))

    def _finish(self, ids: list[int], logprobs: list[float], stop: Sequence[str]) -> Generation:
        return finish_generation(ids, logprobs, self.stop_ids, stop, self.tokenizer)


class SampledLogprobs(LogitsProcessor):
    """Records log_softmax of the scores it sees; the next step's input reveals which token was sampled.

    Placed after the temperature warper and before top-k / top-p, so it sees logits / T. Only the last step's
    distribution is held (batch x vocab); `logprobs(new_ids)` gathers the final token's after generation.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self.steps.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, new_ids: torch.Tensor) -> torch.Tensor:
        """[batch, new tokens] log-probabilities of `new_ids` (the generated part of the sequences)."""
        if self.previous is None or new_ids.shape[1] == 0:
            return torch.zeros(new_ids.shape, dtype=torch.float32)
        last = self.previous.gather(1, new_ids[:, -1:]).squeeze(1)
        return torch.stack([*self.steps, last], dim=1).cpu()


class RowSampler(LogitsProcessor):
    """Samples every row from its own generator (seeded by `row_seed`): the Gumbel-max trick, argmax(scores + G)
    with G ~ Gumbel(0, 1) drawn per row, is a draw from softmax(scores); generate then decodes greedily. Last in
    the list, after temperature and top-k / top-p (their -inf stays -inf). transformers samples the whole batch
    from the one global generator instead, so a row's draw depended on its neighbours. Rows not `sampled` get no
    noise: their argmax is the greedy token (temperature and top-p keep the most likely token on top)."""

    def __init__(self, seeds: list[int], sampled: list[bool] | None = None) -> None:
        self.seeds = seeds
        self.sampled = sampled if sampled is not None and not all(sampled) else None  # None: every row sampled
        self.generators: list[torch.Generator] | None = None
        self.noise_mask: torch.Tensor | None = None  # [rows, 1]: 1 sampled, 0 greedy; built once, on the first step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(s) for s in self.seeds]
        width = scores.shape[-1]
        uniform = torch.stack([torch.rand(width, generator=g, device=scores.device) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform.clamp(min=1e-20)))
        if self.sampled is not None:
            if self.noise_mask is None:
                self.noise_mask = torch.tensor(self.sampled, dtype=gumbel.dtype, device=gumbel.device).unsqueeze(1)
            gumbel = gumbel * self.noise_mask
        return scores.float() + gumbel


class TopP(LogitsProcessor):
    """transformers' `TopPLogitsWarper` (keep the most likely tokens until their mass reaches `top_p`, at least one),
    looked for among each row's `k` most likely tokens: a token is kept when the tokens more likely than it hold
    less than `top_p`. Rows whose `k` tokens hold less than `top_p` take transformers' warper. transformers sorts
    the whole vocabulary at every decoding step, ~8 % of a sampled rollout of the quickstart's model on a CPU."""

    def __init__(self, top_p: float, k: int = 64) -> None:
        self.top_p, self.k = top_p, k
        self.whole = TopPLogitsWarper(top_p)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        top, where = scores.topk(min(self.k, scores.shape[-1]), dim=-1)  # sorted, most likely first
        probs = torch.exp(top - torch.logsumexp(scores, dim=-1, keepdim=True))
        before = probs.cumsum(dim=-1) - probs  # the mass of the tokens more likely than each
        out = torch.full_like(scores, -float("inf"))
        out.scatter_(1, where, top.masked_fill(before >= self.top_p, -float("inf")))
        short = probs.sum(dim=-1) < self.top_p  # the nucleus may reach past the k tokens
        if short.any():
            out[short] = self.whole(input_ids[short], scores[short])
        return out


def _processors(params: SamplingParams, recorder: SampledLogprobs, seeds: list[int],
                sampled: list[bool] | None = None) -> LogitsProcessorList:
    """Temperature, the log-prob recorder, top-k and top-p, then the per-row sampler (greedy: the recorder alone)."""
    if params.temperature == 0:
        return LogitsProcessorList([recorder])
    out: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        out.append(TemperatureLogitsWarper(params.temperature))
    out.append(recorder)
    if params.top_k > 0:
        out.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        out.append(TopP(params.top_p))
    out.append(RowSampler(seeds, sampled))
    return LogitsProcessorList(out)
