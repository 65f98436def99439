"""The hf backend's generator: transformers' continuous-batching engine (`ContinuousBatchingManager`).

Each reply is one engine request: submitted when its episode is ready, handed back (`Future`) as soon as it
finishes, while the engine's own loop keeps stepping every open request — no lock-step batch waits for its
slowest reply. The paged KV cache shares whole blocks by content (`allow_block_sharing`): an episode's turn k
starts from the blocks its turns 1..k-1 filled, so only the new suffix is prefilled (the hand-written prefix
cache this replaces did the same per episode).

What stays hand-written, and why (one thing): `TurnSampling`, the engine's sampler. transformers' engine samples
every row from one global generator and reports log-probabilities after top-k/top-p; turnforge's contract is
per-reply seeded draws (the same episodes at any concurrency) and log_softmax(logits / T) before truncation (what
TRL recomputes). It replaces the engine's processor list (the per-request arguments ride in the engine's static
input rows) and its output step, both in `_install` — the one place that touches the engine's internals (pinned:
transformers 5.19-5.24; tests/test_hf_policy.py fails by name when they move). On a CPU `_install` also makes the
cache read its keys and values back into buffers it reuses (`ReusedReads`).

The sampler is tensor work only (a counter-based inverse-CDF draw, no per-reply generator, nothing read back to the
host inside the step), so on a GPU the engine captures its steps in CUDA graphs; on a CPU the same code runs
eagerly.
Batching is synchronous: each step's arguments are prepared after the previous step's tokens are known
(docs/decisions.md, "The hf policy on transformers' continuous-batching engine").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import itertools
import struct
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

# The transformers releases whose engine internals `_install` was verified against.
VERIFIED_TRANSFORMERS = ("5.19", "5.20", "5.21", "5.22", "5.23", "5.24")

# Tokens per KV page: the unit of prefix sharing (a turn reuses whole pages only; transformers' default is 256).
PAGE_SIZE = 32
# On a CPU the cache is sized here, not left to transformers' "60 % of free memory" (gigabytes per engine on a
# 24 GiB machine, and its SDPA path allocates an attention mask of tokens-per-step x cache tokens beside it):
# 2,048 tokens per open request, and never less than one whole request of the model's context (up to 64k tokens),
# since a request that cannot fit stops the engine ("No requests can be scheduled"). On a GPU transformers sizes
# it from the free memory.
REQUEST_TOKENS = 2048
CPU_MAX_REQUEST = 65536
CPU_STEP_TOKENS = 1024


@dataclass
class Reply:
    """One request's sampling: temperature (0: greedy), top-k (0: off), top-p (1: off), its seed, and how many tokens
    it has drawn (the counter its draws are hashed from)."""

    temperature: float
    top_k: int
    top_p: float
    seed: int
    sampled: bool
    drawn: int = 0

    @classmethod
    def greedy(cls) -> Reply:
        """The arguments of a row that no reply owns (the engine's warm-up, its defaults)."""
        return cls(0.0, 0, 1.0, 0, False)


# The rows of per-request arguments the engine carries to the sampler in its static input tensor (int32 each):
# temperature (float32 bits; 0 = greedy), top-k (0 = off), top-p (float32 bits), the seed's low and high 32 bits,
# and the index of the token being drawn.
ARG_ROWS = 6
_MASK32 = 0xFFFFFFFF


class TurnSampling(ContinuousBatchingLogitsProcessorList):
    """The engine's sampler: temperature -> record log_softmax -> top-k -> top-p -> each reply's own draw.

    A sampled row draws by inverting the cumulative distribution of the truncated softmax at one uniform number, and
    that number is counter-based: a hash of (the reply's seed, the index of the token drawn), so a reply draws the
    same tokens whichever other replies share its steps. A greedy row takes the argmax. The recorded log-probability
    of the chosen token is log_softmax(logits / T) before truncation (greedy: log_softmax(logits)); it travels in
    the engine's own log-prob output row.

    Everything per step is tensor work on the engine's static argument rows (`prepare_tensor_args` fills them on
    the host), so the engine can capture it in a CUDA graph. Eagerly (a CPU), the sort for top-k/top-p and the draw
    are skipped for a batch with no row that needs them; in a graph they always run (a captured graph cannot branch).
    """

    def __init__(self, graphs: bool) -> None:
        super().__init__(LogitsProcessorList())
        self.tensors_required = ARG_ROWS
        self.do_processing = True
        self.graphs = graphs
        self.replies: dict[str, Reply] = {}
        self.lock = threading.Lock()
        self._any_truncated = self._any_sampled = False
        self._drawn: tuple[torch.Tensor, torch.Tensor] | None = None

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.copy_(_arg_rows([Reply.greedy()]).to(int32_tensor.device))

    def prepare_tensor_args(self, requests_in_batch, arg_storage: torch.Tensor) -> torch.Tensor:
        """Fill the argument rows of the requests that draw a token this step, in the engine's row order (called on
        the engine's thread before the step's forward)."""
        ids = [r.state.request_id for r in requests_in_batch if r.has_new_token]
        with self.lock:
            replies = [self.replies.get(i) or Reply.greedy() for i in ids]
        rows = _arg_rows(replies)
        for reply in replies:
            reply.drawn += 1
        self._any_sampled = any(r.sampled for r in replies)
        self._any_truncated = any(r.sampled and (r.top_k > 0 or r.top_p < 1.0) for r in replies)
        arg_storage[:, : len(ids)] = rows.to(arg_storage.device)
        return arg_storage

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
        n, width = scores.shape
        args = args[:, :n]
        temperature = args[0].view(torch.float32)
        sampled = temperature > 0
        scaled = scores / torch.where(sampled, temperature, 1.0).unsqueeze(-1) if self.graphs or self._any_sampled else scores
        logprobs = torch.log_softmax(scaled, dim=-1)
        tokens = scaled.argmax(dim=-1)
        if self.graphs or self._any_sampled:
            if self.graphs or self._any_truncated:
                ordered, order = scaled.sort(dim=-1, descending=True)
                weights = truncated_probs(ordered, torch.where(sampled, args[1], 0), args[2].view(torch.float32))
            else:
                order, weights = None, logprobs.exp()
            drawn = inverse_cdf(weights, draw_uniform(args[3], args[4], args[5]))
            if order is not None:
                drawn = order.gather(1, drawn.unsqueeze(1)).squeeze(1)
            tokens = torch.where(sampled, drawn, tokens)
        self._drawn = (tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1))
        return scores

    def write_outputs(self, scores: torch.Tensor, output_ids: torch.Tensor) -> None:
        """The engine's output step (in place of its `_sample`): the drawn ids, and their log-probabilities in the
        log-prob row (float32 bits, as the engine stores its own)."""
        tokens, logprobs = self._drawn
        output_ids[0, : tokens.size(0)].copy_(tokens)
        output_ids[1, : tokens.size(0)].copy_(logprobs.view(torch.int32))


