"""Failure modes seen in episodes: loops, invalid actions, premature success claims, format and tool errors.

Read from the trajectory alone (no replay): a loop is a reply that `turnforge.rewards.repeats` (the one
definition the loop reward and DPO mining use); a premature success is a reply that claims the task is done
(`claims_success`, DPO mining's `task_succeeded_negative`) anywhere but as the last reply of a won episode;
format errors are turns whose reply did not parse; invalid actions and tool errors are the env's own counts
(`score.details["invalid_actions"]`, `["tool_errors"]`; household reports its refused actions as both, so
they count once, as invalid actions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turnforge.data.dpo_pairs.judging import claims_success
from turnforge.rewards import episode_steps, repeats
from turnforge.types import Trajectory, trajectory_records

FAILURE_MODES = ("loop", "invalid_action", "premature_success", "format_error", "tool_error")


def episode_failures(traj: Trajectory) -> dict[str, int]:
    """Turns (or env-counted actions) of each failure mode in one episode; modes it does not show are absent."""
    steps = episode_steps(traj)
    replies = traj.reply_indices()
    won_last = replies[-1] if traj.score.success and replies else None
    details = traj.score.details
    counts = {
        "loop": sum(repeats(step, steps[:k]) for k, step in enumerate(steps)),
        "invalid_action": int(details.get("invalid_actions", 0) or 0),
        "premature_success": sum(claims_success(traj.messages[i]) for i in replies if i != won_last),
        "format_error": sum(not turn.parse_ok for turn in traj.turns),
        "tool_error": 0 if "invalid_actions" in details else int(details.get("tool_errors", 0) or 0),
    }
    return {mode: n for mode, n in counts.items() if n}


@dataclass
class FailureMode:
    """How often one failure mode appeared in a file of episodes, and where first."""

    mode: str
    episodes: int = 0
    count: int = 0
    example: str = ""
    """`FILE:LINE` of the first episode showing it."""
    example_task: str = ""


def failure_modes(episodes_file: Path) -> dict[str, FailureMode]:
    """Every failure mode of `FAILURE_MODES` with its episode count, total count and first example."""
    modes = {mode: FailureMode(mode) for mode in FAILURE_MODES}
    for where, traj in trajectory_records(episodes_file):
        for mode, n in episode_failures(traj).items():
            seen = modes[mode]
            seen.episodes += 1
            seen.count += n
            if not seen.example:
                seen.example, seen.example_task = where, f"{traj.task_id} sample {traj.sample}"
    return modes
