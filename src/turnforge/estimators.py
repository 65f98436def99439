"""The success-rate estimators: pass@k, pass^k and the Wilson interval, from counts alone.

pass@k asks "does at least one of k tries succeed?" (capability); pass^k asks "do all k tries succeed?"
(reliability, tau2-bench). A leaf module: the run summary (`eval.metrics`) and the envs' own benchmark figures
(`envs/*/metrics.py`) both use them, and envs must not import eval.
"""

from __future__ import annotations

import math


def _check_counts(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}: sample at least k episodes per task")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021, Codex).

    Hand-worked: n=4, c=1, k=2 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5.

    >>> pass_at_k(4, 1, 2)
    0.5
    >>> pass_at_k(4, 0, 2), pass_at_k(4, 3, 2)
    (0.0, 1.0)
    """
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset contains a success
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k from n samples with c successes: C(c, k) / C(n, k), the chance that k draws all succeed.

    Same estimator as tau2-bench `metrics/agent_metrics.py::pass_hat_k`.
    Hand-worked: n=4, c=2, k=2 -> C(2,2)/C(4,2) = 1/6.

    >>> round(pass_hat_k(4, 2, 2), 6)
    0.166667
    >>> pass_hat_k(4, 4, 4), pass_hat_k(4, 1, 2)
    (1.0, 0.0)
    """
    _check_counts(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a success rate (95% by default); (0, 1) when n == 0.

    Preferred over the normal interval because it stays inside [0, 1] and is sensible at 0/n.
    Hand-worked, z=1.96: 0/10 -> (0, 0.2775); 5/10 -> (0.2366, 0.7634).

    >>> tuple(round(x, 4) for x in wilson_interval(5, 10))
    (0.2366, 0.7634)
    """
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    z2 = z * z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, center - half), min(1.0, center + half))