def _arg_rows(replies: list[Reply]) -> torch.Tensor:
    """The int32 argument rows (`ARG_ROWS`) of `replies`, one column each.

    >>> _arg_rows([Reply(0.5, 40, 0.9, (7 << 32) | 3, True, drawn=2)])[:, 0].tolist()
    [1056964608, 40, 1063675494, 3, 7, 2]
    """
    def bits(value: float) -> int:
        return struct.unpack("<i", struct.pack("<f", value))[0]

    def signed(word: int) -> int:
        return word - (1 << 32) if word >= 1 << 31 else word

    columns = [[bits(r.temperature if r.sampled else 0.0), r.top_k, bits(r.top_p), signed(r.seed & _MASK32),
                signed((r.seed >> 32) & _MASK32), r.drawn] for r in replies]
    return torch.tensor(columns, dtype=torch.int32).reshape(len(replies), ARG_ROWS).T


def truncated_probs(ordered: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's probabilities after top-k then top-p, over its scores sorted in descending order (not renormalised):
    transformers' TopK then TopP warpers in one sort. Top-k keeps the first k (0: all); top-p then keeps a token
    while the mass of the tokens before it, renormalised over the top-k, is below p (the first always).

    >>> ordered = torch.log(torch.tensor([[0.6, 0.25, 0.1, 0.05]])).repeat(3, 1)
    >>> kept = truncated_probs(ordered, torch.tensor([0, 2, 0]), torch.tensor([1.0, 1.0, 0.8]))
    >>> [[round(p, 2) for p in row] for row in kept.tolist()]
    [[0.6, 0.25, 0.1, 0.05], [0.71, 0.29, 0.0, 0.0], [0.6, 0.25, 0.0, 0.0]]
    """
    position = torch.arange(ordered.size(-1), device=ordered.device)
    top_k = torch.where(top_k > 0, top_k, ordered.size(-1)).unsqueeze(-1)
    probs = torch.softmax(ordered.masked_fill(position >= top_k, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs
    return probs.masked_fill(before >= top_p.unsqueeze(-1), 0.0)


def inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Per row, the index where the running sum of `weights` (not necessarily normalised) first reaches `uniform` (in
    (0, 1)) times their total: a draw from the weights. Sums in float64; a zero weight is never drawn.

    >>> inverse_cdf(torch.tensor([[0.5, 0.0, 0.5]] * 3), torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    [0, 0, 2]
    """
    cdf = weights.to(torch.float64).cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target).squeeze(-1).clamp(max=weights.size(-1) - 1)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 values in [0, 2**32): no product leaves int64,
    so every device computes the same bits."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def draw_uniform(seed_low: torch.Tensor, seed_high: torch.Tensor, drawn: torch.Tensor) -> torch.Tensor:
    """One uniform number in (0, 1) per row, at 53-bit resolution, from a hash of its seed (two int32 words) and the
    index of the token it draws. Tensor work only (graph-safe).

    >>> u = draw_uniform(*torch.tensor([[5, 5, 6], [0, 0, 0], [0, 1, 0]], dtype=torch.int32))
    >>> bool(((0 < u) & (u < 1)).all()), len(set(u.tolist()))
    (True, 3)
    """
    def word(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.int64) & _MASK32

    key = _mix32(word(seed_low) ^ _mix32(word(seed_high) ^ _mix32(word(drawn))))
    high, low = _mix32(key ^ 0x9E3779B9) >> 6, _mix32(key ^ 0x7F4A7C15) >> 5  # 26 + 27 bits
    return ((high * (1 << 27) + low).to(torch.float64) + 0.5) / float(1 << 53)


