"""Evaluation metrics: pass@k, pass^k, Wilson intervals, and the summary of a run (summary.json).

pass@k asks "does at least one of k tries succeed?" (capability); pass^k asks "do all k tries
succeed?" (reliability, tau2-bench). Both are estimated per task from n sampled episodes with c
successes, without bias, then averaged over tasks.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable

from turnforge.types import StopReason, Trajectory

# The keys of summary.json, in order: a contract that later stages and external checks read.
SUMMARY_KEYS = (
    "env", "split", "policy", "n_tasks", "samples_per_task", "n_episodes", "success", "success_ci",
    "pass@k", "pass^k", "mean_reward", "mean_progress", "mean_turns", "stop_reasons", "by_category",
    "wall_s", "wall_s_invocation", "env_steps", "tokens_generated", "format_errors", "tool_errors", "sampling",
)  # fmt: skip


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


def k_values(samples_per_task: int) -> list[int]:
    """The k reported for pass@k / pass^k: 1, 2, 4, ... up to the samples per task."""
    ks, k = [], 1
    while k <= samples_per_task:
        ks.append(k)
        k *= 2
    return ks


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _per_task_counts(trajectories: list[Trajectory]) -> dict[str, tuple[int, int]]:
    """task_id -> (episodes, successes)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in trajectories:
        counts[t.task_id][0] += 1
        counts[t.task_id][1] += int(t.score.success)
    return {task: (n, c) for task, (n, c) in counts.items()}


def _pass_metrics(trajectories: list[Trajectory], samples_per_task: int) -> tuple[dict, dict]:
    counts = _per_task_counts(trajectories)
    # A task with fewer episodes than k (an unfinished run) cannot give pass@k; report k that all tasks support.
    fewest = min((n for n, _ in counts.values()), default=0)
    ks = [k for k in k_values(samples_per_task) if k <= fewest]
    at_k = {str(k): _mean(pass_at_k(n, c, k) for n, c in counts.values()) for k in ks}
    hat_k = {str(k): _mean(pass_hat_k(n, c, k) for n, c in counts.values()) for k in ks}
    return at_k, hat_k


def _stop_reason_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    counts = Counter(t.stop_reason for t in trajectories)
    return {r.value: counts[r] for r in StopReason if counts[r]}


def _by_category(trajectories: list[Trajectory]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.category].append(t)
    return {
        cat: {"n": len(group), "success": _mean(float(t.score.success) for t in group)}
        for cat, group in sorted(groups.items())
    }


def summarize(
    trajectories: list[Trajectory],
    *,
    env: str,
    split: str,
    policy: str,
    samples_per_task: int,
    wall_s: float = 0.0,
    sampling: dict | None = None,
    wall_s_invocation: float | None = None,
) -> dict:
    """The summary.json of an evaluation (keys are a contract: later stages and external checks read them).

    Episode-level means (success, reward, progress, turns) weigh every episode equally; pass@k and
    pass^k are per-task estimates averaged over tasks; `by_category[c]["n"]` counts episodes. `sampling` is
    the run's sampling settings (temperature, top_p, top_k, max_new_tokens, stop, seed).
    """
    n_success = sum(int(t.score.success) for t in trajectories)
    at_k, hat_k = _pass_metrics(trajectories, samples_per_task)
    return {
        "env": env,
        "split": split,
        "policy": policy,
        "n_tasks": len({t.task_id for t in trajectories}),
        "samples_per_task": samples_per_task,
        "n_episodes": len(trajectories),
        "success": _mean(float(t.score.success) for t in trajectories),
        "success_ci": list(wilson_interval(n_success, len(trajectories))),
        "pass@k": at_k,
        "pass^k": hat_k,
        "mean_reward": _mean(t.score.reward for t in trajectories),
        "mean_progress": _mean(t.score.progress for t in trajectories),
        "mean_turns": _mean(len(t.turns) for t in trajectories),
        "stop_reasons": _stop_reason_counts(trajectories),
        "by_category": _by_category(trajectories),
        "wall_s": wall_s,  # the run's time, across resumes
        "wall_s_invocation": wall_s if wall_s_invocation is None else wall_s_invocation,
        "env_steps": sum(t.env_steps for t in trajectories),
        "tokens_generated": sum(t.tokens_generated for t in trajectories),
        # Replies the format could not parse, and actions / tool calls the env refused (`details["tool_errors"]`):
        # observations the agent got, counted here so that a run's share of them is visible.
        "format_errors": sum(not turn.parse_ok for t in trajectories for turn in t.turns),
        "tool_errors": sum(int(t.score.details.get("tool_errors", 0) or 0) for t in trajectories),
        "sampling": sampling,
    }
