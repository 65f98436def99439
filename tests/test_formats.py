"""Formats: hand-written replies (valid, lenient, invalid), parse(render(m)) == m, and never raising."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnforge.formats import Format, FormatError, get_format, list_formats
from turnforge.formats.tool_call import ToolCallFormat
from turnforge.types import Message, ToolCall

FAST = settings(max_examples=200, deadline=None)

act_line = get_format("act_line")
react = get_format("react")
react_sql = get_format("react_sql")
tool_call = ToolCallFormat()


def assistant(content: str, **kw) -> Message:
    return Message(role="assistant", content=content, **kw)


# --- registry ---------------------------------------------------------------------------------------


def test_registry_lists_every_format_and_builds_it_under_its_name():
    assert list_formats() == ["act_line", "bfcl_python", "react", "react_sql", "tool_call", "tool_call:gemma4",
                              "tool_call:glm4", "tool_call:granite4", "tool_call:harmony", "tool_call:lfm2",
                              "tool_call:llama3", "tool_call:phi4_mini", "tool_call:qwen3_xml"]
    for name in list_formats():
        fmt = get_format(name)
        assert isinstance(fmt, Format)
        assert fmt.name == name


def test_unknown_format_names_the_choices():
    with pytest.raises(ValueError, match="unknown format 'json'.*act_line, bfcl_python, react, react_sql, tool_call"):
        get_format("json")


@pytest.mark.parametrize("name", ["act_line", "react", "react_sql", "tool_call"])
def test_prompts_and_error_observations_are_text(name):
    fmt = get_format(name)
    assert fmt.system_prompt().strip()
    observation = fmt.error_observation(FormatError(reason="no action", text="hello"))
    assert "no action" in observation


# --- act_line ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("ACTION: go to fridge 1", "go to fridge 1"),
        (
            "THOUGHT: the apple may be cold.\nIt is often in the fridge.\nACTION: open fridge 1",
            "open fridge 1",
        ),
        ("action:   take apple 1 from countertop 1  ", "take apple 1 from countertop 1"),
        ("Act: look", "look"),  # the seed's older tag
        ("Think: where?\nAct: inventory", "inventory"),
        ("**ACTION:** go to sinkbasin 1", "go to sinkbasin 1"),
        ("**ACTION**: go to sinkbasin 1", "go to sinkbasin 1"),
        ("ACTION: `heat egg 1 with microwave 1`", "heat egg 1 with microwave 1"),
        ('ACTION: "cool mug 1 with fridge 1"', "cool mug 1 with fridge 1"),
        ("ACTION: go to desk 1.", "go to desk 1."),  # the env compares commands exactly
        ("THOUGHT: done. ACTION: task succeeded", "task succeeded"),
        ("ACTION: ACTION: examine apple 1", "examine apple 1"),  # last tag on its line
        ("THOUGHT: the last action: go to x failed\nACTION: go to y", "go to y"),
        ("ACTION: go to a\nObservation: You arrive.\nACTION: go to b", "go to a"),
        ("THOUGHT: hmm\r\nACTION: look\r\n", "look"),
    ],
)
def test_act_line_parses(text, action):
    assert act_line.parse(text) == assistant(action)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no"),
        ("go to fridge 1", "no"),
        ("THOUGHT: I should go to the fridge.", "no"),
        ("REACTION: go to fridge 1", "no"),
        ("ACTION:", "no command"),
        ("ACTION:   ``  ", "no command"),
    ],
)
def test_act_line_rejects(text, reason):
    error = act_line.parse(text)
    assert isinstance(error, FormatError)
    assert reason in error.reason
    assert error.text == text
    assert "ACTION: <command>" in act_line.error_observation(error)


def test_a_thought_is_written_where_the_format_has_a_place_for_it_and_refused_where_not():
    """tool_call: the thought is the free text before the call (it parses back as the content); bfcl_python
    replies are the call list alone (a thought is a ValueError), and the plain-text wrapper says what its
    inner format says."""
    from turnforge.formats.plain_text import PlainTextEndsTurn

    tool_call = get_format("tool_call")
    call = Message("assistant", "", tool_calls=[ToolCall("act", {"action": "go to fridge 1"})])
    text = tool_call.render(call, thought="Apples are cold.")
    assert text == 'Apples are cold.\n<tool_call>\n{"name": "act", "arguments": {"action": "go to fridge 1"}}\n</tool_call>'
    assert tool_call.parse(text) == Message("assistant", "Apples are cold.", tool_calls=call.tool_calls)
    assert tool_call.render(call) == tool_call.render(call, thought=None)
    bfcl = get_format("bfcl_python")
    assert (tool_call.thoughts, bfcl.thoughts, PlainTextEndsTurn(tool_call).thoughts) == (True, False, True)
    with pytest.raises(ValueError, match="no place for a thought"):
        bfcl.render(call, thought="Cold.")
    assert PlainTextEndsTurn(tool_call).render(call, thought="Apples are cold.") == text


def test_act_line_renders_a_thought_for_scripted_policies():
    text = act_line.render(assistant("go to fridge 1"), thought="Apples are cold.")
    assert text == "THOUGHT: Apples are cold.\nACTION: go to fridge 1"
    assert act_line.parse(text) == assistant("go to fridge 1")


# --- react ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thought: check the fridge.\nAction: go to fridge 1", assistant("go to fridge 1")),
        ("Action: look", assistant("look")),
        ("Thought: obvious. Action: inventory", assistant("inventory")),  # one-line reply
        ("**Action:** open drawer 1", assistant("open drawer 1")),
        ("Thought 1: x\nAction 1: Search[Paris]", assistant("Search[Paris]")),
        (
            "Thought: count rows.\nAction: Operation\n```sql\nSELECT COUNT(*)\nFROM `t`;\n```\nDone.",
            assistant("SELECT COUNT(*)\nFROM `t`;"),
        ),
        ("Action: Operation\n```\nSELECT 1;\n```", assistant("SELECT 1;")),
        ("Action: Operation\n```sql\nSELECT 1;", assistant("SELECT 1;")),  # cut off before the fence
        (
            'Thought: I have it.\nAction: Answer\nFinal Answer: ["Women +60kg Bronze"]',
            assistant('["Women +60kg Bronze"]', name="final_answer"),
        ),
        ("Final Answer: 42", assistant("42", name="final_answer")),
        ("Thought: so. Final Answer: 42", assistant("42", name="final_answer")),
        ("Final Answer: line one\nline two", assistant("line one\nline two", name="final_answer")),
        ("Action: go to a\nObservation: You arrive.\nFinal Answer: x", assistant("go to a")),
        ("Final Answer: x\nObservation: nice\nAction: y", assistant("x", name="final_answer")),
    ],
)
def test_react_parses(text, expected):
    assert react.parse(text) == expected
    # react_sql agrees on answers and on ```sql blocks; it rejects what DBBench rejects (test_react_sql_...).
    if expected.name == "final_answer" or "```sql\n" in text and "\n```" in text.split("```sql\n", 1)[1]:
        assert react_sql.parse(text) == expected
    else:
        assert isinstance(react_sql.parse(text), FormatError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # DBBench runs the first ```sql block of the reply, even one written before the Action line.
        ("```sql\nSELECT 1;\n```\nAction: Operation\n```sql\nSELECT 2;\n```", "SELECT 1;"),
        ("Action: Operation\n```python\nx\n```\n```sql\nSELECT 2;\n```", "SELECT 2;"),
        ("Action: Operation\n```sql\nSELECT a\nFROM t;\n```", "SELECT a\nFROM t;"),  # the env joins lines
        ("Action: Operation\n```\nSELECT 1;\n```", 'closed ```sql'),
        ("Action: Operation\n```sql\nSELECT 1;", 'closed ```sql'),
        ("Action: Operation\n```SQL\nSELECT 1;\n```", 'closed ```sql'),
        ("Action: SELECT 1;", '"Operation"'),
    ],
)
def test_react_sql_follows_agentbench(text, expected):
    parsed = react_sql.parse(text)
    if isinstance(parsed, FormatError):
        assert expected in parsed.reason
    else:
        assert parsed == assistant(expected)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", 'no "Action:"'),
        ("Thought: I am thinking.", 'no "Action:"'),
        ("the next action: go", 'no "Action:"'),  # lower-case prose is not a tag
        ("Action:   ", "no action"),
        ("Action: Operation\nSELECT 1;", "code block"),
        ("Action: Operation\n```sql\n\n```", "empty"),
        ("Action: Answer", '"Final Answer:"'),
        ("Action: Answer\nFinal Answer:   ", "no answer"),
        ("Observation: Action: look", 'no "Action:"'),  # an imagined observation is dropped
    ],
)
def test_react_rejects(text, reason):
    error = react.parse(text)
    assert isinstance(error, FormatError)
    assert reason in error.reason
    assert error.text == text


def test_react_renders_agentbench_shapes():
    assert (
        react.render(assistant("go to fridge 1"), thought="Cold.") == "Thought: Cold.\nAction: go to fridge 1"
    )
    assert react.render(assistant("[1]", name="final_answer")) == "Action: Answer\nFinal Answer: [1]"
    assert react_sql.render(assistant("SELECT 1;")) == "Action: Operation\n```sql\nSELECT 1;\n```"
    # An action a bare line could not carry back is fenced instead.
    assert react.render(assistant("Operation")) == "Action: Operation\n```\nOperation\n```"
    assert react.parse(react.render(assistant("SELECT 1\nFROM t;"))) == assistant("SELECT 1\nFROM t;")


def test_react_sql_error_observation_asks_for_the_fence():
    error = react_sql.parse("SELECT 1;")
    assert isinstance(error, FormatError)
    assert "```sql" in react_sql.error_observation(error)


# --- tool_call --------------------------------------------------------------------------------------

WEATHER = ToolCall(name="get_weather", arguments={"city": "Paris"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            assistant("", tool_calls=[WEATHER]),
        ),
        (
            'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>',
            assistant("I will look.", tool_calls=[WEATHER, ToolCall("pwd", {})]),
        ),
    ],
)
def test_tool_call_parses_strictly_valid_replies(text, expected):
    assert tool_call.parse(text) == expected
    assert tool_call.parse_strict(text) == expected
    assert tool_call.parse_lenient(text).fixes == []


@pytest.mark.parametrize(
    ("text", "fix"),
    [
        (
            '<tool_call>\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n</tool_call>',
            "fence",
        ),
        (
            "<tool_call>\n{'name': 'get_weather', 'arguments': {'city': 'Paris'}}\n</tool_call>",
            "Python literal",
        ),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone!',
            "after the last",
        ),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "missing </tool_call>"),
        (
            '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
            "JSON string",
        ),
        ('<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>', '"parameters"'),
        (
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} ok</tool_call>',
            "after the JSON",
        ),
    ],
)
def test_tool_call_lenient_fixes_are_reported(text, fix):
    parsed = tool_call.parse_lenient(text)
    assert parsed.result == assistant("", tool_calls=[WEATHER])
    assert tool_call.parse(text) == parsed.result
    assert any(fix in f for f in parsed.fixes), parsed.fixes
    strict = tool_call.parse_strict(text)
    assert isinstance(strict, FormatError)
    assert fix in strict.reason


def test_tool_call_reads_json_names_inside_python_literals():
    text = "<tool_call>{'name': 'set', 'arguments': {'on': true, 'x': null, 'l': (1, 2)}}</tool_call>"
    assert tool_call.parse(text) == assistant(
        "", tool_calls=[ToolCall("set", {"on": True, "x": None, "l": [1, 2]})]
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Paris is sunny.", "no <tool_call> block"),
        ('<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>', "invalid JSON (Expecting ','"),
        ("<tool_call></tool_call>", "tool call 1 is empty"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name"'),
        ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object, got list"),
        ('<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', "arguments string is not JSON"),
        ('<tool_call>{"name": "f"}</tool_call><tool_call>[1]</tool_call>', "tool call 2"),
        ("<tool_call>{'name': 'f', 'arguments': {1, 2}}</tool_call>", "invalid JSON"),  # a set is no JSON
        ("<tool_call>{'name': __import__('os').getcwd()}</tool_call>", "invalid JSON"),  # never eval
    ],
)
def test_tool_call_rejects(text, reason):
    error = tool_call.parse(text)
    assert isinstance(error, FormatError)
    assert reason in error.reason
    assert error.text == text
    assert "<tool_call>" in tool_call.error_observation(error)


def test_tool_call_renders_like_the_qwen3_chat_template():
    message = assistant("Let me check.", tool_calls=[ToolCall("f", {"q": "café"}), ToolCall("g", {})])
    assert tool_call.render(message) == (
        'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"q": "café"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    assert tool_call.render(assistant("", tool_calls=[ToolCall("g", {})])).startswith("<tool_call>\n")


def test_tool_call_system_prompt_lists_the_tools():
    tool = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}},
    }
    prompt = tool_call.system_prompt([tool])
    assert '<tools>\n{"type": "function", "function": {"name": "f"' in prompt
    assert prompt.endswith(
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert "<tools>" not in tool_call.system_prompt()


# --- round trips ------------------------------------------------------------------------------------

_MARKUP = set("`'\"*\u201c\u201d\u2018\u2019")


def _no_tags(text: str) -> bool:
    # upper() and casefold() both, so look-alikes a case-insensitive regex folds (dotless i) are excluded.
    folded = (text.upper(), text.casefold().upper())
    tags = ("ACT", "ANSWER", "OPERATION", "OBSERVATION", "```")
    return not any(tag in form for tag in tags for form in folded)


# Single-line printable text that parsing leaves unchanged: stripped, no tag, not wrapped in markup.
actions = (
    st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40)
    .map(str.strip)
    .filter(lambda s: s and s[0] not in _MARKUP and s[-1] not in _MARKUP and _no_tags(s))
)


@FAST
@given(actions)
def test_act_line_round_trip(action):
    message = assistant(action)
    assert act_line.parse(act_line.render(message)) == message


@FAST
@given(actions, st.booleans(), st.sampled_from([react, react_sql]))
def test_react_round_trip(text, final, fmt):
    message = assistant(text, name="final_answer" if final else None)
    assert fmt.parse(fmt.render(message)) == message


names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True)
scalars = st.text(max_size=10) | st.integers() | st.booleans()
arguments = st.dictionaries(st.text(max_size=10), scalars | st.lists(scalars, max_size=3), max_size=4)
contents = st.text(max_size=30).map(str.strip).filter(lambda s: "<tool_call>" not in s)


@FAST
@given(contents, st.lists(st.builds(ToolCall, names, arguments), min_size=1, max_size=3))
def test_tool_call_round_trip(content, calls):
    message = assistant(content, tool_calls=calls)
    text = tool_call.render(message)
    assert tool_call.parse(text) == message
    assert tool_call.parse_strict(text) == message


# --- never raises -----------------------------------------------------------------------------------

FRAGMENTS = [
    *("ACTION:", "Act:", "THOUGHT:", "Think:", "**", "`", '"', "'", "go to x"),
    *("Action:", "Thought:", "Action: Operation", "Action: Answer", "Final Answer:", "Observation:"),
    *("```sql\n", "```", "<tool_call>", "</tool_call>", "{", "}", "[", "]", ":", ",", "true", "null", "1"),
    *('"name"', '"arguments"', "'name'", "\n", "\r\n", " "),
]
fragment_texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=5), max_size=25).map("".join)
ALL_FORMATS = [get_format(name) for name in list_formats()]


@FAST
@given(st.text() | fragment_texts)
def test_parse_never_raises(text):
    for fmt in ALL_FORMATS:
        result = fmt.parse(text)
        assert isinstance(result, Message | FormatError)
        if isinstance(result, FormatError):
            assert fmt.error_observation(result)
    assert isinstance(tool_call.parse_strict(text), Message | FormatError)
