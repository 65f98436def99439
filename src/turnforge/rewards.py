"""Rewards: plain functions of a finished episode (a `Trajectory`), each returning one float.

A recipe combines them with weights (`RewardWeights`); weight 0 keeps a component as a logged metric
only, as verifiers' rubrics and TRL's `reward_weights` do. The GRPO stage hands every component to TRL
as its own reward function, so TRL logs `rewards/<name>/mean` for each and sums them with the weights.

    outcome            1 on success, else 0 (or -1 with signed=True, as DemyAgent's ±1 outcome)
    progress           the env's partial score: subgoal fraction (household), correct turns / turns (BFCL)
    tool_call          TCR: a small bonus for a failed episode that still made a well-formed action
    overlong           DAPO's soft overlong punishment over the generated tokens, with a buffer
    format             minus the fraction of replies the env's format could not parse
    loop               minus the fraction of replies that repeat (`repeats`: the one definition of a loop,
                       shared with DPO mining's `loop` reason; `reply_key` also dedupes RFT's episodes)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from turnforge.types import Message, Score, StopReason, Trajectory, Turn


def outcome_reward(traj: Trajectory, signed: bool = False) -> float:
    """1.0 when the episode succeeded; otherwise 0.0, or -1.0 when `signed` (DemyAgent's ±1 outcome).

    >>> outcome_reward(_example(success=False), signed=True)
    -1.0
    """
    if traj.score.success:
        return 1.0
    return -1.0 if signed else 0.0


def progress_reward(traj: Trajectory) -> float:
    """The env's final partial score in [0, 1] (`score.progress`): the fraction of subgoals reached, or for
    turn-based envs (BFCL) correct turns / total turns — Environment Tuning's fine-grained reward.

    >>> progress_reward(_example(progress=0.5))
    0.5
    """
    return min(1.0, max(0.0, float(traj.score.progress)))


def tool_call_reward(traj: Trajectory, bonus: float = 0.1, cap: float = 0.4) -> float:
    """TCR: for a FAILED episode, `bonus` per action the env ran, at most `cap`; 0 for a successful one.

    DemyAgent's failure score (math_dapo, arXiv 2510.11701) is `min(-0.6, -1 + (num_turns - 2) / 2 * 0.1)`:
    with its ±1 outcome that is +0.1 per tool round, capped at +0.4, so a model that keeps trying its tools on
    a task it fails is punished less than one that answers without them. An action is a reply answered by a
    `tool` message where the env acts through tools (it lists tools, or answers in tool messages: a plain final
    answer is no call), else (text-action envs) any reply the format parsed.

    >>> tool_call_reward(_example(success=False, parse_ok=[False, True]), bonus=0.1)
    0.1
    >>> tool_call_reward(_example(success=False, parse_ok=[True] * 7), bonus=0.1)   # capped
    0.4
    >>> tool_call_reward(_example(success=False, parse_ok=[False, False]), bonus=0.1)
    0.0
    """
    if traj.score.success:
        return 0.0
    return min(cap, bonus * tool_calls(traj))


def tool_calls(traj: Trajectory) -> int:
    """How many of the policy's replies the env ran as actions (see `tool_call_reward`)."""
    replies = traj.reply_indices()
    if traj.tools or any(m.role == "tool" for m in traj.messages):  # tool calls are how this env acts
        return sum(i + 1 < len(traj.messages) and traj.messages[i + 1].role == "tool" for i in replies)
    return sum(turn.parse_ok for turn in traj.turns)


def overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13) for a reply of `length` generated tokens.

    0 up to `max_length - buffer`; then falling linearly to -1 at `max_length`; -1 beyond.

    >>> overlong_penalty(90, max_length=100, buffer=20)   # 10 tokens into the 20-token buffer
    -0.5
    >>> overlong_penalty(80, max_length=100, buffer=20), overlong_penalty(120, max_length=100, buffer=20)
    (0.0, -1.0)
    """
    if buffer < 0 or buffer > max_length:
        raise ValueError(f"overlong buffer must be in [0, max_length={max_length}], got {buffer}")
    free = max_length - buffer
    if length <= free:
        return 0.0
    if length > max_length:
        return -1.0
    return (free - length) / buffer


def format_penalty(traj: Trajectory) -> float:
    """Minus the fraction of the episode's replies that did not parse (0 for an episode without replies).

    >>> format_penalty(_example(parse_ok=[True, False, False, True]))
    -0.5
    """
    if not traj.turns:
        return 0.0
    return -sum(not t.parse_ok for t in traj.turns) / len(traj.turns)


def reply_key(message: Message) -> str:
    """What a reply does, for telling repeats apart: its text with whitespace normalised, and its tool calls
    (name and arguments, without their ids).

    >>> reply_key(Message("assistant", " go to  a ")) == reply_key(Message("assistant", "go to a"))
    True
    """
    calls = [[c.name, c.arguments] for c in message.tool_calls or []]
    return json.dumps([" ".join(message.content.split()), calls], sort_keys=True)


@dataclass(frozen=True)
class Step:
    """One reply as loop detection sees it: what it did (`reply_key`; None for a reply that did not parse),
    the env's answer (whitespace normalised), and whether progress rose with it."""

    reply: str | None
    observation: str
    progressed: bool = False


