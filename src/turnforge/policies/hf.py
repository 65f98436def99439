"""hf: a transformers model generating for many episodes at once, on transformers' continuous-batching engine.

The rollout hands over each episode's exact prompt ids (`Prompt.ids`, built by this policy's `renderer`);
each becomes one request of the engine (`policies/engine.py`: paged KV cache, blocks shared across an
episode's turns, one request handed back as soon as it ends). The reply comes back as the sampled ids, their
log-probabilities, the decoded text and a finish reason:

- "stop": the end-of-turn token (`<|im_end|>`, or another of the model's `generation_config.eos_token_id`),
  which is kept as the last id, or a stop string: the ids are cut after the first token that completes it
  and the text keeps it (as HF's `stop_strings` and vLLM's `include_stop_str_in_output` do), so the text is
  always exactly the decoded ids.
- "length": `max_new_tokens` ran out.

Log-probabilities are those of the sampled tokens under the temperature-scaled model distribution,
log_softmax(logits / T) — before top-k / top-p truncation, which is what TRL's GRPO recomputes in training
(`logits / temperature`); greedy decoding (T = 0) reports log_softmax(logits).

The policy is a concurrent backend (`max_in_flight`): the rollout's queue hands it each reply as its own call,
up to `batch_size` at once, and the engine batches whatever is open at each step.

    turnforge eval --env household --policy hf --model runs/quickstart/sft/model --tasks 20 --out runs/eval
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Sequence

import torch

from turnforge.formats.chat_template import chat_renderer
from turnforge.models.loading import load_model
from turnforge.policies.base import (
    Generation,
    Prompt,
    SamplingParams,
    explores,
    model_context,
    prompt_ids,
    refuse_overlong,
)
from turnforge.policies.engine import Reply, TurnEngine, release_idle_openmp


class HFPolicy:
    """Generate with a Hugging Face causal LM (a local folder, a Hub id, or a PEFT adapter folder)."""

    name = "hf"

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        window: int | None = None,
        batch_size: int = 64,
        adapter: str | None = None,
        prefix_sharing: bool = True,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        lm, tokenizer = load_model(model, dtype=dtype, device=device, adapter=adapter)
        lm.eval()
        self._setup(str(model), lm, tokenizer, window, batch_size, prefix_sharing)

    @classmethod
    def from_model(
        cls,
        model,
        tokenizer,
        window: int | None = None,
        batch_size: int = 64,
        model_id: str = "hf",
        prefix_sharing: bool = True,
    ) -> HFPolicy:
        """A policy over a model already in memory (GRPO rolls out with the model it trains; the caller
        switches it to eval mode and back, and `close`s the policy before the weights change)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        policy = cls.__new__(cls)
        policy._setup(model_id, model, tokenizer, window, batch_size, prefix_sharing)
        return policy

    def _setup(self, model_id: str, model, tokenizer, window: int | None, batch_size: int,
               prefix_sharing: bool) -> None:
        self.model_id = model_id
        self.model, self.tokenizer = model, tokenizer
        self.renderer = chat_renderer(self.tokenizer, window=window)
        self.batch_size = batch_size
        self.max_in_flight = batch_size
        eos = self.model.generation_config.eos_token_id
        extra = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.stop_ids = sorted({self.tokenizer.eos_token_id, *extra})
        self.prefix_sharing = prefix_sharing
        self.max_context = model_context(self.model.config)
        self._engine: TurnEngine | None = None
        self._engine_lock = threading.Lock()
        if self.device.type == "cpu":  # the engine's thread computes from here on (`release_idle_openmp`)
            release_idle_openmp()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def engine(self) -> TurnEngine:
        """The model's continuous-batching engine, made on first use (once: the rollout calls `generate` from
        several threads at once, and two engines on one model each took requests, each with its own cache)."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = TurnEngine(self.model, self.stop_ids, self.tokenizer.pad_token_id,
                                          prefix_sharing=self.prefix_sharing, max_requests=self.batch_size,
                                          max_context=self.max_context)
                # The engine's threads hold it, not this policy: a policy dropped without `close` stops its engine.
                weakref.finalize(self, self._engine.stop)
            return self._engine

    def generate(self, prompts: list[Prompt], params: SamplingParams, on_token=None) -> list[Generation]:
        """One reply per prompt, in order: every prompt is an engine request at once, and the call returns when all
        are answered. A prompt with no room for `max_new_tokens` in the model's context is refused
        (`refuse_overlong`), never cut or run past it. `on_token(i, ids, logprobs)`, when given, is called (from
        the engine's thread) as prompt i's reply grows: what `turnforge serve` streams."""
        ids = [prompt_ids(p, self.renderer) for p in prompts]
        if any(not row for row in ids):
            raise ValueError("an empty prompt: the hf policy needs at least one prompt token")
        out: list[Generation | None] = [None] * len(ids)
        room = min(filter(None, (self.max_context, self.engine.capacity)), default=None)  # a request must fit the cache
        for i, refusal in refuse_overlong(ids, params.max_new_tokens, room).items():
            out[i] = refusal
        futures = {}
        for i, (prompt, row) in enumerate(zip(prompts, ids, strict=True)):
            if out[i] is None:
                reply = Reply(params.temperature, params.top_k, params.top_p, row_seed(params.seed, prompt, row),
                              explores(params, prompt))
                stream = (lambda ids, logprobs, i=i: on_token(i, ids, logprobs)) if on_token is not None else None
                futures[i] = self.engine.submit(row, params.max_new_tokens, reply, stream)
        for i, future in futures.items():
            done = future.result()
            out[i] = finish_generation(done.ids, done.logprobs, self.stop_ids, params.stop, self.tokenizer)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the engine (its KV cache is freed); the next `generate` makes a new one."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.stop()


def finish_generation(ids: list[int], logprobs: list[float], stop_ids: Sequence[int], stop: Sequence[str],
                      tokenizer) -> Generation:
    """One engine output row -> Generation: cut at the first stop (`cut_generation`), text = the decoded ids
    without the end-of-turn id. Every in-process backend (hf, vllm) ends its replies the same way."""
    ids, finish = cut_generation(ids, stop_ids, stop, tokenizer.decode)
    text_ids = ids[:-1] if finish == "stop" and ids and ids[-1] in stop_ids else ids
    return Generation(
        text=tokenizer.decode(text_ids, skip_special_tokens=False),
        ids=ids,
        logprobs=logprobs[: len(ids)],
        finish_reason=finish,
    )


def cut_generation(ids: list[int], stop_ids: Sequence[int], stop: Sequence[str], decode) -> tuple[list[int], str]:
    """(the generated ids, finish reason) from one padded row of `generate`'s output.

    Cut after the first stop id ("stop"), else after the first token whose text completes a stop string
    ("stop"), else the whole row ("length"). `decode(ids) -> str` finds the stop strings.

    >>> cut_generation([5, 6, 2, 0, 0], stop_ids=[2, 0], stop=[], decode=None)
    ([5, 6, 2], 'stop')
    """
    stops = set(stop_ids)
    end = next((k for k, t in enumerate(ids) if t in stops), None)
    if end is not None:
        return ids[: end + 1], "stop"
    if stop and any(s in decode(ids) for s in stop):
        # The shortest prefix whose text holds a stop string (the predicate only turns on as ids are added).
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(ids[:mid]) for s in stop):
                hi = mid
            else:
                lo = mid + 1
        return ids[:lo], "stop"
    return ids, "length"


def row_seed(seed: int, prompt: Prompt, ids: list[int]) -> int:
    """The seed of one reply's random draws: the call's seed, the episode (task, sample), its turn and its prompt
    (its length and last 64 ids: what tells apart prompts of the same turn, e.g. a DPO teacher's decision points), so that a reply's draws do not depend on which other prompts share its batch or on how many calls came
    before (the rollout engine batches whichever episodes are waiting, which timing decides)."""
    key = f"{seed}|{prompt.task.id}|{prompt.sample}|{prompt.turn}|{len(ids)}|{','.join(map(str, ids[-64:]))}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & (2**63 - 1)
