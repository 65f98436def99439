"""Models: load any Hugging Face causal LM (+ LoRA).

    loading.py    LoraSpec, load_model, merge_and_save
    attention.py  the attention implementation a model loads with

The tiny offline model is built by `turnforge.tiny_model` (it plays the envs' experts for its tokenizer's text, so
it sits above the rollout engine); chats are rendered token-exactly by `turnforge.formats.chat_template`.
"""

from __future__ import annotations

from turnforge.models.loading import LoraSpec, load_model, merge_and_save

__all__ = ["LoraSpec", "load_model", "merge_and_save"]
