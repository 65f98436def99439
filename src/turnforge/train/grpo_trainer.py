"""GRPO's trainer: TRL's `GRPOTrainer` scoring each episode on its own tokens, and GiGPO's step-level credit.

`EpisodeGRPOTrainer` replaces TRL's padded-batch scoring (same values up to rounding, a group's shared prompt
run once); `StepCreditGRPOTrainer` adds GiGPO's per-turn term to TRL's episode advantages. Both plug in through
the public methods `trl_internals.GRPOTrainerHooks` gives TRL's private steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from turnforge.train.lm_head import score_labelled_only
from turnforge.train.off_policy import importance_weights
from turnforge.train.runtime import CACHE_FIELD, checkpointing_on, expanded_cache, forward_cache
from turnforge.train.trl_internals import GRPOTrainerHooks, metric_lists

if TYPE_CHECKING:
    from turnforge.train.grpo_rollouts import EpisodeRollouts


def real_spans(attention_mask: torch.Tensor) -> list[tuple[int, int]] | None:
    """Each row's one run of real tokens as (start, end); None when a row's real tokens are not one run."""
    spans = []
    for row in attention_mask.bool():
        where = row.nonzero().flatten()
        if where.numel() == 0:
            spans.append((0, 0))
            continue
        start, end = int(where[0]), int(where[-1]) + 1
        if end - start != where.numel():
            return None
        spans.append((start, end))
    return spans


def prompt_groups(input_ids: torch.Tensor, spans: list[tuple[int, int]], first: int,
                  block: int) -> list[tuple[list[int], int]]:
    """The rows of a GRPO batch that share their prompt (a task's group), with how many of its leading tokens to
    run once for them: the prompt less its last token (whose output scores the first completion token), rounded
    down to `block` (few shapes: oneDNN builds a kernel per new shape). 0 for a row alone or a short prompt.
    Groups in order of their first row."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, (start, end) in enumerate(spans):
        groups.setdefault(tuple(input_ids[row, start : min(first, end)].tolist()), []).append(row)
    return [(rows, max(len(prompt) - 1, 0) // block * block if len(rows) > 1 else 0) for prompt, rows in groups.items()]


def row_chunks(input_ids: torch.Tensor, runs: dict[int, tuple[int, int]], rows_per_chunk: int, pad: int,
               multiple: int = 1):
    """The rows `runs` names, longest first, `rows_per_chunk` at a time: yields (rows, ids), each row's run
    input_ids[row, start:end] moved to the start of its line of `ids` and right-padded with `pad` to the chunk's
    longest (at least 2), rounded up to `multiple`. Causal attention keeps right padding out of every real token's
    view, so no attention mask is needed."""
    order = sorted(runs, key=lambda r: runs[r][1] - runs[r][0], reverse=True)
    for at in range(0, len(order), rows_per_chunk):
        chunk = order[at : at + rows_per_chunk]
        longest = max(max(runs[r][1] - runs[r][0] for r in chunk), 2)
        ids = input_ids.new_full((len(chunk), -(-longest // multiple) * multiple), pad)
        for k, r in enumerate(chunk):
            start, end = runs[r]
            ids[k, : end - start] = input_ids[r, start:end]
        yield chunk, ids


class EpisodeGRPOTrainer(GRPOTrainerHooks):
    """TRL's GRPOTrainer that scores each episode on its own tokens: TRL pads a batch's prompts on the left and its
    completions on the right to the batch's longest, and a multi-turn batch spans short successes and 30-turn
    failures (most of a padded batch was padding in the quickstart). Here the rows are sorted by length and
    scored `ROWS_PER_CHUNK` at a time, each row's real tokens moved to the row's start and right-padded to the
    chunk's longest (rounded to `pad_to_multiple_of`), so no attention mask is needed: causal attention keeps
    right padding out of every real token's view. Log-probabilities and entropies land where TRL's would (0
    on padding, which its masks drop), through TRL's own fused head. Positions restart at 0 for each row;
    RoPE depends on position differences only, so the scores are TRL's up to rounding. On a CPU the head scores
    the completion positions only (`train.lm_head`).

    The episodes of a group share their prompt (the task's opening, ~45 % of an episode's tokens in the
    quickstart): it runs once per group, one row (`prompt_groups`), and the group's rows continue from its
    keys/values as SFT's `packing = "prefix"` does (`runtime.expanded_cache`); nothing in it is scored, and its
    gradient is the sum over the rows, as when each row ran it. Not in a pass with gradients under activation
    checkpointing: transformers drops a layer's cache where it will recompute the layer, so each row runs it."""

    ROWS_PER_CHUNK = 4  # a fixed row count keeps the chunk shapes few (oneDNN builds a kernel per new shape)
    PROMPT_BLOCK = 64  # a shared prompt is run to a multiple of this many tokens (few shapes, as above)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        score_labelled_only(self)  # on a CPU TRL's head would score the prompt positions too

    def score_tokens(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        spans = real_spans(attention_mask)
        if spans is None:
            return None  # TRL's scoring
        rows, width = input_ids.shape
        first = width - logits_to_keep  # the first completion position
        multiple = self.pad_to_multiple_of or 1
        pad = self.processing_class.pad_token_id if self.processing_class.pad_token_id is not None else 0
        logps = input_ids.new_zeros((rows, logits_to_keep), dtype=torch.float32)
        entropies = logps.clone() if compute_entropy else None
        # transformers drops a layer's cache where checkpointing will recompute it: the rows then run the prompt
        bare = self.accelerator.unwrap_model(model)  # under DDP `model` is the wrapper, which has no `config`
        recomputed = torch.is_grad_enabled() and model.training and checkpointing_on(bare)
        for group, shared in prompt_groups(input_ids, spans, first, self.PROMPT_BLOCK):
            shared = 0 if recomputed else shared
            prefix = None
            if shared:
                start = spans[group[0]][0]
                with self.accelerator.autocast():
                    prefix = forward_cache(model(input_ids=input_ids[group[0] : group[0] + 1, start : start + shared],
                                                 use_cache=True, logits_to_keep=1))
            # per row: where its run starts (after the shared prompt), ends, and its first scored token
            extents = {r: (spans[r][0] + shared, spans[r][1], max(first, spans[r][0] + 1)) for r in group}
            runs = {r: extents[r][:2] for r in group}
            for chunk, ids in row_chunks(input_ids, runs, self.ROWS_PER_CHUNK, pad, multiple):
                labels = torch.full_like(ids, -100)
                for k, r in enumerate(chunk):
                    start, end, scored = extents[r]
                    labels[k, scored - start : end - start] = input_ids[r, scored:end]
                cached = {}
                if prefix is not None:
                    positions = torch.arange(shared, shared + ids.shape[1], device=ids.device).expand(len(chunk), -1)
                    cached = {CACHE_FIELD: expanded_cache(prefix, len(chunk), bare.config), "position_ids": positions}
                with self.accelerator.autocast():
                    out = model(input_ids=ids, labels=labels, fused_lm_head=True, **cached)
                for k, r in enumerate(chunk):
                    start, end, scored = extents[r]
                    if end > scored:  # log_probs[t] scores token t + 1
                        logps[r, scored - first : end - first] = out.log_probs[k, scored - start - 1 : end - start - 1]
                        if compute_entropy:
                            entropies[r, scored - first : end - first] = out.entropy[k, scored - start - 1 : end - start - 1]
        if out.log_probs.requires_grad and not logps.requires_grad:  # no token scored (all truncated): as TRL,
            logps = logps + 0 * out.log_probs.sum()  # a zero that backward can run through
        return logps, entropies


    def off_policy_weights(self, batch):
        """Async GRPO (`max_staleness` > 0): the truncated importance weights of the batch's tokens against the
        log-probs they were sampled with (`off_policy.importance_weights`, TRL's vLLM modes and clip knobs), logged
        as `async/is_ratio_mean`, `async/is_ratio_max`, `async/is_corrected_share`. Synchronous, or with vLLM (TRL
        applies the same correction and logs it as `sampling/importance_sampling_ratio/*`): None."""
        if not getattr(self.rollout_func, "off_policy", False) or batch.get("sampling_per_token_logps") is None:
            return None
        if self.use_vllm:  # TRL weighs the loss itself by the same ratio (vllm_importance_sampling_correction)
            return None
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].shape[1]
        current = batch.get("old_per_token_logps")
        if current is None:  # the proximal policy: the trained weights before this step's update
            current = self.token_logps(self.model, ids, mask, keep)
        learned = batch["completion_mask"] * batch.get("tool_mask", 1)
        weights, stats = importance_weights(current, batch["sampling_per_token_logps"], learned,
                                            self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min,
                                            self.vllm_importance_sampling_clip_max)
        metrics = metric_lists(self)
        metrics["async/is_ratio_mean"].append(stats.ratio_mean)
        metrics["async/is_ratio_max"].append(stats.ratio_max)
        metrics["async/is_corrected_share"].append(stats.corrected_share)
        return weights


class StepCreditGRPOTrainer(EpisodeGRPOTrainer):
    """TRL's GRPOTrainer with GiGPO's step-level term added to its advantages: (B,) episode advantages become
    (B, T) = A^E + omega * A^S (`step_credit`); TRL's loss takes (B, T) advantages as they are."""

    def token_advantages(self, advantages, completion_ids):
        rollouts: EpisodeRollouts = self.rollout_func
        steps, rollouts.step_advantages = rollouts.step_advantages, None
        if steps is None or len(steps) != len(advantages):
            raise RuntimeError(f"step advantages for {0 if steps is None else len(steps)} episodes, TRL has {len(advantages)}")
        table = torch.zeros(completion_ids.shape, dtype=advantages.dtype, device=advantages.device)
        for row, values in enumerate(steps):
            n = min(len(values), table.shape[1])
            table[row, :n] = torch.tensor(values[:n], dtype=advantages.dtype)
        return advantages.unsqueeze(1) + rollouts.settings.step_advantage_weight * table
