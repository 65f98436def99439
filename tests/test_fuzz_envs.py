"""Hostile replies against every env and format (issue 17): no exception escapes an episode, every reply is an
observation, and the episode's trajectory still writes as one JSON line.

The default run tries a couple of hundred examples per env; `pytest -m slow tests/test_fuzz_envs.py` runs 10,000
each (`FUZZ_EXAMPLES`). Replies come from: arbitrary text (lone surrogates included, as broken UTF-8 decodes to),
huge outputs, deeply nested JSON, tool calls of unknown tools or with wrong argument types, and each env's own
valid actions mixed in so that episodes get past their first step.
"""

from __future__ import annotations

import json
import os
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.types import Message, StepResult

DEFAULT_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))

ENVS = [  # (env, options): every format each env speaks; the data-free variants
    ("household", {"format": "act_line"}),
    ("household", {"format": "tool_call"}),
    ("household", {"format": "react"}),
    ("sql", {"format": "react_sql", "generate": 4}),
    ("sql", {"format": "tool_call", "generate": 4}),
    ("bfcl", {"format": "tool_call"}),
    ("bfcl", {"format": "bfcl_python"}),
    ("service", {"domain": "desk"}),
    ("code", {"generate": 6, "timeout": 2.0}),
]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _tool_call(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
hostile = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "surrogateescape")),  # what broken UTF-8 becomes
    st.integers(1_000, 200_000).map(lambda n: "x" * n),  # a huge output
    st.integers(50, 5_000).map(_nested),  # deeply nested brackets / JSON
    st.builds(_tool_call, st.text(max_size=30), json_values),  # unknown tools, wrong argument shapes
    st.builds(_tool_call, st.sampled_from(["act", "execute_sql", "commit_final_answer", "cd", "ls", "add",
                                           "find_patient", "book_appointment", "power", "code_interpreter"]),
             json_values),
    st.builds(lambda c: _tool_call("code_interpreter", {"code": c}), st.sampled_from([
        "while True: pass", "print('x' * 10**7)", "import os; os.fork()", "raise SystemExit(3)", "1/0",
        "import socket; socket.create_connection(('127.0.0.1', 1))", "open('/etc/passwd').read()", "\\boxed{1}",
    ])),
    st.builds(lambda d: "[" + "f(" * d + ")" * d + "]", st.integers(10, 3_000)),  # python-call nesting (bfcl)
)


@cache
def _tasks(env: str, options: tuple) -> list:
    spec = get_env_spec(env)
    split = "test" if "test" in spec.splits else spec.splits[0]
    return load_tasks(env, split, limit=3, **dict(options))


def _valid_replies(env, task) -> list[str]:
    """A few of the env's own actions (from its expert), so that fuzzed episodes run past their first turn."""
    env.reset(task)
    replies = []
    try:
        for _ in range(3):
            reply = env.expert_reply()
            replies.append(env.format.render(reply))
            if env.step(reply).done:
                break
    except Exception:  # an env without an expert for this state: hostile replies only
        pass
    return replies


def _episode_survives(name: str, options: dict, replies: list[str], pick: int) -> None:
    env = make_env(name, **options)
    try:
        task = _tasks(name, tuple(sorted(options.items())))[pick % 3]
        valid = _valid_replies(env, task)
        env.reset(task)
        messages = []
        for k, text in enumerate(replies):
            if valid and k % 2 == 1:
                text = valid[(k // 2) % len(valid)]
            result = env.step(env.format.parse(text))
            assert isinstance(result, StepResult) and all(isinstance(m, Message) for m in result.messages)
            messages += [Message("assistant", text), *result.messages]
            if result.done:
                break
        score = env.score()
        line = json.dumps({"messages": [m.to_dict() for m in messages], "details": score.details})
        line.encode("utf-8", "surrogatepass")  # what an episodes.jsonl line holds
    finally:
        env.close()


@pytest.mark.parametrize(("name", "options"), ENVS, ids=[f"{n}-{o.get('format', o.get('domain'))}" for n, o in ENVS])
@settings(max_examples=DEFAULT_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(replies=st.lists(hostile, min_size=1, max_size=6), pick=st.integers(0, 2))
def test_hostile_replies_are_observations_not_exceptions(name, options, replies, pick):
    if name == "bfcl":
        pytest.importorskip("bfcl_eval")
    _episode_survives(name, options, replies, pick)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), ENVS, ids=[f"{n}-{o.get('format', o.get('domain'))}" for n, o in ENVS])
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(replies=st.lists(hostile, min_size=1, max_size=6), pick=st.integers(0, 2))
def test_hostile_replies_slow(name, options, replies, pick):
    if name == "bfcl":
        pytest.importorskip("bfcl_eval")
    _episode_survives(name, options, replies, pick)
