"""Evaluation metrics: the summary of a run (summary.json), with pass@k, pass^k and Wilson intervals.

pass@k and pass^k are estimated per task from n sampled episodes with c successes, without bias
(`turnforge.estimators`), then averaged over tasks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from turnforge.estimators import pass_at_k, pass_hat_k, wilson_interval
from turnforge.formats.base import FormatError
from turnforge.formats.families import Family, visible_reply
from turnforge.types import StopReason, Trajectory

# The keys of summary.json, in order: a contract that later stages and external checks read.
SUMMARY_KEYS = (
    "env", "env_options", "split", "policy", "n_tasks", "samples_per_task", "n_episodes", "success", "success_ci",
    "pass@k", "pass^k", "mean_reward", "mean_progress", "mean_turns", "stop_reasons", "by_category",
    "wall_s", "wall_s_invocation", "env_steps", "tokens_generated", "format_errors", "tool_errors", "sampling",
)  # fmt: skip


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
    env_options: dict | None = None,
) -> dict:
    """The summary.json of an evaluation (keys are a contract: later stages and external checks read them).

    Episode-level means (success, reward, progress, turns) weigh every episode equally; pass@k and
    pass^k are per-task estimates averaged over tasks; `by_category[c]["n"]` counts episodes. `sampling` is
    the run's sampling settings (temperature, top_p, top_k, max_new_tokens, stop, seed); `env_options` every option
    the env was made with (defaults included: a tau2 domain, its retrieval variant, hints), so that a summary says
    which evaluation it is.
    """
    n_success = sum(int(t.score.success) for t in trajectories)
    at_k, hat_k = _pass_metrics(trajectories, samples_per_task)
    return {
        "env": env,
        "env_options": dict(env_options or {}),
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


def tool_call_quality(trajectories: list[Trajectory], fmt: Any, family: Family | None) -> dict[str, Any]:
    """How the model wrote its tool calls in `fmt` (a `tool_call` format: its family's): of the replies that attempt a
    call (the format's `call_marker` in the reply without its reasoning), the share the lenient parse reads (what the
    env acted on), the share valid as written (`parse_strict`: no fix needed), and how often each fix was needed."""
    attempts = lenient = strict = 0
    fixes: Counter[str] = Counter()
    for traj in trajectories:
        for turn in traj.turns:
            text = visible_reply(family, turn.text)
            if fmt.call_marker not in text:
                continue
            attempts += 1
            parsed = fmt.parse_lenient(text)
            if isinstance(parsed.result, FormatError):
                continue
            lenient += 1
            strict += not parsed.fixes
            fixes.update(parsed.fixes)
    return {
        "format": fmt.name,
        "family": family.name if family is not None else None,
        "call_replies": attempts,
        "parse_lenient": lenient / attempts if attempts else None,
        "parse_strict": strict / attempts if attempts else None,
        "fixes": dict(fixes.most_common()),
    }

