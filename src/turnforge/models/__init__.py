"""Models: load any Hugging Face causal LM (+ LoRA), build the tiny offline model, render chats token-exactly.

    loading.py   LoraSpec, load_model, merge_and_save
    tiny.py      build_tiny_model: byte-level BPE on env text + Qwen3's chat template + a random Qwen3;
                 resolve_model ("tiny" -> built once in a cache, any other name unchanged)
    chat.py      ChatTemplateRenderer (the rollout's ChatRenderer), window_messages, check_prefix_preserving

`tiny.py` plays the env's expert through the rollout engine, and the rollout engine uses `chat.py`: so this
package does not import `tiny.py` (that would be a cycle); import `build_tiny_model` and `resolve_model` from
`turnforge.models.tiny`.
"""

from __future__ import annotations

from turnforge.models.loading import LoraSpec, load_model, merge_and_save

__all__ = ["LoraSpec", "load_model", "merge_and_save"]
