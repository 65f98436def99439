"""Evaluation: metrics (pass@k, pass^k, Wilson intervals), learning curves, failure modes, and the rich table.

The resumable runner that plays the episodes is `turnforge.rollouts_file`; the run's report and model card are
`turnforge.report` and `turnforge.card` (they read the recipe, which is above this package).
"""

from turnforge.eval.metrics import SUMMARY_KEYS, k_values, pass_at_k, pass_hat_k, summarize, wilson_interval

__all__ = ["SUMMARY_KEYS", "k_values", "pass_at_k", "pass_hat_k", "summarize", "wilson_interval"]
