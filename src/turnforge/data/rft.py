"""Rejection sampling for RFT: from k episodes per task, keep the good ones, deduplicated and capped per task.

    kept, report = select_rft(trajectories, keep="success", max_per_task=2)
    report["yield"]                      # kept / sampled, overall
    report["by_category"]["pick_and_place"]   # {"sampled", "succeeded", "kept", "yield"}

Two episodes are duplicates when the policy wrote the same replies (`turnforge.rewards.reply_key`: whitespace
aside, tool calls compared): keeping both
would only weight that path twice. Among a task's kept episodes the shortest come first (fewer turns, then
fewer generated tokens), as in rejection-sampling fine-tuning where the most efficient success is preferred.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from turnforge.rewards import reply_key
from turnforge.types import Trajectory


def replies_key(traj: Trajectory) -> tuple[str, ...]:
    """The policy's replies as `reply_key`s (text whitespace-normalised, tool calls): equal = the same episode."""
    return tuple(reply_key(traj.messages[i]) for i in traj.reply_indices())


def select_rft(
    trajectories: list[Trajectory],
    keep: Literal["success", "best"] = "success",
    max_per_task: int = 2,
    min_progress: float = 0.5,
    skip_solved: bool = False,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """The episodes to fine-tune on, and the yield report (overall and per category).

    keep="success": successful episodes only. keep="best": also, for a task without a success, its single
    best episode by progress when that progress is >= `min_progress`. skip_solved: no episode of a task whose
    samples (at least two) all succeeded — the model already does it; the filter DAPO's dynamic sampling
    applies to GRPO groups.
    """
    if max_per_task < 1:
        raise ValueError(f"max_per_task must be at least 1, got {max_per_task}")
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in trajectories:
        by_task[traj.task_id].append(traj)
    kept: list[Trajectory] = []
    for episodes in by_task.values():
        winners = [t for t in episodes if t.score.success]
        if skip_solved and len(episodes) > 1 and len(winners) == len(episodes):
            continue
        if not winners and keep == "best":
            best = max(episodes, key=lambda t: t.score.progress)
            winners = [best] if best.score.progress >= min_progress else []
        winners.sort(key=lambda t: (len(t.turns), t.tokens_generated))
        seen: set[tuple[str, ...]] = set()
        for traj in winners:
            key = replies_key(traj)
            if key in seen:
                continue
            seen.add(key)
            kept.append(traj)
            if len(seen) == max_per_task:
                break
    return kept, yield_report(trajectories, kept)


def yield_report(sampled: list[Trajectory], kept: list[Trajectory]) -> dict[str, Any]:
    """{"sampled", "succeeded", "kept", "tasks", "tasks_kept", "yield", "by_category": {...}}."""

    def counts(trajs_in: list[Trajectory], trajs_kept: list[Trajectory]) -> dict[str, Any]:
        n = len(trajs_in)
        return {
            "sampled": n,
            "succeeded": sum(t.score.success for t in trajs_in),
            "kept": len(trajs_kept),
            "tasks": len({t.task_id for t in trajs_in}),
            "tasks_kept": len({t.task_id for t in trajs_kept}),
            "yield": round(len(trajs_kept) / n, 4) if n else 0.0,
        }

    categories = sorted({t.category for t in sampled})
    report = counts(sampled, kept)
    report["by_category"] = {
        c: counts([t for t in sampled if t.category == c], [t for t in kept if t.category == c]) for c in categories
    }
    return report