CPU_ATTENTION = "turnforge_varlen_sdpa"
"""The attention the engine runs on a CPU (registered with transformers' `AttentionInterface`, its public way to
add one): the engine packs every request of a step into one sequence, and its SDPA path then attends each query to
every request's keys through a mask — O(requests^2 x context) a step, and every key/value head copied per query
head (a profile of the quickstart's 200-episode evaluation: 60 % of the engine's time in that attention and its
`repeat_kv`; 4-8x slower than the batched `generate` it replaced). This one attends each request to its own keys
(`cu_seq_lens_q/k`, which transformers' engine passes to an attention that needs no mask), key/value heads kept
grouped (`enable_gqa`)."""


def varlen_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, scaling=None,
                dropout: float = 0.0, **kwargs):
    """Attention over packed requests [1, heads, tokens, dim], each to its own keys (the last `q` of its `k` keys
    are its queries: causal, bottom-right aligned). Without the engine's sequence bounds (a plain forward of the
    same model) it is transformers' SDPA attention, unchanged."""
    bounds_q, bounds_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if isinstance(bounds_k, dict):
        bounds_k = bounds_k["sliding_attention" if getattr(module, "sliding_window", None) else "full_attention"]
    if bounds_q is None or bounds_k is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    starts_q, starts_k = bounds_q.tolist(), bounds_k.tolist()
    outputs = []
    for q0, q1, k0, k1 in zip(starts_q, starts_q[1:], starts_k, starts_k[1:], strict=False):
        q, k = q1 - q0, k1 - k0
        mask = None
        if q > 1:
            rows = torch.arange(q, device=query.device).unsqueeze(1) + (k - q)
            mask = torch.arange(k, device=query.device).unsqueeze(0) <= rows
        outputs.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], attn_mask=mask, scale=scaling, enable_gqa=True))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None  # (on a CPU the engine pads no rows)


AttentionInterface.register(CPU_ATTENTION, varlen_sdpa)
AttentionMaskInterface.register(CPU_ATTENTION, sdpa_mask)
CPU_ATTENTION_VERIFIED = ("5.24",)
"""The transformers releases whose engine gives `varlen_sdpa` every key it attends to. 5.19 (vLLM's CPU build's)
reads cached prefix blocks only for attentions that take a mask (its key states hold the new tokens alone): with
another release the engine keeps SDPA (slower, never wrong)."""


