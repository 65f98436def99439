"""Off-policy correction for asynchronous GRPO: importance weights from the recorded behaviour log-probabilities.

An async step trains episodes sampled by older weights (up to `max_staleness` optimizer steps older) and, where a
weight update landed mid-episode, by a mix of versions. The rollout recorded the log-probability of every sampled
token under the distribution that actually drew it (`Turn.logprobs`: log_softmax(logits / T), what TRL recomputes),
so the ratio pi_theta(token) / pi_behaviour(token) is known per token. The correction is TRL's own for vLLM's
sampler mismatch (`GRPOTrainer`, `vllm_importance_sampling_correction`), here for staleness: the proximal policy
is the trained weights before the step (TRL's `old_per_token_logps`, PPO's ratio is taken against it), and each
token's loss is multiplied by the behaviour ratio pi_old / pi_behaviour, truncated (`token_truncate`: min(ratio, C),
Yao et al., "Your efficient RL framework secretly brings you off-policy RL training", 2025) or masked (`*_mask`:
0 outside [C_min, C_max]), per token or per episode (`sequence_*`: the product over the episode's tokens). This is
AReaL's decoupled objective (arXiv 2505.24298) with the behaviour weight truncated, as TRL truncates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass
class ImportanceStats:
    """One batch's importance ratios on its learned tokens: mean and max before truncation, and the share of tokens
    whose weight truncation or masking changed."""

    ratio_mean: float
    ratio_max: float
    corrected_share: float


def importance_weights(current: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, mode: str,
                       clip_min: float | None, clip_max: float | None) -> tuple[torch.Tensor, ImportanceStats]:
    """Weights (B, T) (per-token modes) or (B, 1) (sequence modes) on `mask`'s tokens (0 elsewhere does not matter:
    the loss masks them), from the proximal log-probs `current` and the `behaviour` ones, both (B, T); as TRL's vLLM
    correction (a NaN behaviour log-prob: ratio 1).

    >>> current = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    >>> behaviour = torch.log(torch.tensor([[0.5, 0.1, 0.9]]))   # token 2 was 5x less likely to the sampler
    >>> mask = torch.tensor([[1, 1, 0]])
    >>> w, stats = importance_weights(current, behaviour, mask, "token_truncate", None, 3.0)
    >>> [round(x, 3) for x in w[0].tolist()], round(stats.ratio_max, 3), stats.corrected_share
    ([1.0, 3.0, 1.0], 5.0, 0.5)
    >>> w, stats = importance_weights(current, behaviour, mask, "token_mask", 0.5, 3.0)
    >>> [round(x, 3) for x in w[0].tolist()]
    [1.0, 0.0, 1.0]
    """
    if mode not in IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode {mode!r}: use one of {', '.join(IS_MODES)}")
    learned = mask.bool()
    diff = torch.nan_to_num((current - behaviour) * mask, nan=0.0)
    sequence = mode.startswith("sequence")
    ratio = torch.exp(diff.sum(-1, keepdim=True) if sequence else diff)
    if mode.endswith("truncate"):
        weights = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        low = clip_min if clip_min is not None else -math.inf
        high = clip_max if clip_max is not None else math.inf
        weights = ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    if sequence:
        rows = learned.any(-1)
        seen, changed = ratio[rows, 0], (weights != ratio)[rows, 0]
    else:
        seen, changed = ratio[learned], (weights != ratio)[learned]
    if seen.numel() == 0:
        return weights, ImportanceStats(1.0, 1.0, 0.0)
    return weights, ImportanceStats(float(seen.mean()), float(seen.max()), float(changed.float().mean()))
