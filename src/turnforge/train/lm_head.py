"""TRL's fused LM head, scoring only the labelled positions on a CPU.

TRL's trainers (SFT, DPO, GRPO) replace a model's LM head by its chunked log-probability kernel
(`trl.trainer.utils.add_fused_lm_head`). On a device without Triton that head scores every position of a batch
(to keep tile shapes fixed for compilers), labelled or not. In the quickstart's SFT step two thirds of the positions
are the prompt and the observations, which have no label, and the head took a third of the step (docs/decisions.md).

`score_labelled_only(trainer)` re-patches each model TRL patched and has not yet handed to accelerate (the trained
model; not a reference model that TRL prepares, with mixed precision, in its constructor): on a CPU, the labelled positions are gathered
first, their count rounded up to `ROW_MULTIPLE` rows (oneDNN builds a kernel per new shape:
`train.runtime.cpu_bf16_args`), and scored by the same kernel with the settings TRL chose (read from its head:
temperature, outputs, fp32 head, logit scale, softcap: `trl_internals.fused_head_settings`). The outputs are scattered back where TRL's would be, zero
elsewhere, so the loss, its gradient and the logged metrics are TRL's. Any other call (another device, MoE router
logits, pre-shifted labels, sharded weights) goes to TRL's head unchanged.
"""

from __future__ import annotations

import functools
import logging
import types
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from trl.kernels import ChunkedLogProbFunction

from turnforge.train.trl_internals import FusedCausalLMOutput, autocast_wrapped_forward, fused_head_settings

logger = logging.getLogger(__name__)

ROW_MULTIPLE = 128
VOCAB_CHUNK = 32768  # vocabulary columns per tile: TRL's own width (`_CHUNKED_LOGPROB_CHUNK_SIZE`)


def score_labelled_only(trainer) -> None:
    """Re-patch the fused heads of `trainer`'s model (and reference model) to score only labelled positions on a CPU."""
    model = trainer.model
    if hasattr(model, "get_base_model"):  # PEFT: TRL patched the wrapped model
        model = model.get_base_model()
    for m in (model, getattr(trainer, "ref_model", None)):
        if m is not None:
            patch_model(m)


def patch_model(model) -> bool:
    """Wrap the fused head TRL added to `model`; False (and TRL's head kept) where it cannot be read."""
    trl_forward = model.forward
    func = getattr(trl_forward, "__func__", None)
    if getattr(func, "_labelled_only", False):
        return True
    if autocast_wrapped_forward(model) is not None:  # TRL prepares reference models in its constructor: a forward
        return False  # put in front of accelerate's autocast wrapper would run outside its autocast
    s = fused_head_settings(trl_forward)  # what TRL's head closes over (`trl_internals`)
    if s is None:
        logger.warning("TRL's fused LM head was not found on %s: every position is scored", type(model).__name__)
        return False
    text_config = s["text_config"]

    @functools.wraps(type(model).forward)  # generate validates its kwargs against the model's own signature
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        head = self.get_output_embeddings()
        if (not fused_lm_head or labels is None or shift_labels is not None or head.weight.device.type != "cpu"
                or isinstance(head.weight, DTensor) or kwargs.get("output_router_logits")
                or getattr(text_config, "output_router_logits", False)):
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kwargs)
        kwargs["use_cache"] = False
        hidden = getattr(self, s["backbone_attr"])(*args, **kwargs).last_hidden_state[:, :-1]
        labels = labels[:, 1:]
        mask = labels != -100
        n = int(mask.sum())
        rows = max(-(-n // ROW_MULTIPLE) * ROW_MULTIPLE, ROW_MULTIPLE)
        picked = F.pad(hidden[mask], (0, 0, 0, rows - n))
        targets = F.pad(labels[mask], (0, rows - n))
        context = nullcontext()
        if s["cast_lm_head_to_fp32"]:
            picked = picked.float()
            context = torch.autocast(picked.device.type, enabled=False)
        with context:
            scored = ChunkedLogProbFunction.apply(
                picked, head.weight, head.bias, targets, s["temperature"], VOCAB_CHUNK,
                s["final_logit_softcapping"], s["logit_scale"], s["outputs"],
            )
        # masked_scatter keeps the output connected to the model when no label is valid (as TRL's compact path)
        log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1 = (
            None if x is None else x.new_zeros(mask.shape).masked_scatter(mask, x[:n]) for x in scored
        )
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq_probs,
                                   mean_logits=mean_logits, is_top1=is_top1, label_mask=mask)

    forward._labelled_only = True
    model.forward = types.MethodType(forward, model)
    return True
