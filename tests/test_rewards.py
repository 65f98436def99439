"""Rewards: hand-worked numbers for every component, and the weighted total."""

import doctest

import pytest

from turnforge import rewards
from turnforge.rewards import (
    RewardWeights,
    format_penalty,
    loop_penalty,
    outcome_reward,
    overlong_penalty,
    progress_reward,
    reward_components,
    tool_call_reward,
    total_reward,
)
from turnforge.types import Message, Score, StopReason, ToolCall, Trajectory, Turn


def _traj(replies, answers, success=False, progress=0.0, parse_ok=None, calls=None):
    messages = [Message("system", "s"), Message("user", "task")]
    for i, (reply, answer) in enumerate(zip(replies, answers, strict=True)):
        messages.append(Message("assistant", reply, tool_calls=(calls or {}).get(i)))
        messages.append(Message("user", answer))
    oks = parse_ok or [True] * len(replies)
    return Trajectory(
        task_id="t", env="e", category="c", messages=messages,
        turns=[Turn(text=r, parse_ok=ok) for r, ok in zip(replies, oks, strict=True)],
        score=Score(success=success, reward=float(success), progress=progress),
        stop_reason=StopReason.success if success else StopReason.failure,
    )


def test_docstring_examples_hold():
    assert doctest.testmod(rewards).failed == 0


def test_outcome_plain_and_signed():
    assert outcome_reward(_traj(["a"], ["x"], success=True)) == 1.0
    assert outcome_reward(_traj(["a"], ["x"], success=True), signed=True) == 1.0
    assert outcome_reward(_traj(["a"], ["x"])) == 0.0
    assert outcome_reward(_traj(["a"], ["x"]), signed=True) == -1.0


def test_progress_is_the_env_partial_score_clipped():
    assert progress_reward(_traj(["a"], ["x"], progress=2 / 3)) == pytest.approx(0.6667, abs=1e-4)
    assert progress_reward(_traj(["a"], ["x"], progress=1.5)) == 1.0


def test_tool_call_reward_only_for_failed_episodes_with_a_parsed_action():
    assert tool_call_reward(_traj(["a", "b"], ["x", "y"], parse_ok=[False, True]), bonus=0.2) == 0.2
    assert tool_call_reward(_traj(["a", "b"], ["x", "y"], parse_ok=[False, False]), bonus=0.2) == 0.0
    assert tool_call_reward(_traj(["a"], ["x"], success=True), bonus=0.2) == 0.0


def test_overlong_penalty_dapo_shape():
    # max 100, buffer 20: free up to 80; 85 -> (80-85)/20 = -0.25; 100 -> -1.0 (the limit itself); 101 -> -1
    assert overlong_penalty(80, 100, 20) == 0.0
    assert overlong_penalty(85, 100, 20) == -0.25
    assert overlong_penalty(100, 100, 20) == -1.0
    assert overlong_penalty(101, 100, 20) == -1.0
    assert overlong_penalty(100, 100, 0) == 0.0  # no buffer: only beyond the limit is punished
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(1, 10, 11)


def test_format_penalty_is_minus_the_unparsed_fraction():
    assert format_penalty(_traj(["a", "b", "c"], ["x", "y", "z"], parse_ok=[False, True, True])) == pytest.approx(-1 / 3)


def test_loop_penalty_needs_same_reply_and_same_answer():
    # turn 3 repeats turn 1 and gets the same answer: a loop; turn 4 repeats turn 2 but the answer changed
    traj = _traj(["go to a", "open b", "go to a", "open b"], ["A", "B1", "A", "B2"])
    assert loop_penalty(traj) == -0.25
    assert loop_penalty(_traj(["x  y"], ["o"])) == 0.0


def test_loop_penalty_tells_tool_calls_apart():
    calls = {0: [ToolCall("ls", {"a": 1})], 1: [ToolCall("ls", {"a": 2})]}
    assert loop_penalty(_traj(["", ""], ["out", "out"], calls=calls)) == 0.0
    same = {0: [ToolCall("ls", {"a": 1})], 1: [ToolCall("ls", {"a": 1})]}
    assert loop_penalty(_traj(["", ""], ["out", "out"], calls=same)) == -0.5


def test_weighted_total_with_metric_only_components():
    traj = _traj(["a", "a"], ["x", "x"], progress=0.5, parse_ok=[True, False])
    weights = RewardWeights(outcome=1.0, progress=0.25, format=0.0, loop=0.5, tool_call=1.0, tool_call_bonus=0.1)
    parts = reward_components(traj, weights, generated_tokens=10, max_generated_tokens=100)
    assert parts == {"outcome": 0.0, "progress": 0.5, "tool_call": 0.1, "overlong": 0.0, "format": -0.5, "loop": -0.5}
    # 1*0 + 0.25*0.5 + 1*0.1 + 0*(-0.5) + 0.5*(-0.5) = 0.125 + 0.1 - 0.25 = -0.025
    assert total_reward(parts, weights) == pytest.approx(-0.025)


def test_tcr_counts_tool_rounds_not_plain_answers_and_is_capped():
    """DemyAgent's failure score min(-0.6, -1 + (num_turns - 2) / 2 * 0.1): +0.1 per tool round, at most +0.4. A
    final answer without a call (the code env's plain reply) is no tool round; a success gets no TCR."""
    from turnforge.rewards import tool_call_reward, tool_calls

    def episode(rounds: int, success: bool = False) -> Trajectory:
        messages = [Message("system", "s"), Message("user", "problem")]
        for k in range(rounds):
            messages += [Message("assistant", f"<tool_call>{k}</tool_call>"), Message("tool", "out")]
        messages.append(Message("assistant", "\\boxed{3}"))
        turns = [Turn(text="call") for _ in range(rounds)] + [Turn(text="answer")]
        return Trajectory("t", "code", "math", messages, turns, Score(success, float(success), 0.0),
                          StopReason.success if success else StopReason.failure, tools=[{"type": "function"}])

    assert [tool_calls(episode(n)) for n in (0, 1, 3)] == [0, 1, 3]
    assert [tool_call_reward(episode(n)) for n in (0, 1, 3, 4, 9)] == pytest.approx([0.0, 0.1, 0.3, 0.4, 0.4])
    assert tool_call_reward(episode(3, success=True)) == 0.0
