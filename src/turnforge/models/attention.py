"""Attention for generating on a CPU: transformers' SDPA attention, with grouped-query heads kept grouped.

transformers passes `enable_gqa` to SDPA only on CUDA/XPU/MPS without a mask; otherwise (a CPU, and any batch of
left-padded prompts: a mask) it copies every key/value head `num_key_value_groups` times (`repeat_kv`) before each
attention call, except for a single query token. When a prompt is encoded over a long cached prefix (each turn of
an episode: a few dozen new tokens over hundreds cached), that copy of the whole cache is most of the call:
torch's CPU SDPA kernel takes the grouped heads and the mask as they are (`enable_gqa`, torch >= 2.5), for the
same result (`benchmarks/cpu_gqa_prefill.py`).

`cpu_gqa(model)` switches a model on a CPU to it for a `with` block (the hf policy's `generate`); training
forwards keep transformers' own (there the copy is ~3 % of attention's forward and backward).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "turnforge_cpu_gqa_sdpa"


def cpu_gqa_sdpa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa_attention_forward`, but several query tokens with a mask over grouped key/value heads
    go to SDPA as they are (`enable_gqa=True`) instead of after `repeat_kv`."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = kwargs.get("position_bias") is None and kwargs.get("softcap") is None and not kwargs.get("output_attentions")
    if groups > 1 and query.shape[2] > 1 and attention_mask is not None and plain:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True,
        )
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


AttentionInterface.register(NAME, cpu_gqa_sdpa_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks as "sdpa" builds


@contextmanager
def cpu_gqa(model) -> Iterator[None]:
    """Within the block, a model on a CPU that uses "sdpa" attention uses `cpu_gqa_sdpa_forward` instead."""
    config = getattr(model, "config", None)
    device = next(model.parameters()).device
    if config is None or device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
