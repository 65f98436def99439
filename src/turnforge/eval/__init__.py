"""Evaluation: metrics (pass@k, pass^k, Wilson intervals), the resumable runner, and the rich table."""

from turnforge.eval.metrics import SUMMARY_KEYS, k_values, pass_at_k, pass_hat_k, summarize, wilson_interval
from turnforge.eval.runner import run_eval

__all__ = ["SUMMARY_KEYS", "k_values", "pass_at_k", "pass_hat_k", "run_eval", "summarize", "wilson_interval"]