def _cpu_attention_verified() -> bool:
    import transformers

    return ".".join(transformers.__version__.split(".")[:2]) in CPU_ATTENTION_VERIFIED


def _count_masks_as_allocated() -> None:
    """transformers' cache counts an attention mask of (tokens a step) x (cache tokens) in its memory footprint for
    every attention but flash, and allocates one only for eager and SDPA (`attn_mask_is_needed`). With
    `CPU_ATTENTION` the mask is counted, never made: 1.7 GB of the 4.4 GB an engine of 200 open requests was said
    to need on the tiny model, and where transformers reads a smaller total (a VM whose NUMA node holds half its
    RAM) the engine refused to start ("Memory footprint ... is more than available memory"). Here the footprint
    counts it as transformers allocates it, on the releases `CPU_ATTENTION` runs on."""
    from transformers.generation.continuous_batching import cache, utils

    handler = getattr(cache, "PagedAttentionMemoryHandler", None)
    counted = getattr(handler, "attention_mask_bytes", None)
    if counted is None or not callable(getattr(utils, "attn_mask_is_needed", None)):
        raise RuntimeError("transformers' PagedAttentionMemoryHandler.attention_mask_bytes or attn_mask_is_needed is "
                           f"gone; turnforge's CPU attention was verified with transformers "
                           f"{', '.join(CPU_ATTENTION_VERIFIED)} (src/turnforge/policies/engine.py)")
    if getattr(counted, "_turnforge", False):
        return

    def attention_mask_bytes(self, max_batch_tokens: int, num_sectors: int) -> int:
        return counted(self, max_batch_tokens, num_sectors) if utils.attn_mask_is_needed(self.config) else 0

    attention_mask_bytes._turnforge = True
    handler.attention_mask_bytes = attention_mask_bytes


if _cpu_attention_verified():
    _count_masks_as_allocated()


@dataclass
class Finished:
    """A request's outcome: the generated ids (the end-of-turn id kept) and their log-probabilities."""

    ids: list[int]
    logprobs: list[float]


