"""summary.json `env_metrics` of the code env: per category and overall, avg@k (mean success over all
samples, the DemyAgent / AIME convention), pass@k for k = 1..samples (unbiased, Codex), tool calls,
tool errors and sandbox timeouts per episode, and the sandbox isolation the episodes ran under (docs/security.md:
`namespaces`, or the weaker `rlimits`; both, comma-separated, if a resumed run mixed them)."""

from __future__ import annotations

from collections import defaultdict

from turnforge.estimators import pass_at_k
from turnforge.types import Trajectory


def code_metrics(episodes: list[Trajectory]) -> dict:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in episodes:
        groups[traj.category].append(traj)
        groups["all"].append(traj)
    return {name: _group(trajs) for name, trajs in sorted(groups.items())}


def _group(episodes: list[Trajectory]) -> dict:
    by_task: dict[str, list[bool]] = defaultdict(list)
    for traj in episodes:
        by_task[traj.task_id].append(bool(traj.score.success))
    samples = min(len(v) for v in by_task.values())
    details = [traj.score.details for traj in episodes]
    n = len(episodes)
    return {
        "episodes": n,
        "avg@k": sum(traj.score.success for traj in episodes) / n,
        "pass@k": {str(k): sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task)
                   for k in range(1, samples + 1)},
        "tool_calls_per_episode": sum(d.get("tool_calls", 0) for d in details) / n,
        "tool_errors_per_episode": sum(d.get("tool_errors", 0) for d in details) / n,
        "sandbox_timeouts_per_episode": sum(d.get("sandbox_timeouts", 0) for d in details) / n,
        "sandbox_isolation": ", ".join(sorted({d["sandbox_isolation"] for d in details if "sandbox_isolation" in d})),
    }
