"""Policies: what writes the assistant turns. `make_policy` reads the CLI's `--policy` (and `--model`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnforge.models.loading import check_model_folder
from turnforge.policies.base import BackendError, Generation, Policy, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy, RandomPolicy, ReplayPolicy

__all__ = [
    "BackendError",
    "ExpertPolicy",
    "Generation",
    "Policy",
    "MODEL_BACKENDS",
    "PolicySpec",
    "Prompt",
    "RandomPolicy",
    "ReplayPolicy",
    "SamplingParams",
    "make_policy",
]

_SCRIPTED = ("expert", "random")
MODEL_BACKENDS = ("hf", "vllm", "openai")
# The openai backend's settings (`make_policy(**options)`).
_OPENAI_OPTIONS = ("concurrency", "request_timeout", "max_retries", "backoff_s", "max_backoff_s", "api_key_env",
                   "extensions", "tokenizer")
_USAGE = "expert, random, replay:FILE, hf[:PATH], vllm[:PATH] or openai:URL[#MODEL]"


@dataclass(frozen=True)
class PolicySpec:
    """One policy spec, as `--policy` and every model role take it: `kind[:target][#model]`.

    >>> PolicySpec.parse("openai:http://127.0.0.1:8000/v1#qwen3-4b")
    PolicySpec(kind='openai', target='http://127.0.0.1:8000/v1', model='qwen3-4b')
    >>> PolicySpec.parse("hf:runs/qs/stages/02-sft/model")
    PolicySpec(kind='hf', target='runs/qs/stages/02-sft/model', model=None)
    """

    kind: str
    target: str | None = None
    """hf / vllm: the model folder or hub id; openai: the server's base URL; replay: the JSONL file."""
    model: str | None = None
    """openai: the served model's name (`#name`)."""

    @property
    def text(self) -> str:
        """The spec written back: `kind[:target][#model]`."""
        return self.kind + (f":{self.target}" if self.target else "") + (f"#{self.model}" if self.model else "")

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        kind, _, rest = text.strip().partition(":")
        if kind not in (*_SCRIPTED, "replay", *MODEL_BACKENDS):
            raise ValueError(f"unknown policy {text!r}; use one of {_USAGE}")
        target, model = rest, None
        if kind == "openai" and "#" in rest:
            target, _, model = rest.rpartition("#")
        if kind in _SCRIPTED and rest:
            raise ValueError(f"policy {kind!r} takes no argument (got {text!r})")
        if kind in ("replay", "openai") and not target:
            need = "a file: replay:runs/NAME/episodes.jsonl" if kind == "replay" else "a URL: openai:http://HOST:PORT/v1"
            raise ValueError(f"policy {kind} needs {need}")
        return cls(kind, target or None, model or None)


def make_policy(spec: str, model: str | None = None, seed: int = 0, **options: Any) -> Policy:
    """Build the policy named by `spec` (see `PolicySpec`): "expert" | "random" | "replay:FILE" | "hf[:PATH]" ...

    `model` is the checkpoint for the model backends when the spec does not name one (`--policy hf --model
    PATH`); `seed` drives `random` and the expert's noise; `options` are the model backend's own settings (hf:
    device, dtype, window, batch_size, adapter; openai: concurrency, request_timeout, max_retries, api_key_env,
    tokenizer), or the expert's `noise`.
    """
    parsed = PolicySpec.parse(spec)
    if parsed.kind == "expert":
        unknown = sorted(set(options) - {"noise"})
        if unknown:
            raise ValueError(f"policy expert does not take {', '.join(unknown)}; it takes noise")
        return ExpertPolicy(seed=seed, **options)
    if parsed.kind == "random":
        return RandomPolicy(seed)
    if parsed.kind == "replay":
        return ReplayPolicy(parsed.target)
    if parsed.kind == "hf":
        path = _model_path(parsed, model)  # checked first: a missing folder is refused before torch loads
        from turnforge.policies.hf import HFPolicy  # imports torch and transformers: only when asked for

        return HFPolicy(path, **options)
    if parsed.kind == "vllm":
        path = _model_path(parsed, model)
        from turnforge.policies.vllm import VLLMPolicy  # imports vllm: only when asked for

        return VLLMPolicy(path, **{k: v for k, v in options.items() if k in ("dtype", "window", "adapter")})
    if parsed.kind == "openai":
        if parsed.model and model and parsed.model != model:
            raise ValueError(f"two models for one policy: {spec!r} and --model {model}; give one")
        from turnforge.policies.openai import OpenAIPolicy  # imports the openai client: only when asked for

        unknown = sorted(set(options) - set(_OPENAI_OPTIONS))
        if unknown:
            raise ValueError(f"policy openai does not take {', '.join(unknown)}; it takes {', '.join(_OPENAI_OPTIONS)}")
        return OpenAIPolicy(parsed.target, model=parsed.model or model, **options)
    raise AssertionError(f"PolicySpec.parse accepted an unhandled kind {parsed.kind!r}")


def _model_path(spec: PolicySpec, model: str | None) -> str:
    """The checkpoint of a model backend: from the spec (`hf:PATH`) or from `--model`, not two different ones."""
    if spec.target and model and spec.target != model:
        raise ValueError(f"two models for one policy: {spec.kind}:{spec.target} and --model {model}; give one")
    path = spec.target or model
    if not path:
        raise ValueError(
            f"--policy {spec.kind} needs a model: {spec.kind}:PATH or --model PATH_OR_HUB_ID (e.g. a run's sft/model folder)"
        )
    check_model_folder(path)
    return path
