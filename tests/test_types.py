"""Core types: the JSON round trip of a trajectory is exact, tool calls included."""

from __future__ import annotations

import json

import pytest

from turnforge.types import Message, Score, StopReason, ToolCall, Trajectory, Turn


def _trajectory() -> Trajectory:
    call = ToolCall("act", {"action": "go to fridge 1", "n": [1, 2], "ok": True}, id="call_0")
    return Trajectory(
        task_id="test-00003", env="household", category="pick_heat_then_place_in_recep",
        messages=[
            Message("system", "You are an agent."),
            Message("user", "Your task is to: put a hot apple in countertop."),
            Message("assistant", "", tool_calls=[call]),
            Message("tool", "You arrive at fridge 1. The fridge 1 is closed.", tool_call_id="call_0", name="act"),
        ],
        turns=[Turn(text='<tool_call>\n{"name": "act"}\n</tool_call>', generated_ids=[5, 6, 7],
                    logprobs=[-0.5, -0.25, -1.0], observation_ids=[8, 9], progress=0.25)],
        score=Score(success=False, reward=0.0, progress=0.25, details={"steps": 1}),
        stop_reason=StopReason.max_turns, split="test", sample=2, prompt_ids=[1, 2, 3, 4],
        tokens_generated=3, env_steps=1, timings={"wall_s": 0.5}, seed=7, model="tiny",
        tools=[{"type": "function", "function": {"name": "act", "parameters": {}}}],
    )


def test_round_trip_is_exact():
    t = _trajectory()
    line = t.to_json()
    assert "\n" not in line
    back = Trajectory.from_json(line)
    assert back == t and back.to_json() == line
    assert back.key == ("test-00003", 2)


def test_message_dict_is_the_chat_template_shape():
    d = _trajectory().messages[2].to_dict()
    assert d["tool_calls"][0] == {"type": "function", "id": "call_0",
                                  "function": {"name": "act", "arguments": {"action": "go to fridge 1", "n": [1, 2], "ok": True}}}
    # arguments given as a JSON string (OpenAI style) are decoded
    m = Message.from_dict({"role": "assistant", "content": None,
                           "tool_calls": [{"function": {"name": "act", "arguments": '{"action": "look"}'}}]})
    assert m.content == "" and m.tool_calls[0].arguments == {"action": "look"}


def test_unknown_keys_are_an_error():
    d = json.loads(_trajectory().to_json())
    d["colour"] = "red"
    with pytest.raises(ValueError, match="colour"):
        Trajectory.from_dict(d)


def test_between_replies_splits_the_conversation_around_the_policys_replies():
    """An env's own assistant turn in the prompt (DBBench's few-shot "Ok.") is prompt, not a reply."""
    messages = [Message("system", "rules"), Message("user", "shot"), Message("assistant", "Ok."),
                Message("user", "task"), Message("assistant", "a1"), Message("user", "o1"), Message("tool", "t1"),
                Message("assistant", "a2"), Message("user", "o2")]
    traj = Trajectory("t", "e", "c", messages, [Turn("a1"), Turn("a2")], Score(True, 1.0, 1.0), StopReason.success)
    assert [[m.content for m in part] for part in traj.between_replies()] == [
        ["rules", "shot", "Ok.", "task"], ["o1", "t1"], ["o2"],
    ]
    empty = Trajectory("t", "e", "c", messages[:2], [], Score(False, 0.0, 0.0), StopReason.gave_up)
    assert [[m.content for m in part] for part in empty.between_replies()] == [["rules", "shot"]]
