"""`turnforge serve`'s `POST /v1/completions`: vLLM's `prompt_logprobs`, so that the server can be a distillation
teacher (`openai:URL` in `policies/teacher.py`, and TRL's `VLLMClient.get_sequence_logprobs`).

A request sends token ids (or text) as `prompt` and `prompt_logprobs: k`; the answer's choice holds, as vLLM's:

    "prompt_logprobs": [null, {"<id>": {"logprob": -1.25, "rank": 3, "decoded_token": " apple"}, ...}, ...]

one entry per prompt token (the first has no prefix: null), each with the token that is there and the k most
likely ones, `rank` counted from 1. The completion itself is one token (`max_tokens` 1, what scoring clients ask
for), drawn from the last position's distribution: greedy at temperature 0, else sampled.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from turnforge.policies.base import context_refusal


class CompletionRequest(BaseModel):
    """The fields of a completions request this server reads (others are ignored, as vLLM does)."""

    model_config = ConfigDict(extra="allow")

    model: str
    prompt: list[int] | list[list[int]] | str = Field(min_length=1)
    max_tokens: int = Field(default=1, ge=1, le=1)  # a scoring server: one token, from the forward that scores
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    seed: int | None = None


def complete(served, request: CompletionRequest, adapter_context) -> dict[str, Any]:
    """The completions answer for `request` (the model and adapter checked by the caller)."""
    import torch

    prompts = _prompts(served, request.prompt)
    for ids in prompts:
        refusal = context_refusal(len(ids), request.max_tokens, served.max_context)
        if refusal is not None:
            from turnforge.policies.serve import APIError

            raise APIError(400, refusal, "prompt", "context_length_exceeded")
    generator = torch.Generator().manual_seed(request.seed) if request.seed is not None else None
    choices = []
    with served.model_lock, adapter_context, torch.no_grad():
        for index, ids in enumerate(prompts):
            logits = served.hf.model(input_ids=torch.tensor([ids], device=served.hf.device)).logits[0].float()
            logps = torch.log_softmax(logits, dim=-1).cpu()
            token = _next_token(logits[-1].cpu(), request.temperature, generator)
            choice = {"index": index, "text": served.tokenizer.decode([token]), "logprobs": None,
                      "finish_reason": "length", "stop_reason": None}
            if request.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs(served.tokenizer, ids, logps, request.prompt_logprobs)
            choices.append(choice)
    tokens = sum(len(p) for p in prompts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": request.model, "choices": choices,
            "usage": {"prompt_tokens": tokens, "completion_tokens": len(prompts), "total_tokens": tokens + len(prompts)}}


def prompt_logprobs(tokenizer, ids: list[int], logps, top: int) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs` of `ids` from `logps` ([len(ids), vocab] log-softmax of the model's outputs): for each
    position after the first, the token there and the `top` most likely, with their logprob, rank and text."""
    out: list[dict[str, Any] | None] = [None]
    for p in range(1, len(ids)):
        row = logps[p - 1]
        wanted = [ids[p], *(row.topk(top).indices.tolist() if top else [])]
        entry = {}
        for token in wanted:
            value = float(row[token])
            entry[str(token)] = {"logprob": value, "rank": int((row > row[token]).sum()) + 1,
                                 "decoded_token": tokenizer.decode([token])}
        out.append(entry)
    return out


def _next_token(logits, temperature: float, generator) -> int:
    import torch

    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator))


def _prompts(served, prompt: list[int] | list[list[int]] | str) -> list[list[int]]:
    from turnforge.policies.serve import APIError

    if isinstance(prompt, str):
        return [served.tokenizer.encode(prompt, add_special_tokens=False)]
    rows = [prompt] if isinstance(prompt[0], int) else prompt
    vocab = len(served.tokenizer)
    for row in rows:
        if not row or any(t < 0 or t >= vocab for t in row):
            raise APIError(400, f"prompt: token ids must be in [0, {vocab}) and a prompt at least one token", "prompt")
    return [list(r) for r in rows]
