"""Step-level credit for multi-turn GRPO: GiGPO's anchor-state advantages (Feng et al. 2025, arXiv 2505.10978).

GRPO gives every token of an episode the same advantage: one wrong digit in `take bowl 1 from cabinet 2`, in a
30-turn episode that then fails, is blamed as much as the 29 right actions around it. GiGPO adds a second
level. Within a group (the episodes of one task), the turns that start from the same state (an "anchor
state": the same observation text, GiGPO's exact-match clustering) form a step group, and each turn's
discounted return is compared with the others' in its step group:

    R_{i,t}  = gamma^(T_i - 1 - t) * R_i           the episode's reward, discounted back to turn t
    A^S_{i,t} = R_{i,t} - mean of R over the turns of the group that saw the same state
    A_{i,t}   = A^E_i + omega * A^S_{i,t}           on every generated token of turn t

A turn alone in its step group gets A^S = 0. Like GiGPO's `mean_norm`, both levels are differences in reward
units; where TRL divides the episode advantage by the group's (or batch's) reward std (`scale_rewards`),
the step term is divided by the same std, so the two stay in one unit (a group whose rewards are all equal
has no std: its step term stays in reward units).

The state is what the model saw since its previous reply (for the first reply: the whole first prompt), as
text; the episode reward is the stage's weighted total (`turnforge.rewards.total_reward`).

    >>> step_returns(3, 1.0, 0.5)
    [0.25, 0.5, 1.0]
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from turnforge.data.sft import episode_pieces
from turnforge.types import Trajectory

STD_EPSILON = 1e-4
"""Added to a reward std before dividing by it (TRL's own epsilon in `_generate_and_score_completions`)."""


def reply_states(traj: Trajectory) -> list[str]:
    """What the model saw before each of its replies: the messages since its previous reply, joined.

    The first reply's state is the whole first prompt (system, task, first observation)."""
    return ["\n".join(m.content for m in seen) for seen in traj.between_replies()[:-1]]


def step_returns(turns: int, reward: float, gamma: float) -> list[float]:
    """The episode reward discounted back to each of its `turns` turns (the reward arrives after the last)."""
    return [reward * gamma ** (turns - 1 - t) for t in range(turns)]


def reward_scale(rewards: Sequence[float]) -> float:
    """What TRL divides a group's advantages by (its reward std + epsilon); 1 for a group without spread."""
    if len(rewards) < 2:
        return 1.0
    std = statistics.stdev(rewards)
    return std + STD_EPSILON if std > 1e-6 else 1.0


def group_step_advantages(
    group: Sequence[Trajectory], rewards: Sequence[float], gamma: float, scale: float = 1.0
) -> list[list[float]]:
    """A^S per turn of each episode of one group (episodes of one task), divided by `scale`.

    >>> from turnforge.types import Message, Score, StopReason, Turn
    >>> def ep(*replies):
    ...     msgs = [Message("user", "room")]
    ...     for r, obs in replies:
    ...         msgs += [Message("assistant", r), Message("user", obs)]
    ...     return Trajectory("t", "e", "c", msgs, [Turn(r) for r, _ in replies], Score(True, 1, 1), StopReason.success)
    >>> a = ep(("go desk", "desk"), ("take pen", "done"))
    >>> b = ep(("go desk", "desk"), ("take cup", "Nothing happens."), ("take pen", "done"))
    >>> group_step_advantages([a, b], [1.0, 1.0], gamma=0.5)   # returns a: 0.5 1 / b: 0.25 0.5 1
    [[0.125, 0.25], [-0.125, -0.25, 0.0]]
    """
    if len(group) != len(rewards):
        raise ValueError(f"{len(group)} episodes but {len(rewards)} rewards")
    returns = [step_returns(len(traj.turns), reward, gamma) for traj, reward in zip(group, rewards, strict=True)]
    anchors: dict[str, list[float]] = {}
    states = [reply_states(traj)[: len(traj.turns)] for traj in group]
    for episode_states, episode_returns in zip(states, returns, strict=True):
        for state, value in zip(episode_states, episode_returns, strict=False):
            anchors.setdefault(state, []).append(value)
    means = {state: statistics.fmean(values) for state, values in anchors.items()}
    advantages = []
    for episode_states, episode_returns in zip(states, returns, strict=True):
        row = [(value - means[state]) / scale for state, value in zip(episode_states, episode_returns, strict=False)]
        advantages.append(row + [0.0] * (len(episode_returns) - len(row)))  # turns without a recorded state
    return advantages


def token_values(traj: Trajectory, per_turn: Sequence[float], length: int) -> list[float]:
    """`per_turn[k]` on turn k's generated ids, 0 on the observation ids between turns: the layout of the
    completion `turnforge.train.grpo_rollouts.episode_sequence` builds from the same `episode_pieces`, cut to `length`."""
    values: list[float] = []
    for (generated, observation), value in zip(episode_pieces(traj), per_turn, strict=True):
        values += [value] * len(generated) + [0.0] * len(observation)
    return values[:length]
