"""Policies: what writes the assistant turns. `make_policy` reads the CLI's `--policy` (and `--model`)."""

from __future__ import annotations

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


def make_policy(spec: str, model: str | None = None, seed: int = 0) -> Policy:
    """Build the policy named by `spec`: "expert" | "random" | "replay:FILE" | "hf" | "vllm" | "openai:URL".

    `model` is the checkpoint for the model backends (ignored by scripted policies); `seed` drives `random`.
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
    if kind in _MODEL_BACKENDS:
        # Raised as NotImplementedError so callers can tell "not yet" from "wrong input".
        raise NotImplementedError(
            f"policy {spec!r} (a model backend) is not available in this version of turnforge; "
            "use --policy expert, random or replay:FILE"
        )
    raise ValueError(f"unknown policy {spec!r}; use one of {_USAGE}")
