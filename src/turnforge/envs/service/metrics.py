"""Per-domain summary figures of service episodes (summary.json "env_metrics").

For each domain (Task.category) and overall: pass^k and pass@k for k = 1..samples (tau2's pass^k averaged over
tasks), mean reward, tau2 termination reasons, tool-error rate (errors / tool calls), user and agent token
counts, user-side failures, how many episodes had an NL_ASSERTION component left unevaluated (no judge),
`user_faults`: how many failed episodes show a user-side fault (user_faults.py), their share, and the count of
each fault among them, and `do_nothing_floor`: the success an agent that does nothing would get on the same
episodes' tasks (env.py `do_nothing_wins`), which the eval tables show beside the success.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from turnforge.envs.service.user_faults import USER_FAULTS
from turnforge.estimators import pass_at_k, pass_hat_k
from turnforge.types import StopReason, Trajectory


def service_metrics(trajectories: list[Trajectory]) -> dict:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.category].append(t)
    out = {domain: _figures(group) for domain, group in sorted(groups.items())}
    if len(groups) > 1:
        out["all"] = _figures(trajectories)
    return out


def _figures(trajectories: list[Trajectory]) -> dict:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for t in trajectories:
        counts[t.task_id][0] += 1
        counts[t.task_id][1] += int(t.score.success)
    fewest = min((n for n, _ in counts.values()), default=0)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    details = [t.score.details for t in trajectories]
    tool_calls = sum(d.get("tool_calls", 0) for d in details)
    return {
        "n_tasks": len(counts),
        "n_episodes": len(trajectories),
        "pass^k": {str(k): mean([pass_hat_k(n, c, k) for n, c in counts.values()]) for k in range(1, fewest + 1)},
        "pass@k": {str(k): mean([pass_at_k(n, c, k) for n, c in counts.values()]) for k in range(1, fewest + 1)},
        "mean_reward": mean([t.score.reward for t in trajectories]),
        "termination": dict(Counter(d.get("termination", "env_error") for d in details)),
        "tool_error_rate": sum(d.get("tool_errors", 0) for d in details) / tool_calls if tool_calls else 0.0,
        "agent_tokens": sum(t.tokens_generated for t in trajectories),
        "user_tokens": sum(d.get("user_tokens", 0) for d in details),
        "user_failures": sum(d.get("termination") == "user_error" for d in details),
        "user_faults": user_fault_figures(trajectories),
        "nl_assertion_not_evaluated": sum(d.get("nl_assertion_evaluated") is False for d in details),
        # success over the evaluated components is an upper bound where NL_ASSERTION was not evaluated:
        # this is the success rate of the episodes whose every reward_basis component was evaluated
        "success_fully_evaluated": mean([float(t.score.success) for t, d in zip(trajectories, details, strict=True)
                                         if d.get("nl_assertion_evaluated") is not False]),
        "do_nothing_floor": do_nothing_floor(trajectories),
    }


def do_nothing_floor(trajectories: list[Trajectory]) -> float | None:
    """The share of the episodes whose task an agent that does nothing wins (`details["do_nothing_wins"]`, an env
    error's episode aside); None when a graded episode lacks it (graded before issue 60)."""
    graded = [t.score.details.get("do_nothing_wins") for t in trajectories if t.stop_reason is not StopReason.env_error]
    if not graded or None in graded:
        return None
    return sum(map(float, graded)) / len(graded)


def user_fault_figures(trajectories: list[Trajectory]) -> dict:
    """Over the failed episodes: how many show a user-side fault, their share, and each fault's count (an episode
    may show several). Episodes graded before the attribution existed carry none and count as not attributed."""
    failed = [t.score.details.get("user_faults", []) for t in trajectories
              if not t.score.success and t.stop_reason is not StopReason.env_error]  # an env error is no verdict
    attributed = sum(bool(faults) for faults in failed)
    unreviewed = sum(t.score.details.get("user_review") == "no_verdict" for t in trajectories if not t.score.success)
    return {
        "failed": len(failed),
        "unreviewed": unreviewed,  # the judge gave no verdict on them (user_faults.py judged_user_fault)
        "attributed": attributed,
        "share": attributed / len(failed) if failed else 0.0,
        "by_fault": {f: sum(f in faults for faults in failed) for f in USER_FAULTS},
    }