class TurnEngine:
    """One model's continuous-batching engine: `submit` a reply, get a `Future[Finished]`.

    `on_token(ids_so_far, their_logprobs)`, when given, is called (on the engine's result thread) each time the reply
    grows: what `turnforge serve` streams. `prefix_sharing` off: no block is reused across requests (a server switching LoRA
    adapters, whose blocks differ per adapter for the same ids).
    """

    def __init__(self, model, stop_ids: list[int], pad_id: int | None, prefix_sharing: bool = True,
                 max_requests: int = 64, max_context: int | None = None) -> None:
        self.model = model
        on_cpu = model.device.type == "cpu"
        graphs = model.device.type == "cuda"
        self.sampling = TurnSampling(graphs)
        # Greedy to the engine (no warper is built): `TurnSampling` does all sampling.
        config = GenerationConfig(do_sample=False, eos_token_id=list(stop_ids), pad_token_id=pad_id)
        self.capacity = cpu_cache_tokens(max_requests, max_context) if on_cpu else None
        """Tokens the cache holds (None: sized by transformers from free memory); a longer request is refused."""
        cb = ContinuousBatchingConfig(
            page_size=PAGE_SIZE, allow_block_sharing=prefix_sharing, use_cuda_graph=graphs, return_logprobs=True,
            use_async_batching=False, max_requests_per_batch=max(1, max_requests), auto_switch_to_flash=False,
            num_blocks=self.capacity // PAGE_SIZE if on_cpu else None,
            max_batch_tokens=CPU_STEP_TOKENS if on_cpu else None,
        )
        self.manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        _install(self.manager, self.sampling, reuse_reads=on_cpu)
        self.stop_ids = list(stop_ids)
        self._ids = itertools.count()
        self._open: dict[str, tuple[Future, Callable | None]] = {}
        self._lock = threading.Lock()
        self._started = False
        self._hook = None
        self._detach: Callable[[], None] | None = None
        self._failed: Exception | None = None
        """Why the engine's loop ended, once it has: later requests are refused with it."""
        self.forward_tokens = 0
        """Tokens the model ran, prefill and decode: with `submitted` and `generated`, what prefix sharing saved."""
        self.submitted = 0
        """Prompt tokens submitted."""
        self.generated = 0
        """Tokens generated (each but a reply's last is run once more, as the next step's input)."""

    def submit(self, ids: list[int], max_new_tokens: int, reply: Reply,
               on_token: Callable[[list[int]], None] | None = None) -> Future:
        self._start()
        future: Future = Future()
        request = f"turn-{next(self._ids)}"
        with self._lock:  # `generate` is called from several threads at once
            if self._failed is not None:  # the engine's loop died: no one would answer this request
                raise RuntimeError(f"the continuous-batching engine stopped: {self._failed}")
            self._open[request] = (future, on_token)
            self.submitted += len(ids)
        with self.sampling.lock:
            self.sampling.replies[request] = reply
        self.manager.add_request(list(ids), request_id=request, max_new_tokens=max_new_tokens,
                                 streaming=on_token is not None, eos_token_id=self.stop_ids)
        return future

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        _RUNNING.add(self)
        self._detach = attach_engine(self.manager.model)
        self._hook = self.manager.model.register_forward_pre_hook(self._count, with_kwargs=True)
        # A thread inherits daemon-ness from the thread that makes it: the engine's loop and our result thread then
        # never keep a finished program alive (the manager's own thread is not a daemon).
        starter = threading.Thread(target=self._start_threads, daemon=True)
        starter.start()
        starter.join()

    def _start_threads(self) -> None:
        self.manager.start()
        threading.Thread(target=self._deliver, daemon=True, name="turnforge-engine-results").start()

    def _count(self, _module, _args, kwargs) -> None:
        ids = kwargs.get("input_ids")
        if ids is not None:
            self.forward_tokens += ids.shape[-1]

    def _deliver(self) -> None:
        while True:
            out = self.manager.get_result(timeout=0.5)
            if out is None:
                if not self.manager.is_running():
                    self._fail_open(RuntimeError("the continuous-batching engine stopped"))
                    return
                continue
            with self._lock:
                future, on_token = self._open.get(out.request_id, (None, None))
            if future is None:
                continue
            if out.error is not None:
                self._close(out.request_id)
                future.set_exception(RuntimeError(f"generation failed: {out.error}"))
            elif out.is_finished():
                self._close(out.request_id)
                ids = list(out.generated_tokens)
                self.generated += len(ids)
                future.set_result(Finished(ids, list(out.logprobs[: len(ids)])))
            elif on_token is not None:
                ids = list(out.generated_tokens)
                on_token(ids, list(out.logprobs[: len(ids)]))

    def _close(self, request: str) -> None:
        with self._lock:
            self._open.pop(request, None)
        with self.sampling.lock:
            self.sampling.replies.pop(request, None)

    def _fail_open(self, error: Exception) -> None:
        with self._lock:
            open_, self._open = self._open, {}
            self._failed = error
        for future, _ in open_.values():
            if not future.done():
                future.set_exception(error)

    def stop(self, hard: bool = False) -> None:
        """Stop the engine's loop (its cache is freed); open requests fail. `hard`: at once, without finishing the
        requests in flight."""
        with self._lock:
            started, self._started = self._started, False
        if started:
            _RUNNING.discard(self)
            self.manager.stop(block=True, hard_stop=hard)
            self._hook.remove()
            self._detach()
            self._fail_open(RuntimeError("the continuous-batching engine was stopped"))


_RUNNING: weakref.WeakSet[TurnEngine] = weakref.WeakSet()


_ATTACHING = threading.Lock()


