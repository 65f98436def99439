"""The per-family tool-call formats (`tool_call:llama3`, ...): hand-written replies and what they parse to, the round
trip, equality with the family's chat template where it renders tool calls, strict vs lenient, and `parse` never
raising. Agreement with vLLM's parsers on generated replies is tests/test_vllm_tool_call_families.py."""

from __future__ import annotations

import json
import keyword

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from turnforge.formats import FormatError, get_format
from turnforge.formats.chat_template import trl_chat_template
from turnforge.types import Message, ToolCall

FAST = settings(max_examples=300, deadline=None)
FAMILY_FORMATS = ["tool_call:llama3", "tool_call:lfm2", "tool_call:glm4", "tool_call:phi4_mini", "tool_call:qwen3_xml"]
TYPED_FORMATS = ["tool_call:llama3", "tool_call:lfm2", "tool_call:phi4_mini"]
"""Formats whose text carries each value's type (GLM-4's and Qwen3.5's are read by the tools' schemas: their own round
trips below)."""


def calls(*pairs: tuple[str, dict]) -> Message:
    return Message("assistant", "", tool_calls=[ToolCall(name, args) for name, args in pairs])


def template_text(template: str, message: Message, **kwargs) -> str:
    """What the chat template writes for `message` after a user turn, less the prompt before it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    user = {"role": "user", "content": "Go."}
    before, _ = render_jinja_template(conversations=[[user]], chat_template=template, add_generation_prompt=True,
                                      **kwargs)
    after, _ = render_jinja_template(conversations=[[user, message.to_dict()]], chat_template=template, **kwargs)
    assert after[0].startswith(before[0])
    return after[0][len(before[0]):]


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)  # a model writes no lone surrogates
ARGUMENT_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)
# Python keywords are no names: LFM2's call list needs `from=` repaired (a lenient fix) and `if(...)` cannot be read
IDENTIFIERS = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda name: not keyword.iskeyword(name))
ARGUMENTS = st.dictionaries(IDENTIFIERS, ARGUMENT_VALUES, max_size=4)
TOOL_NAMES = IDENTIFIERS


@pytest.mark.parametrize("name", FAMILY_FORMATS)
@FAST
@given(text=st.text(max_size=200) | st.sampled_from(["{", "[", "<|tool_call_start|>[", "functools[", "<tool_call>",
                                                       "<tool_call>\n<function=act>\n<parameter="])
          .flatmap(lambda start: st.text(max_size=120).map(lambda rest: start + rest)))
def test_parse_never_raises(name, text):
    fmt = get_format(name)
    for result in (fmt.parse(text), fmt.parse_strict(text), fmt.parse_lenient(text).result):
        assert isinstance(result, Message | FormatError)


@pytest.mark.parametrize("name", TYPED_FORMATS)
@FAST
@given(pairs=st.lists(st.tuples(TOOL_NAMES, ARGUMENTS), min_size=1, max_size=3))
def test_round_trip(name, pairs):
    fmt = get_format(name)
    message = calls(*pairs)
    text = fmt.render(message)
    assert fmt.parse(text) == message
    assert fmt.parse_lenient(text).fixes == []
    assert fmt.parse_strict(text) == message


@pytest.mark.parametrize("name", FAMILY_FORMATS)
def test_registered_with_its_name_and_marker(name):
    fmt = get_format(name)
    assert fmt.name == name and fmt.uses_tools
    assert fmt.call_marker in fmt.render(calls(("act", {"action": "look"})))
    assert "Invalid tool call" in fmt.error_observation(FormatError("bad", "x"))


# --- tool_call:llama3 -------------------------------------------------------------------------------------------

llama3 = get_format("tool_call:llama3")
LOOK = ("act", {"action": "look", "n": 2})


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        ('{"name": "act", "parameters": {"action": "look", "n": 2}}', calls(LOOK), []),
        ('<|python_tag|>{"name": "act", "parameters": {"action": "look", "n": 2}}', calls(LOOK), []),
        ('{"name": "act", "parameters": {}}; {"name": "pwd", "parameters": {"x": [1, {"y": "}"}]}}',
         calls(("act", {}), ("pwd", {"x": [1, {"y": "}"}]})), []),
        ('{"name": "act", "arguments": {"action": "look", "n": 2}}', calls(LOOK), ['"arguments" instead of "parameters"']),
        ('I will look.\n{"name": "act", "parameters": {"action": "look", "n": 2}}\nDone.', calls(LOOK),
         ["text before the call", "text after the call"]),
        ('{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {}}', calls(("a", {}), ("b", {})),
         ["calls separated by something other than '; '"]),
        ('{"name": "act", "parameters": {}, "id": 1}', calls(("act", {})), ["extra keys in tool call 1"]),
    ],
)
def test_llama3_reads(text, expected, fixes):
    parsed = llama3.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert llama3.parse_strict(text) == expected if not fixes else isinstance(llama3.parse_strict(text), FormatError)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I looked around.", "no tool call"),
        ('Use {braces} then {"name": "act", "parameters": {}}', "not valid JSON"),  # vLLM reads no call either
        ('{"name": "act", "parameters": {}}; {"name": "b", "param', "not valid JSON"),  # cut off: none, as vLLM
        ('{"action": "look"}', 'no "name"'),
        ('{"name": "act"}', 'no "parameters"'),
        ('{"name": 3, "parameters": {}}', '"name" must be a string'),
        ('{"name": "act", "parameters": "look"}', "must be a JSON object"),  # vLLM passes "look" on (known)
    ],
)
def test_llama3_refuses(text, reason):
    result = llama3.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


def test_llama3_render_is_what_llama_3_2s_template_writes():
    template = trl_chat_template("llama3_2.jinja")
    for message in (calls(LOOK), calls(("find", {"q": 'say "hi" 東京', "nested": {"a": [1, None, True, 1.5]}})),
                    calls(("pwd", {}))):
        assert llama3.render(message) == template_text(template, message, bos_token="").removesuffix("<|eot_id|>")
    assert llama3.render(calls(LOOK)) == '{"name": "act", "parameters": {"action": "look", "n": 2}}'
    assert llama3.render(Message("assistant", " Paris. ")) == "Paris."


def test_llama3_has_no_place_for_text_beside_a_call():
    assert llama3.thoughts is False
    with pytest.raises(ValueError, match="no place for a thought"):
        llama3.render(calls(LOOK), thought="I look.")
    with pytest.raises(ValueError, match="text beside tool calls"):
        llama3.render(Message("assistant", "I look.", tool_calls=calls(LOOK).tool_calls))


def test_llama3_system_prompt_is_the_templates_tool_section():
    tool = {"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}
    template = trl_chat_template("llama3_2.jinja")
    from transformers.utils.chat_template_utils import render_jinja_template

    text, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Go."}]], tools=[tool],
                                    chat_template=template, bos_token="", date_string="1 Jan 2025")
    assert llama3.system_prompt([tool]) + "Go.<|eot_id|>" in text[0]
    assert llama3.system_prompt().startswith("Given the following functions")


# --- tool_call:lfm2 ---------------------------------------------------------------------------------------------

lfm2 = get_format("tool_call:lfm2")
S, E = "<|tool_call_start|>", "<|tool_call_end|>"


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        (f'{S}[act(action="look", n=2)]{E}', calls(LOOK), []),
        (f'{S}[get_status(candidate_id="12345")]{E}Checking it now.',  # the model card's reply
         Message("assistant", "Checking it now.", tool_calls=[ToolCall("get_status", {"candidate_id": "12345"})]), []),
        (f"I look.\n{S}[a(x=[1, (2, 3)], y={{'k': None}}, z=true), b.c()]{E}\nDone.",
         Message("assistant", "I look.\nDone.", tool_calls=[ToolCall("a", {"x": [1, [2, 3]], "y": {"k": None}, "z": True}),
                                                          ToolCall("b.c", {})]), []),
        (f"{S}[act(n=-4, s=f'x')]{E}", calls(("act", {"n": -4, "s": "x"})), []),
        (f"{S}[act(n=2)]", calls(("act", {"n": 2})), [f"missing {E} at the end"]),
        (f'{S}[act(text="a\nb")]{E}', calls(("act", {"text": "a\nb"})),
         ["raw control characters or zero-padded integers repaired"]),
        (f"{S}[act(month=07)]{E}", calls(("act", {"month": 7})),
         ["raw control characters or zero-padded integers repaired"]),
        (f"{S}[get(from=1)]{E}", calls(("get", {"from": 1})), ["a parameter named by a Python keyword"]),
        (f"{S}[act(n=1)]{E} and {S}[act(n=2)]{E} ok", Message("assistant", "ok", tool_calls=[ToolCall("act", {"n": 1})]),
         [f"a second {S} block or an echoed call after {E} (ignored, as vLLM does)"]),
    ],
)
def test_lfm2_reads(text, expected, fixes):
    parsed = lfm2.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert lfm2.parse_strict(text) == expected if not fixes else isinstance(lfm2.parse_strict(text), FormatError)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[act(n=1)]", "no <|tool_call_start|> block"),
        (f"{S}act(n=1){E}", "not one [...] list"),
        (f"{S}[]{E}", "non-empty"),
        (f"{S}[act(n=1), 2]{E}", "non-empty [...] list of function calls"),
        (f"{S}[act(n=look)]{E}", "not a literal"),
        (f"{S}[act(1)]{E}", "positional"),  # vLLM drops the 1 and calls act() (known disagreement)
        (f"{S}[act(n=1]{E}", "not valid Python"),
    ],
)
def test_lfm2_refuses(text, reason):
    result = lfm2.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


def test_lfm2_render_writes_a_thought_and_the_content_before_the_calls():
    text = lfm2.render(Message("assistant", "Checking.", tool_calls=calls(LOOK).tool_calls), thought="I look.")
    assert text == f'I look.\nChecking.\n{S}[act(action="look", n=2)]{E}'
    assert lfm2.parse(text) == Message("assistant", "I look.\nChecking.", tool_calls=calls(LOOK).tool_calls)
    assert lfm2.thoughts is True


def test_lfm2_system_prompt_is_the_templates_tool_list():
    from transformers.utils.chat_template_utils import render_jinja_template

    tool = {"type": "function", "function": {"name": "act", "description": "Ünïcode", "parameters": {"type": "object"}}}
    text, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Go."}]], tools=[tool, tool],
                                    chat_template=trl_chat_template("lfm2.jinja"), bos_token="")
    assert f"<|im_start|>system\n{lfm2.system_prompt([tool, tool])}<|im_end|>" in text[0]
    assert S in lfm2.system_prompt()


# --- tool_call:glm4 ---------------------------------------------------------------------------------------------

ACT = {"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {
    "action": {"type": "string"}, "n": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
    "o": {"type": "object"}, "l": {"type": ["array", "null"]}, "e": {"enum": [1, 2]}}}}}
glm4 = get_format("tool_call:glm4")
glm4_typed = type(glm4)(tools=[ACT])


def glm_block(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>{name}\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in pairs) \
        + "</tool_call>"


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        (glm_block("act", ("action", "look"), ("n", "2")), calls(("act", {"action": "look", "n": 2})), []),
        (glm_block("act", ("action", "2"), ("x", "1.5"), ("ok", "true"), ("o", '{"a": [1]}'), ("l", "null"),
                   ("e", "2"), ("free", "[1]")),
         calls(("act", {"action": "2", "x": 1.5, "ok": True, "o": {"a": [1]}, "l": None, "e": 2, "free": "[1]"})), []),
        ("I will look.\n" + glm_block("act") + "\n" + glm_block("act", ("n", "x")),
         Message("assistant", "I will look.", tool_calls=[ToolCall("act", {}), ToolCall("act", {"n": "x"})]), []),
        (glm_block("act") + "\n" + glm_block("nosuch"), calls(("act", {})), ["calls of unknown tools dropped ('nosuch')"]),
        (glm_block("act") + " Done.", calls(("act", {})), ["text after the last </tool_call>"]),
    ],
)
def test_glm4_reads_values_by_the_tools_schemas(text, expected, fixes):
    parsed = glm4_typed.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert glm4_typed.parse_strict(text) == expected if not fixes else isinstance(glm4_typed.parse_strict(text),
                                                                                   FormatError)


def test_glm4_without_tools_reads_every_value_as_a_string():
    assert glm4.parse(glm_block("zz", ("n", "2"))) == calls(("zz", {"n": "2"}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I looked.", "no <tool_call> block"),
        (glm_block("act") + "\n<tool_call>act\n<arg_key>n</arg_key>\n<arg_value>3", "cut off"),  # vLLM: a call (known)
        ("<tool_call>\n</tool_call>", "no function name"),
        (glm_block("nosuch"), "not one of the tools"),
    ],
)
def test_glm4_refuses(text, reason):
    result = glm4_typed.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


STRING_ARGUMENTS = st.dictionaries(IDENTIFIERS, TEXT.filter(lambda v: "</arg_value>" not in v), max_size=4)


@FAST
@given(pairs=st.lists(st.tuples(TOOL_NAMES, STRING_ARGUMENTS), min_size=1, max_size=3))
def test_glm4_round_trip_of_string_values(pairs):
    message = calls(*pairs)
    assert glm4.parse(glm4.render(message)) == message


def test_glm4_round_trip_of_typed_values_and_template_equality():
    template = trl_chat_template("glm4moe.jinja")
    message = Message("assistant", "I will look.", tool_calls=[
        ToolCall("act", {"action": "say \"hi\" 東京", "n": 2, "x": 1.5, "ok": False, "o": {"a": [1, None]}, "l": [1]}),
        ToolCall("act", {})])
    assert glm4_typed.parse(glm4_typed.render(message)) == message
    assert template_text(template, message) == "\n<think></think>\n" + glm4.render(message)
    assert template_text(template, calls(("act", {"n": 2}))) == "\n<think></think>\n" + glm4.render(
        calls(("act", {"n": 2})))
    thought = glm4.render(calls(("act", {})), thought="I look.")
    assert glm4.parse(thought) == Message("assistant", "I look.", tool_calls=[ToolCall("act", {})])


def test_glm4_system_prompt_is_the_templates_tool_section():
    from transformers.utils.chat_template_utils import render_jinja_template

    text, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Go."}]], tools=[ACT, ACT],
                                    chat_template=trl_chat_template("glm4moe.jinja"))
    assert "<|system|>\n" + glm4.system_prompt([ACT, ACT]) + "<|user|>" in text[0]


# --- tool_call:phi4_mini ----------------------------------------------------------------------------------------

phi4 = get_format("tool_call:phi4_mini")


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        ('functools[{"name": "act", "arguments": {"action": "look", "n": 2}}]', calls(LOOK), []),
        ('functools[{"name": "a", "arguments": {"x": [1, "]"]}}, {"name": "b", "arguments": {}}]',  # vLLM: none (known)
         calls(("a", {"x": [1, "]"]}), ("b", {})), []),
        ('I look.\nfunctools[{"name": "act", "parameters": {"action": "look", "n": 2}}] ok', calls(LOOK),
         ['"parameters" instead of "arguments"', "text before functools", "text after the functools list"]),
    ],
)
def test_phi4_mini_reads(text, expected, fixes):
    parsed = phi4.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert phi4.parse_strict(text) == expected if not fixes else isinstance(phi4.parse_strict(text), FormatError)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("I looked.", "no functools["), ("functools[]", "empty"), ('functools[{"name": "a"}]', 'no "arguments"'),
     ('functools[{"name": "a", "arguments": {"x": 1}', "not valid JSON"), ("functools[1]", '"name" string'),
     ('functools[{"name": "a", "arguments": [1]}]', "must be a JSON object")],
)
def test_phi4_mini_refuses(text, reason):
    result = phi4.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


def test_phi4_mini_has_no_place_for_text_beside_a_call():
    assert phi4.thoughts is False
    with pytest.raises(ValueError, match="no place for a thought"):
        phi4.render(calls(LOOK), thought="I look.")
    assert phi4.render(calls(LOOK)) == 'functools[{"name": "act", "arguments": {"action": "look", "n": 2}}]'


# --- tool_call:qwen3_xml ----------------------------------------------------------------------------------------

qwen3_xml = get_format("tool_call:qwen3_xml")
qwen3_xml_typed = type(qwen3_xml)(tools=[ACT])


def xml_block(name: str, *pairs: tuple[str, str]) -> str:
    return f"<tool_call>\n<function={name}>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in pairs) \
        + "</function>\n</tool_call>"


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        (xml_block("act", ("action", "look"), ("n", "2")), calls(("act", {"action": "look", "n": 2})), []),
        (xml_block("act", ("action", "2"), ("x", "1.5"), ("ok", "True"), ("o", '{"a": [1]}'), ("l", "null"),
                   ("e", "2"), ("free", "[1]"), ("n", "two")),
         calls(("act", {"action": "2", "x": 1.5, "ok": True, "o": {"a": [1]}, "l": None, "e": 2, "free": "[1]",
                        "n": "two"})), []),
        ("I will look.\n\n" + xml_block("act") + "\n" + xml_block("nosuch", ("n", "2")),  # vLLM keeps unknown tools
         Message("assistant", "I will look.", tool_calls=[ToolCall("act", {}), ToolCall("nosuch", {"n": "2"})]), []),
        (xml_block("act", ("action", "\n\nx\n\n"), ("action", "a > b </tool_call>")),  # one newline off; last wins
         calls(("act", {"action": "a > b </tool_call>"})), []),
        ("<tool_call>\n<function= act >\n<parameter= n >\n3\n</parameter>\n</function>\n</tool_call>",
         calls(("act", {"n ": "3"})), []),  # a name is stripped, a parameter's name is not (vLLM's regex)
        (xml_block("act") + " Done.", calls(("act", {})), ["text after the last </tool_call>"]),
        ("<function=act>\n<parameter=n>\n3\n</parameter>\n</function>", calls(("act", {"n": 3})),
         ["<function= without <tool_call>"]),
        ("<tool_call>\n<function=act>\n</function>\n<tool_call>\n<function=act>\n</function>",
         calls(("act", {}), ("act", {})), ["missing </tool_call>"]),
        ("<tool_call>\n<function=act>\n<parameter=n>\n3\n<parameter=action>\nlook\n</parameter>\n</function>\n</tool_call>",
         calls(("act", {"n": 3, "action": "look"})), ["a parameter of tool call 1 has no </parameter>"]),
        ("<tool_call>\n<function=act>\n<parameter=n>\n3\n</function>\n</tool_call>",  # vLLM drops n (known)
         calls(("act", {"n": 3})), ["a parameter of tool call 1 has no </parameter>"]),
        ("<tool_call>\njunk<function=act>\nstray<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
         calls(("act", {"n": 3})),
         ["text inside <tool_call> outside the function of tool call 1", "text between the parameters of tool call 1"]),
        (xml_block("act") + "\nand\n" + xml_block("act"), calls(("act", {}), ("act", {})), ["text between tool calls"]),
    ],
)
def test_qwen3_xml_reads_values_by_the_tools_schemas(text, expected, fixes):
    parsed = qwen3_xml_typed.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert qwen3_xml_typed.parse_strict(text) == expected if not fixes else isinstance(
        qwen3_xml_typed.parse_strict(text), FormatError)


def test_qwen3_xml_without_tools_reads_every_value_as_a_string_and_bind_tools_sets_them():
    fmt = type(qwen3_xml)()
    text = xml_block("act", ("n", "2"), ("o", "{}"))
    assert fmt.parse(text) == calls(("act", {"n": "2", "o": "{}"}))
    fmt.bind_tools([ACT])
    assert fmt.parse(text) == calls(("act", {"n": 2, "o": {}}))
    fmt.bind_tools(None)
    assert fmt.parse(text) == calls(("act", {"n": "2", "o": "{}"}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I looked.", "no <function="),
        ("<tool_call>\n<function=act>\n<parameter=n>\n3", "cut off inside tool call 1"),  # vLLM: act({}) (known)
        ("<tool_call>\n<function=tra", "cut off inside tool call 1"),  # vLLM: tra({}) (known)
        (xml_block("act") + "\n<tool_call>\n", "tool call 2 has no <function=name>"),  # vLLM: act({}) (known)
        ('<tool_call>\n{"name": "act", "arguments": {}}\n</tool_call>', "tool call 1 has no <function=name>"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "no function name"),
    ],
)
def test_qwen3_xml_refuses(text, reason):
    result = qwen3_xml_typed.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


def _schema(value) -> dict:
    kinds = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (dict, "object"), (list, "array"))
    return {"type": next(name for kind, name in kinds if isinstance(value, kind))}


def _tools_typing(message: Message) -> list[dict]:
    """One tool per call whose schema types each of its values."""
    return [{"type": "function", "function": {"name": call.name, "parameters": {
        "type": "object", "properties": {key: _schema(value) for key, value in call.arguments.items()}}}}
        for call in message.tool_calls]


_XML_TAGS = ("parameter", "</function>")  # a value holding a tag would end its parameter or its call


@FAST
@given(pairs=st.lists(st.tuples(TOOL_NAMES, st.dictionaries(IDENTIFIERS, ARGUMENT_VALUES.filter(lambda v: v is not None),
                                                           max_size=4)), min_size=1, max_size=3, unique_by=lambda p: p[0]))
def test_qwen3_xml_round_trip_of_values_typed_by_the_tools(pairs):
    """Every value but a top-level None (the template writes `None`, read as that string, as vLLM reads it)."""
    message = calls(*pairs)
    assume(not any(tag in json.dumps(call.arguments, ensure_ascii=False) for call in message.tool_calls
                   for tag in _XML_TAGS))
    text = qwen3_xml.render(message)
    fmt = type(qwen3_xml)(tools=_tools_typing(message))
    assert fmt.parse(text) == message
    assert fmt.parse_lenient(text).fixes == []
    assert fmt.parse_strict(text) == message


def test_qwen3_xml_render_is_what_qwen3_5s_template_writes():
    template = trl_chat_template("qwen3_5_think.jinja")
    message = Message("assistant", "I will look.", tool_calls=[
        ToolCall("act", {"action": "say \"hi\"\n東京", "n": 2, "x": 1.5, "ok": False, "o": {"a": [1, None]}, "l": [1]}),
        ToolCall("act", {})])
    think = "\n</think>\n\n"  # the template's think block for the turn after the last user message
    assert template_text(template, message) == think + qwen3_xml.render(message) + "<|im_end|>\n"
    assert template_text(template, calls(("act", {"n": 2}))) == think + qwen3_xml.render(calls(("act", {"n": 2}))) \
        + "<|im_end|>\n"
    assert qwen3_xml_typed.parse(qwen3_xml.render(message)) == message
    thought = qwen3_xml.render(calls(("act", {})), thought="I look.")
    assert qwen3_xml.parse(thought) == Message("assistant", "I look.", tool_calls=[ToolCall("act", {})])


def test_qwen3_xml_reads_qwen3_6s_json_scalars():
    """Qwen3.6's template writes every non-string value as JSON (`true`, `null`): read alike, a null included."""
    template = trl_chat_template("qwen3_6.jinja")
    message = calls(("act", {"ok": True, "l": None, "n": 3, "action": "look"}))
    written = template_text(template, message)
    assert "<parameter=ok>\ntrue\n" in written and "<parameter=l>\nnull\n" in written
    calls_written = written[written.index("<tool_call>") :].removesuffix("<|im_end|>\n")
    assert qwen3_xml_typed.parse(calls_written) == message


def test_qwen3_xml_system_prompt_is_the_templates_tool_section():
    from transformers.utils.chat_template_utils import render_jinja_template

    text, _ = render_jinja_template(conversations=[[{"role": "user", "content": "Go."}]], tools=[ACT, ACT],
                                    chat_template=trl_chat_template("qwen3_5_think.jinja"))
    assert "<|im_start|>system\n" + qwen3_xml.system_prompt([ACT, ACT]) + "<|im_end|>" in text[0]
    assert qwen3_xml.system_prompt().startswith("If you choose to call a function")
