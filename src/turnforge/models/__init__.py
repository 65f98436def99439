"""Models: load any Hugging Face causal LM (+ LoRA), build the tiny offline model, render chats token-exactly.

    loading.py   LoraSpec, load_model, merge_and_save, resolve_model ("tiny" -> built once in a cache)
    tiny.py      build_tiny_model: byte-level BPE on env text + Qwen3's chat template + a random Qwen3
    chat.py      ChatTemplateRenderer (the rollout's ChatRenderer), window_messages, check_prefix_preserving
"""

from __future__ import annotations

from turnforge.models.loading import LoraSpec, load_model, merge_and_save, resolve_model
from turnforge.models.tiny import build_tiny_model

__all__ = ["LoraSpec", "build_tiny_model", "load_model", "merge_and_save", "resolve_model"]
