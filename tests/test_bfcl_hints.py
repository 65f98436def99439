"""Environment Tuning hints on the bfcl env: actionable, and never derived from the ground truth."""

from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2025.6.8)")

from turnforge.envs.base import load_tasks, make_env  # noqa: E402
from turnforge.envs.bfcl.data import CATEGORIES  # noqa: E402
from turnforge.envs.bfcl.execution import build_instances, method_table, parse_call_string  # noqa: E402
from turnforge.formats import get_format  # noqa: E402
from turnforge.formats.bfcl_python import call_string  # noqa: E402
from turnforge.types import Message, ToolCall  # noqa: E402


def _first_call_hint(task_id: str, *calls: ToolCall, hints: bool = True):
    env = make_env("bfcl", hints=hints)
    category = task_id.rsplit("_", 1)[0]
    env.reset(next(t for t in load_tasks("bfcl", "test", category=category) if t.id == task_id))
    return env.step(Message("assistant", "", tool_calls=list(calls)))


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCall("cd", {}), "`cd` needs the parameter `folder` (string)"),
        (ToolCall("cd", {"foldr": "document"}), "`cd` has no parameter `foldr`. Signature: cd(folder: string)"),
        (ToolCall("cdd", {"folder": "document"}), "there is no function `cdd`. Did you mean `cd`?"),
        (ToolCall("post_tweet", {"content": "hi"}), "log in first: call authenticate_twitter(username: string, password: string)"),
        (ToolCall("cd", {"folder": "reports"}), "it is not in the current directory /workspace (which holds: document/"),
        (ToolCall("cat", {"file_name": "document/final_report.pdf"}), "cd into the folder that holds it first"),
    ],
)  # fmt: skip
def test_a_failed_call_gets_an_actionable_hint(call, expected):
    out = _first_call_hint("multi_turn_base_0", call)
    assert expected in out.messages[0].content and expected in out.info["hint"]
    assert out.messages[0].content.index("Hint: ") > 0  # after BFCL's own result


def test_without_hints_the_observation_is_bfcls_result_alone():
    out = _first_call_hint("multi_turn_base_0", ToolCall("cd", {"folder": "reports"}), hints=False)
    assert "Hint" not in out.messages[0].content and "No such directory" in out.messages[0].content
    assert "current directory" in out.info["hint"]  # still reported in info, for analysis


def test_a_successful_call_gets_no_hint():
    out = _first_call_hint("multi_turn_base_0", ToolCall("cd", {"folder": "document"}))
    assert "hint" not in out.info and "Hint" not in out.messages[0].content


def _mutated(call: ToolCall, rng: random.Random) -> ToolCall:
    """A plausible mistake: a parameter dropped or renamed, a value changed, or a misspelled name."""
    call = copy.deepcopy(call)
    kind = rng.choice(["drop", "rename", "value", "name"])
    if kind == "name" or not call.arguments:
        return ToolCall(call.name + "s", call.arguments)
    key = rng.choice(sorted(call.arguments))
    if kind == "drop":
        call.arguments.pop(key)
    elif kind == "rename":
        call.arguments[key + "_id"] = call.arguments.pop(key)
    else:
        call.arguments[key] = "no_such_thing"
    return call


def _replies(task, rng: random.Random) -> list[list[Message]]:
    """Per turn: the ground truth with mistakes, then the ground truth, then a reply without calls."""
    methods = method_table(build_instances(task.data))
    turns = []
    for calls in task.data["ground_truth"]:
        gt = [parse_call_string(c, methods) for c in calls]
        bad = [_mutated(c, rng) if rng.random() < 0.6 else c for c in gt]
        steps = [Message("assistant", "", tool_calls=bad), Message("assistant", "", tool_calls=gt)] if gt else []
        turns.append(steps + [Message("assistant", "Done.")])
    return turns


def _hints_of(task, turns: list[list[Message]]) -> list[str]:
    env = make_env("bfcl", hints=True)
    env.reset(task)
    hints = []
    for steps in turns:
        for reply in steps:
            hints.append(env.step(reply).info.get("hint", ""))
    return hints


def _spellings(call_text: str, methods) -> set[str]:
    """The ways a ground-truth call could be written: BFCL's string, our call string, the python format."""
    call = parse_call_string(call_text, methods)
    rendered = get_format("bfcl_python").render(Message("assistant", "", tool_calls=[call]))
    return {call_text, call_string(call), rendered.strip("[]")}


def _tasks(per_category: int):
    rng = random.Random(7)
    return [t for c in CATEGORIES for t in rng.sample(load_tasks("bfcl", "test", category=c), per_category)]


def test_hints_contain_no_ground_truth_call_the_model_did_not_write():
    rng, n_hints = random.Random(0), 0
    for task in _tasks(25):
        turns = _replies(task, rng)
        produced = {call_string(c) for steps in turns for m in steps for c in m.tool_calls or []}
        methods = method_table(build_instances(task.data))
        hints = [h for h in _hints_of(task, turns) if h]
        n_hints += len(hints)
        for call_text in (c for calls in task.data["ground_truth"] for c in calls):
            if call_string(parse_call_string(call_text, methods)) in produced:
                continue
            for spelling in _spellings(call_text, methods):
                assert not any(spelling in h for h in hints), (task.id, spelling)
    assert n_hints > 100  # the replies do fail often enough for the check to mean something


def test_hints_do_not_depend_on_the_ground_truth():
    """The same replies give the same hints when the entry's ground truth is replaced by empty turns."""
    rng = random.Random(1)
    for task in _tasks(10):
        turns = _replies(task, rng)
        blind = copy.deepcopy(task)
        blind.data["ground_truth"] = [[] for _ in task.data["ground_truth"]]
        assert _hints_of(task, turns) == _hints_of(blind, turns), task.id
