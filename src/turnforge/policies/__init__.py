"""Policies: what writes the assistant turns. `make_policy` reads the CLI's `--policy` (and `--model`)."""

from __future__ import annotations

from typing import Any

from turnforge.policies.base import Generation, Policy, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy, RandomPolicy, ReplayPolicy

__all__ = [
    "ExpertPolicy",
    "Generation",
    "Policy",
    "Prompt",
    "RandomPolicy",
    "ReplayPolicy",
    "SamplingParams",
    "make_policy",
]

_MODEL_BACKENDS = ("hf", "vllm", "openai")
_USAGE = "expert, random, replay:FILE, hf, vllm or openai:URL"


def make_policy(spec: str, model: str | None = None, seed: int = 0, **options: Any) -> Policy:
    """Build the policy named by `spec`: "expert" | "random" | "replay:FILE" | "hf" | "vllm" | "openai:URL".

    `model` is the checkpoint for the model backends (ignored by scripted policies); `seed` drives `random`;
    `options` are the model backend's own settings (hf: device, dtype, window, batch_size, adapter).
    """
    kind, _, arg = spec.partition(":")
    if kind == "expert" and not arg:
        return ExpertPolicy()
    if kind == "random" and not arg:
        return RandomPolicy(seed)
    if kind == "replay":
        if not arg:
            raise ValueError("--policy replay needs a file: --policy replay:runs/NAME/episodes.jsonl")
        return ReplayPolicy(arg)
    if kind == "hf":
        if arg:
            raise ValueError(f"--policy hf takes no argument (got {spec!r}); give the model with --model PATH")
        if not model:
            raise ValueError("--policy hf needs a model: --model PATH_OR_HUB_ID (e.g. a run's sft/model folder)")
        from turnforge.policies.hf import HFPolicy  # imports torch and transformers: only when asked for

        return HFPolicy(model, **options)
    if kind in _MODEL_BACKENDS:
        # Raised as NotImplementedError so callers can tell "not yet" from "wrong input".
        raise NotImplementedError(
            f"policy {spec!r} (a model backend) is not available in this version of turnforge; "
            "use --policy hf --model PATH, expert, random or replay:FILE"
        )
    raise ValueError(f"unknown policy {spec!r}; use one of {_USAGE}")