def attach_engine(model) -> Callable[[], None]:
    """What a running engine changes on its model, undone by the returned release when the model's last engine
    stops (engines on one model share it):

    - one forward at a time, whichever thread calls it. transformers' forward sets `config.is_causal` for its
      duration and restores it after (`merge_with_config_defaults`); the engine's forwards pass `is_causal=False`.
      A forward of the same model from another thread (`turnforge serve`'s scoring, a test's recomputation) that
      overlapped one of the engine's ran non-causal and restored `False` as the config's value: every later plain
      forward was non-causal (wrong log-probs, no error). An RLock taken in a forward pre-hook and released in a
      forward hook (`always_call`: an exception releases it too) serializes them.
    - on a CPU, the model's SDPA attention becomes `CPU_ATTENTION` (plain forwards through it are SDPA's).
    """
    with _ATTACHING:
        state = getattr(model, "_turnforge_engines", None)
        if state is None:
            lock = threading.RLock()
            hooks = (model.register_forward_pre_hook(lambda *_: lock.acquire() and None),
                     model.register_forward_hook(lambda *_: lock.release(), always_call=True))
            attention = model.config._attn_implementation
            if model.device.type == "cpu" and attention == "sdpa" and _cpu_attention_verified():
                model.set_attn_implementation(CPU_ATTENTION)
            state = model._turnforge_engines = {"users": 0, "hooks": hooks, "attention": attention, "lock": lock}
        state["users"] += 1

    def release() -> None:
        with _ATTACHING:
            state["users"] -= 1
            if state["users"] == 0:
                for hook in state["hooks"]:
                    hook.remove()
                if model.config._attn_implementation != state["attention"]:
                    model.set_attn_implementation(state["attention"])
                del model._turnforge_engines

    return release


@contextlib.contextmanager
def forwards_paused(model):
    """While inside, no forward of `model` (or of a module inside it that an engine runs: a PEFT model's base) runs:
    the forward lock `attach_engine` takes is held. What async GRPO copies new weights into its generator under, so
    no engine step ever sees half-updated weights. Without an engine attached, no engine can attach meanwhile."""
    with _ATTACHING:
        state = next((m._turnforge_engines for m in model.modules() if hasattr(m, "_turnforge_engines")), None)
        with state["lock"] if state is not None else contextlib.nullcontext():
            yield


def stop_engines() -> None:
    """Stop every running engine at once (Ctrl-C): its open requests fail, and no engine thread is still inside
    torch when the interpreter shuts down (which aborted the process: "terminate called without an active
    exception")."""
    for engine in list(_RUNNING):
        engine.stop(hard=True)


OMP_PAUSE_SOFT = 1  # omp_pause_resource_t's omp_pause_soft (OpenMP 5.0, omp.h)


def release_idle_openmp() -> None:
    """Release the calling thread's OpenMP workers (a CPU's intra-op threads; its next parallel region makes new
    ones): OpenMP 5's `omp_pause_resource_all(omp_pause_soft)`, from the runtime torch loaded.

    The engine runs the model on its loop's thread, whose parallel regions get OpenMP workers of their own. A thread
    that trained or loaded a model keeps its workers after, idle. With GNU OpenMP (torch's on Linux), once the process
    holds more of them than there are cores, every worker stops spinning for its next region and sleeps on a futex,
    and each of the engine's many small operations then waits for a wake-up. On the 2-core CPU, GRPO's second rollout
    took 18.5 s with them kept and 13.0 s released (the cores 58 % busy against 92 %), and an evaluation after
    training 1.32x as long (BENCHMARKS.md). The thread that sets a policy up is the one that trained and then waits on the engine.
    Where torch has no OpenMP runtime there are no workers to release."""
    try:
        pause = ctypes.CDLL(None).omp_pause_resource_all
    except AttributeError:
        return
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    pause(OMP_PAUSE_SOFT)