def repeats(step: Step, past: Sequence[Step]) -> bool:
    """Whether `step` repeats, with no progress: its reply is the previous reply, or the reply of an earlier
    step since progress last rose that got the same answer. The one definition of "this reply repeats".

    >>> look, go = Step("look", "room"), Step("go", "desk")
    >>> repeats(look, [look, go]), repeats(Step("look", "other"), [look, go]), repeats(Step("go", "x"), [look, go])
    (True, False, True)
    >>> repeats(Step("look", "room"), [look, Step("go", "desk", progressed=True)])   # progress rose since
    False
    """
    if step.progressed or step.reply is None or not past:
        return False
    if past[-1].reply == step.reply:
        return True
    for earlier in reversed(past):
        if earlier.progressed:
            break  # progress rose at that step: repeating what came before it is no loop
        if earlier.reply == step.reply and earlier.observation == step.observation:
            return True
    return False


def episode_steps(traj: Trajectory) -> list[Step]:
    """The `Step` of every reply of an episode, from its conversation and its turns' progress."""
    steps, before = [], 0.0
    answers = traj.between_replies()[1:]
    for turn, i, answer in zip(traj.turns, traj.reply_indices(), answers, strict=False):
        text = " ".join(m.content for m in answer)
        steps.append(Step(reply_key(traj.messages[i]), " ".join(text.split()), turn.progress > before))
        before = turn.progress
    return steps


def loop_penalty(traj: Trajectory) -> float:
    """Minus the fraction of replies that repeat (`repeats`): an action repeated without any change the agent
    could see.

    >>> loop_penalty(_example(replies=["go to a", "look", "look", "go to a"], answers=["x", "y", "y", "z"]))
    -0.25
    """
    steps = episode_steps(traj)
    if not steps:
        return 0.0
    return -sum(repeats(step, steps[:k]) for k, step in enumerate(steps)) / len(steps)


@dataclass
class RewardWeights:
    """How a recipe combines the components; weight 0 = logged as a metric only."""

    outcome: float = 1.0
    progress: float = 0.0
    tool_call: float = 0.0
    overlong: float = 0.0
    format: float = 0.0
    loop: float = 0.0
    signed_outcome: bool = False
    """Outcome -1 instead of 0 on failure (DemyAgent)."""
    tool_call_bonus: float = 0.1
    """The TCR bonus per action of a failed episode, before its weight."""
    tool_call_cap: float = 0.4
    """The most TCR a failed episode gets (DemyAgent: -1 + 0.4 = -0.6 at best)."""
    overlong_buffer: int = 0
    """DAPO buffer in generated tokens; the limit is the GRPO stage's max completion length."""

    def __post_init__(self) -> None:
        if self.overlong_buffer < 0:
            raise ValueError(f"overlong_buffer must be >= 0, got {self.overlong_buffer}")

    def as_dict(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self).items() if name in COMPONENTS}


COMPONENTS = ("outcome", "progress", "tool_call", "overlong", "format", "loop")


def reward_components(
    traj: Trajectory, weights: RewardWeights, generated_tokens: int, max_generated_tokens: int
) -> dict[str, float]:
    """Every component of one episode (unweighted), keyed like `COMPONENTS`.

    >>> parts = reward_components(_example(success=True, progress=1.0), RewardWeights(), 10, 100)
    >>> parts["outcome"], parts["progress"], parts["overlong"]
    (1.0, 1.0, 0.0)
    """
    return {
        "outcome": outcome_reward(traj, signed=weights.signed_outcome),
        "progress": progress_reward(traj),
        "tool_call": tool_call_reward(traj, bonus=weights.tool_call_bonus, cap=weights.tool_call_cap),
        "overlong": overlong_penalty(generated_tokens, max_generated_tokens, weights.overlong_buffer),
        "format": format_penalty(traj),
        "loop": loop_penalty(traj),
    }


def total_reward(components: dict[str, float], weights: RewardWeights) -> float:
    """The weighted sum (what GRPO's advantages are computed from).

    >>> total_reward({"outcome": 1.0, "progress": 0.5, "tool_call": 0.0, "overlong": 0.0, "format": 0.0,
    ...               "loop": -0.5}, RewardWeights(progress=0.25, loop=0.2))
    1.025
    """
    w = weights.as_dict()
    return round(sum(w[name] * components[name] for name in COMPONENTS), 12)


def _example(
    success: bool = False,
    progress: float = 0.0,
    parse_ok: list[bool] | None = None,
    replies: list[str] | None = None,
    answers: list[str] | None = None,
) -> Trajectory:
    """A small trajectory for the docstring examples."""
    replies = replies or ["act"] * len(parse_ok or [True])
    answers = answers or ["ok"] * len(replies)
    oks = parse_ok or [True] * len(replies)
    messages = [Message("user", "task")]
    for reply, answer in zip(replies, answers, strict=True):
        messages += [Message("assistant", reply), Message("user", answer)]
    return Trajectory(
        task_id="t",
        env="example",
        category="c",
        messages=messages,
        turns=[Turn(text=r, parse_ok=ok) for r, ok in zip(replies, oks, strict=True)],
        score=Score(success=success, reward=float(success), progress=progress),
        stop_reason=StopReason.success if success else StopReason.failure,
    )
