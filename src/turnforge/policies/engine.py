"""The hf backend's generator: transformers' continuous-batching engine (`ContinuousBatchingManager`).

Each reply is one engine request: submitted when its episode is ready, handed back (`Future`) as soon as it
finishes, while the engine's own loop keeps stepping every open request — no lock-step batch waits for its
slowest reply. The paged KV cache shares whole blocks by content (`allow_block_sharing`): an episode's turn k
starts from the blocks its turns 1..k-1 filled, so only the new suffix is prefilled (the hand-written prefix
cache this replaces did the same per episode).

What stays hand-written, and why (one thing): `TurnSampling`, the engine's logits processor. transformers' engine
samples every row from one global generator and reports log-probabilities after top-k/top-p; turnforge's contract
is per-reply seeded draws (the same episodes at any concurrency) and log_softmax(logits / T) before truncation
(what TRL recomputes). It is a `ContinuousBatchingLogitsProcessor`, the engine's public extension point, installed
by `_install_sampling` — the one place that touches the manager's internals (pinned: transformers 5.19-5.24,
tests/test_engine.py fails loudly when they move).

Because the processor runs Python per step (a generator per reply, log-probs read back), the engine runs its
forward eagerly: CUDA graphs and async batching are off (docs/decisions.md, "hf on the continuous-batching
engine").
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)
from transformers.generation.logits_process import LogitsProcessorList

# The transformers releases whose engine internals `_install_sampling` was verified against.
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
    """One request's sampling: temperature (0: greedy), top-k (0: off), top-p (1: off), and its generator."""

    temperature: float
    top_k: int
    top_p: float
    seed: int
    sampled: bool
    logprobs: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def group(self) -> tuple[float, int, float]:
        return (self.temperature if self.sampled else 0.0, self.top_k if self.sampled else 0,
                self.top_p if self.sampled else 1.0)