def cpu_cache_tokens(max_requests: int, max_context: int | None) -> int:
    """The CPU cache's size in tokens, whole pages: `REQUEST_TOKENS` per open request, at least one request of the
    model's whole context (at most `CPU_MAX_REQUEST`).

    >>> cpu_cache_tokens(4, 16384), cpu_cache_tokens(64, 16384), cpu_cache_tokens(1, 262144)
    (16384, 131072, 65536)
    """
    tokens = max(max(1, max_requests) * REQUEST_TOKENS, min(max_context or REQUEST_TOKENS, CPU_MAX_REQUEST))
    return -(-tokens // PAGE_SIZE) * PAGE_SIZE


def _install(manager, sampling: TurnSampling, reuse_reads: bool) -> None:
    """Make `sampling` the engine's logits processing and its output step, and with `reuse_reads` its cache's full-
    attention read-back `ReusedReads` (before the engine's loop starts).

    transformers builds its processor list from a GenerationConfig and has no argument for a custom one, so the
    manager's list is replaced; and its model runner's `_sample` (softmax, argmax or `multinomial` from the global
    generator, log-probabilities after truncation) is replaced on the runner the loop thread creates, by
    `sampling.write_outputs`; that runner's cache is made then too."""
    if not isinstance(getattr(manager, "logit_processor", None), ContinuousBatchingLogitsProcessorList) or not callable(
            getattr(manager, "_create_batch_processor", None)):
        raise RuntimeError(
            "transformers' ContinuousBatchingManager no longer has a `logit_processor` list and a "
            "`_create_batch_processor`; turnforge's sampler was verified with transformers "
            f"{', '.join(VERIFIED_TRANSFORMERS)} (src/turnforge/policies/engine.py)"
        )
    manager.logit_processor = sampling
    create = manager._create_batch_processor

    def create_with_sampling():
        processor = create()
        runner = getattr(processor, "model_runner", None)
        if not callable(getattr(runner, "_sample", None)):
            raise RuntimeError(
                "transformers' continuous-batching model runner no longer has `_sample`; turnforge's sampler was "
                f"verified with transformers {', '.join(VERIFIED_TRANSFORMERS)} (src/turnforge/policies/engine.py)"
            )
        runner._sample = sampling.write_outputs
        if reuse_reads:
            ReusedReads().install(getattr(processor, "cache", None))
        return processor

    manager._create_batch_processor = create_with_sampling


class ReusedReads:
    """The engine's full-attention cache update, reading back into two buffers reused by every layer and step.

    Each layer of each step, transformers' cache writes the step's new keys and values, then reads every open
    request's keys and values back (`index_select`) into new tensors for the attention. On a CPU a tensor that big
    (200 open requests of 500 tokens: ~50 MB per layer) is fresh memory from the OS each time: the quickstart's
    200-episode evaluations spent most of that read-back faulting pages in and out (a read into a kept buffer: 2.9 ms
    against 14.3 ms for the same rows; the untrained model's evaluation 28.7 s -> 17.9 s, BENCHMARKS.md). Layers run
    one after another, and a layer's attention is done with its keys before the next layer's update, so two
    buffers (keys, values) serve them all; they grow by half when a read is longer."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor | None] = [None, None]

    def install(self, cache) -> None:
        from transformers.generation.continuous_batching.cache_allocators.full_attention import (
            FullAttentionCacheAllocator,
        )

        allocators = getattr(cache, "cache_allocators", None)
        full = [a for a in (allocators or {}).values() if isinstance(a, FullAttentionCacheAllocator)]
        if not isinstance(allocators, dict) or any(
                not isinstance(getattr(a, "_kv_token_views", None), dict) for a in full) or list(
                inspect.signature(FullAttentionCacheAllocator.update).parameters) != [
                "self", "key_states", "value_states", "layer_idx", "read_index", "write_index"]:
            raise RuntimeError(
                "transformers' paged cache no longer has `cache_allocators` whose full-attention `update(key_states, "
                "value_states, layer_idx, read_index, write_index)` reads `_kv_token_views`; turnforge's read-back "
                f"was verified with transformers {', '.join(VERIFIED_TRANSFORMERS)} (src/turnforge/policies/engine.py)"
            )
        for allocator in full:
            allocator.update = functools.partial(self.update, allocator)

    def update(self, allocator, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               read_index: torch.Tensor, write_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' `FullAttentionCacheAllocator.update`, its read into `self.buffers`."""
        caches = allocator._kv_token_views[layer_idx]
        for cache, states in zip(caches, (key_states, value_states), strict=True):
            cache.index_copy_(0, write_index, states)
        if read_index.numel() == 0:  # nothing cached to read: the new states are all the attention needs
            return key_states, value_states
        n = read_index.numel()
        reads = []
        for slot, cache in enumerate(caches):
            buffer = self.buffers[slot]
            if buffer is None or buffer.size(0) < n or buffer.shape[1:] != cache.shape[1:] or buffer.dtype != cache.dtype:
                grown = max(n, buffer.size(0) * 3 // 2) if buffer is not None else n
                buffer = self.buffers[slot] = cache.new_empty((grown, *cache.shape[1:]))
            reads.append(torch.index_select(cache, 0, read_index, out=buffer[:n]))
        return reads[0], reads[1]
