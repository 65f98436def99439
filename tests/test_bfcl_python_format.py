"""bfcl_python: BFCL's `[func(a=1), g(b='x')]` prompting format (no bfcl-eval needed)."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.types import Message, ToolCall

FMT = get_format("bfcl_python")


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("[cd(folder='document'), mkdir(dir_name='temp')]",
         [ToolCall("cd", {"folder": "document"}), ToolCall("mkdir", {"dir_name": "temp"})]),
        ("cd(folder='x')", [ToolCall("cd", {"folder": "x"})]),  # BFCL adds the missing brackets
        ("```python\n[ls(a=True)]\n```", [ToolCall("ls", {"a": True})]),
        ("[f(x=-1.5, y=None, z=[1, 'a'], w={'k': 2})]", [ToolCall("f", {"x": -1.5, "y": None, "z": [1, "a"], "w": {"k": 2}})]),
        ("[math.add(a=1, b=2)]", [ToolCall("math.add", {"a": 1, "b": 2})]),
    ],
)  # fmt: skip
def test_parses_call_lists(text, calls):
    assert FMT.parse(text) == Message("assistant", "", tool_calls=calls)


@pytest.mark.parametrize("text", ["The file is moved.", "[]", "", "I moved it (as asked)."])
def test_text_without_calls_is_a_plain_answer_that_ends_the_turn(text):
    parsed = FMT.parse(text)
    assert isinstance(parsed, Message) and not parsed.tool_calls


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[cd(folder='x'", "not valid Python"),
        ("[cd('x')]", "positional"),
        ("[cd(folder=x)]", "not a literal"),
        ("[1, 2]", "not a function call"),
        ("[cd(folder=open('x').read())]", "not a literal"),
    ],
)
def test_malformed_call_lists_are_format_errors_that_say_why(text, reason):
    parsed = FMT.parse(text)
    assert isinstance(parsed, FormatError) and reason in parsed.reason
    assert "func_name1(param1=value1" in FMT.error_observation(parsed)


def test_render_is_bfcls_call_list():
    message = Message("assistant", "", tool_calls=[ToolCall("cd", {"folder": "a b"}), ToolCall("pwd", {})])
    assert FMT.render(message) == "[cd(folder='a b'), pwd()]"
    assert FMT.render(Message("assistant", "Done.")) == "Done."


def test_system_prompt_is_bfcls_with_the_function_list():
    docs = [{"name": "cd", "description": "Change directory.", "parameters": {}}]
    prompt = FMT.system_prompt(docs)
    assert "[func_name1(params_name1=params_value1" in prompt
    assert prompt.endswith("Here is a list of functions in JSON format that you can invoke.\n" + str(docs) + "\n")


_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_values = st.recursive(_json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=8)
_names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))
_calls = st.builds(ToolCall, _names, st.dictionaries(_names, _values, max_size=4))


@given(st.lists(_calls, min_size=1, max_size=4))
@settings(max_examples=200, deadline=None)
def test_round_trip(calls):
    message = Message("assistant", "", tool_calls=calls)
    assert FMT.parse(FMT.render(message)) == message


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_never_raises_on_arbitrary_text(text):
    assert isinstance(FMT.parse(text), Message | FormatError)


@given(st.text(alphabet="[](),='\"abc 0-.{}:", max_size=60))
@settings(max_examples=300, deadline=None)
def test_never_raises_on_call_like_text(text):
    assert isinstance(FMT.parse(text), Message | FormatError)