class TurnSampling(ContinuousBatchingLogitsProcessor):
    """temperature -> record log_softmax -> top-k -> top-p -> each sampled row's own Gumbel draw.

    The engine then takes the argmax of what this returns: for a sampled row argmax(scores + G), G ~ Gumbel(0, 1)
    from the reply's own generator (seeded by `row_seed`), is a draw from the truncated distribution (the Gumbel-max
    trick); a greedy row is left as it is. The recorded log-probability of the chosen token is that of
    log_softmax(logits / T), before truncation (greedy: log_softmax(logits)).
    """

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.replies: dict[str, Reply] = {}
        self.lock = threading.Lock()
        self._rows: list[str] = []

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.zero_()

    def prepare_tensor_args(self, requests_with_new_token) -> torch.Tensor:
        # Called on the engine thread before the forward whose rows these are (synchronous batching only).
        self._rows = [r.state.request_id for r in requests_with_new_token]
        return torch.zeros(len(self._rows), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows = self._rows[: scores.shape[0]]
        with self.lock:
            replies = [self.replies.get(r) for r in rows]
        out = scores.clone()
        groups: dict[tuple, list[int]] = {}
        for i, reply in enumerate(replies):
            if reply is not None:
                groups.setdefault(reply.group, []).append(i)
        for (temperature, top_k, top_p), index in groups.items():
            at = torch.tensor(index, device=scores.device)
            out[at] = self._sample(scores[at], temperature, top_k, top_p, [replies[i] for i in index])
        return out

    def _sample(self, scores: torch.Tensor, temperature: float, top_k: int, top_p: float, replies: list[Reply]):
        scaled = scores / temperature if temperature > 0 else scores
        logprobs = torch.log_softmax(scaled, dim=-1)
        if temperature == 0:
            chosen = scaled.argmax(dim=-1)
            noisy = scaled
        else:
            truncated = scaled
            if top_k > 0:
                truncated = TopKLogitsWarper(top_k)(None, truncated)
            if top_p < 1.0:
                truncated = TopPLogitsWarper(top_p)(None, truncated)
            noisy = truncated + torch.stack([_gumbel(r, scores.shape[-1], scores.device) for r in replies])
            chosen = noisy.argmax(dim=-1)
        picked = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
        for reply, value in zip(replies, picked, strict=True):
            reply.logprobs.append(value)
        return noisy


def _gumbel(reply: Reply, width: int, device: torch.device) -> torch.Tensor:
    if reply.generator is None:
        reply.generator = torch.Generator(device=device).manual_seed(reply.seed)
    uniform = torch.rand(width, generator=reply.generator, device=device)
    return -torch.log(-torch.log(uniform.clamp(min=1e-20)))


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
        self.sampling = TurnSampling()
        # Greedy to the engine (no warper is built): `TurnSampling` does all sampling.
        config = GenerationConfig(do_sample=False, eos_token_id=list(stop_ids), pad_token_id=pad_id)
        on_cpu = model.device.type == "cpu"
        self.capacity = cpu_cache_tokens(max_requests, max_context) if on_cpu else None
        """Tokens the cache holds (None: sized by transformers from free memory); a longer request is refused."""
        cb = ContinuousBatchingConfig(
            page_size=PAGE_SIZE, allow_block_sharing=prefix_sharing, use_cuda_graph=False,
            use_async_batching=False, max_requests_per_batch=max(1, max_requests), auto_switch_to_flash=False,
            num_blocks=self.capacity // PAGE_SIZE if on_cpu else None,
            max_batch_tokens=CPU_STEP_TOKENS if on_cpu else None,
        )
        self.manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        _install_sampling(self.manager, self.sampling)
        self.stop_ids = list(stop_ids)
        self._ids = itertools.count()
        self._open: dict[str, tuple[Future, Callable | None]] = {}
        self._lock = threading.Lock()
        self._started = False
        self._hook = None
        self.forward_tokens = 0
        """Tokens the model ran, prefill and decode: with `submitted` and `generated`, what prefix sharing saved."""
        self.submitted = 0
        """Prompt tokens submitted."""
        self.generated = 0
        """Tokens generated (each but a reply's last is run once more, as the next step's input)."""

    def submit(self, ids: list[int], max_new_tokens: int, reply: Reply,
               on_token: Callable[[list[int]], None] | None = None) -> Future:
        self._start()
        self.submitted += len(ids)
        future: Future = Future()
        request = f"turn-{next(self._ids)}"
        with self._lock:
            self._open[request] = (future, on_token)
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
                reply = self._close(out.request_id)
                ids = list(out.generated_tokens)
                self.generated += len(ids)
                future.set_result(Finished(ids, reply.logprobs[: len(ids)]))
            elif on_token is not None:
                ids = list(out.generated_tokens)
                with self.sampling.lock:
                    reply = self.sampling.replies.get(out.request_id)
                on_token(ids, list(reply.logprobs[: len(ids)]) if reply is not None else [])

    def _close(self, request: str) -> Reply:
        with self._lock:
            self._open.pop(request, None)
        with self.sampling.lock:
            return self.sampling.replies.pop(request)

    def _fail_open(self, error: Exception) -> None:
        with self._lock:
            open_, self._open = self._open, {}
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
            self._fail_open(RuntimeError("the continuous-batching engine was stopped"))


_RUNNING: weakref.WeakSet[TurnEngine] = weakref.WeakSet()


def stop_engines() -> None:
    """Stop every running engine at once (Ctrl-C): its open requests fail, and no engine thread is still inside
    torch when the interpreter shuts down (which aborted the process: "terminate called without an active
    exception")."""
    for engine in list(_RUNNING):
        engine.stop(hard=True)


def cpu_cache_tokens(max_requests: int, max_context: int | None) -> int:
    """The CPU cache's size in tokens, whole pages: `REQUEST_TOKENS` per open request, at least one request of the
    model's whole context (at most `CPU_MAX_REQUEST`).

    >>> cpu_cache_tokens(4, 16384), cpu_cache_tokens(64, 16384), cpu_cache_tokens(1, 262144)
    (16384, 131072, 65536)
    """
    tokens = max(max(1, max_requests) * REQUEST_TOKENS, min(max_context or REQUEST_TOKENS, CPU_MAX_REQUEST))
    return -(-tokens // PAGE_SIZE) * PAGE_SIZE


def _install_sampling(manager, sampling: TurnSampling) -> None:
    """Make `sampling` the engine's only logits processor (before its loop starts). transformers builds the list
    from a GenerationConfig and has no argument for a custom `ContinuousBatchingLogitsProcessor`, so the list is
    replaced here, and its one int32 argument row declared (`tensors_required`)."""
    if not isinstance(getattr(manager, "logit_processor", None), ContinuousBatchingLogitsProcessorList):
        raise RuntimeError(
            "transformers' ContinuousBatchingManager no longer has a `logit_processor` list; turnforge's sampler was "
            f"verified with transformers {', '.join(VERIFIED_TRANSFORMERS)} (src/turnforge/policies/engine.py)"
        )
    processors = ContinuousBatchingLogitsProcessorList(LogitsProcessorList([sampling]))
    processors.tensors_required = 1
    processors.do_processing = True
    manager.logit_processor = processors
