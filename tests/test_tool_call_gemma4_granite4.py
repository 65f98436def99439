"""tool_call:gemma4 and tool_call:granite4 by hand: replies and what they parse to (nested, unicode, empty, quoted,
several calls, text around, cut off, bad input), Gemma 4's `render` against its chat templates, the round trip.
Agreement with vLLM's parsers is tests/test_vllm_tool_call_families.py. TRL ships no Granite template: Granite's
render is held against turnforge's rendition of it in tests/test_family_granite4.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnforge.formats import FormatError, get_format
from turnforge.formats.chat_template import trl_chat_template
from turnforge.types import Message, ToolCall

Q, S, E = '<|"|>', "<|tool_call>", "<tool_call|>"
TOOLS = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}, "action": {"type": "string"}, "order": {"type": "object"}}}}}]


def calls(*pairs: tuple[str, dict], content: str = "") -> Message:
    return Message("assistant", content, tool_calls=[ToolCall(name, args) for name, args in pairs])


# --- tool_call:gemma4 -------------------------------------------------------------------------------------------

gemma4 = get_format("tool_call:gemma4")


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        (f"{S}call:act{{action:{Q}look{Q},n:2}}{E}", calls(("act", {"action": "look", "n": 2})), []),
        # nested: objects, lists, true/null/float as written; a string holding `,` `}` `]` `:` stays whole
        (f"{S}call:act{{flags:[true,null,1.5],order:{{id:5,items:[{{qty:2,sku:{Q}a,b}}]:c{Q}}}]}}}}{E}",
         calls(("act", {"flags": [True, None, 1.5], "order": {"id": 5, "items": [{"qty": 2, "sku": "a,b}]:c"}]}})), []),
        (f"{S}call:act{{city:{Q}東京 Zoë 🙂{Q}}}{E}", calls(("act", {"city": "東京 Zoë 🙂"})), []),  # unicode
        (f"{S}call:pwd{{}}{E}", calls(("pwd", {})), []),  # empty
        (f'{S}call:act{{text:{Q}say "hi" \\ back{Q}}}{E}', calls(("act", {"text": 'say "hi" \\ back'})), []),  # quoted
        (f"{S}call:a{{n:1}}{E}{S}call:b{{x:{Q}{Q}}}{E}", calls(("a", {"n": 1}), ("b", {"x": ""})), []),  # several
        (f"{S}call:act{{n:1}}{E}Done.", calls(("act", {"n": 1}), content="Done."), []),  # the template's text: after
        (f"Let me look.\n{S}call:act{{n:1}}{E}\nDone.", calls(("act", {"n": 1}), content="Let me look.\nDone."),
         ["text before the first call (Gemma 4's template writes a reply's text after its calls)"]),
        (f"<|channel>thought\nhmm<channel|>{S}call:act{{n:4}}{E}", calls(("act", {"n": 4})), []),  # reasoning dropped
        (f"{S}:act{{n:3}}{E}", calls(("act", {"n": 3})), ["tool call 1 does not start with call:"]),
        (f"{S}call:act(n:3){E}", calls(("act", {"n": 3})), ["tool call 1 has no {...} around its arguments"]),
        (f"{S}call:a{{}}{E} and {S}call:b{{}}{E}", calls(("a", {}), ("b", {})),  # dropped, as vLLM drops it
         ["text between tool calls"]),
    ],
)
def test_gemma4_reads(text, expected, fixes):
    parsed = gemma4.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert gemma4.parse_strict(text) == expected if not fixes else isinstance(gemma4.parse_strict(text), FormatError)


def test_gemma4_types_by_the_tools_schemas_as_vllm_does():
    """With tools, a value is its property's type (vLLM's coercion): quoted "7" for an integer is 7, bare 5 for a
    string is "5"; a bare value no schema types is read as written (vLLM would pass "2" and "true" on as text)."""
    fmt = type(gemma4)(tools=TOOLS)
    text = f"{S}call:act{{n:{Q}7{Q},action:5,order:{{id:2,ok:true}},extra:null}}{E}"
    assert fmt.parse(text) == calls(("act", {"n": 7, "action": "5", "order": {"id": 2, "ok": True}, "extra": None}))
    assert gemma4.parse(text) == calls(("act", {"n": "7", "action": 5, "order": {"id": 2, "ok": True}, "extra": None}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I looked around.", "no <|tool_call> block"),
        (f"{S}call:act{{order:{{id:5", "cut off inside tool call 1"),  # vLLM reads act({"order": {}}) (known)
        (f"{S}call:a{{}}{E}{S}call:b{{n:1}}", "cut off inside tool call 2"),
        (f"{S}call:a{{n:1}}}}{S}call:b{{}}{E}", "not closed with <tool_call|> before the next <|tool_call>"),
        (f"{S}call:{{n:1}}{E}", "has no function name"),
        (f"{S}act{E}", "has no function name"),
    ],
)
def test_gemma4_refuses(text, reason):
    result = gemma4.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


GEMMA4_TEMPLATES = ["gemma4.jinja", "gemma4_v2.jinja", "gemma4_v3.jinja", "gemma4_v4.jinja", "gemma4_v5.jinja"]
TEMPLATE_MESSAGES = [
    calls(("act", {"action": "look", "n": 2})),
    calls(("find", {"q": 'say "hi" 東京', "Zeta": 1, "alpha": {"b": [1, False, True, 1.5, "x"], "A": {}}, "e": []})),
    calls(("pwd", {}), ("act", {"n": -3, "x": 1e-05, "big": 10**20})),
    calls(("act", {"n": 1}), content="Looking now."),
]


def template_text(template_name: str, message: Message) -> str:
    """What the Gemma 4 template writes for `message` after a user turn, less the prompt before it and the
    `<|tool_response>` (`<turn|>` in v2) after it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = trl_chat_template(template_name)
    user = {"role": "user", "content": "Go."}
    before, _ = render_jinja_template(conversations=[[user]], chat_template=template, add_generation_prompt=True,
                                      bos_token="<bos>")
    after, _ = render_jinja_template(conversations=[[user, message.to_dict()]], chat_template=template,
                                     bos_token="<bos>")
    assert after[0].startswith(before[0])
    return after[0][len(before[0]) :].removesuffix("<|tool_response>").removesuffix("<turn|>\n")


@pytest.mark.parametrize("template_name", GEMMA4_TEMPLATES)
def test_gemma4_render_is_what_gemma_4s_template_writes(template_name):
    for message in TEMPLATE_MESSAGES:
        written = template_text(template_name, message)
        assert gemma4.render(message) == written
        assert gemma4.parse(written) == message


def test_gemma4_null_is_v5s_null():
    """A null argument: v5 writes `null`, which reads back as None; the templates before it write Python's `None`,
    which neither vLLM nor turnforge reads back as null (it is the text "None"), so `render` writes v5's."""
    message = calls(("act", {"x": None, "y": [None]}))
    assert gemma4.render(message) == template_text("gemma4_v5.jinja", message) == f"{S}call:act{{x:null,y:[null]}}{E}"
    old = template_text("gemma4_v4.jinja", message)
    assert old == f"{S}call:act{{x:None,y:[None]}}{E}"
    assert gemma4.parse(old) == calls(("act", {"x": "None", "y": ["None"]}))


def test_gemma4_has_no_place_for_a_thought_nor_an_unquotable_string():
    assert gemma4.thoughts is False
    with pytest.raises(ValueError, match="no place for a thought"):
        gemma4.render(calls(("act", {})), thought="I look.")
    with pytest.raises(ValueError, match="no escape"):
        gemma4.render(calls(("act", {"x": f"a{Q}b"})))
    assert gemma4.render(Message("assistant", " Paris. ")) == "Paris."


TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12).filter(lambda s: Q not in s)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
                                                                inner, max_size=3),
    max_leaves=6,
)
NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(NAMES, st.dictionaries(NAMES, VALUES, max_size=4)), min_size=1, max_size=3))
def test_gemma4_round_trip_without_tools(pairs):
    """Without tools every value reads back as written: strings are quoted, the rest is typed by its text."""
    message = calls(*pairs)
    assert gemma4.parse_lenient(gemma4.render(message)) == type(gemma4.parse_lenient(""))(message, [])


# --- tool_call:granite4 -----------------------------------------------------------------------------------------

granite4 = get_format("tool_call:granite4")
OPEN, C = "<tool_call>", "</tool_call>"


@pytest.mark.parametrize(
    ("text", "expected", "fixes"),
    [
        (f'{OPEN}\n{{"name": "act", "arguments": {{"action": "look", "n": 2}}}}\n{C}', calls(("act", {"action": "look", "n": 2})),
         []),
        (f'{OPEN}{{"name": "act", "arguments": {{"order": {{"id": 5, "items": [{{"sku": "mug"}}]}}, "flags": [true, null]}}}}{C}',
         calls(("act", {"order": {"id": 5, "items": [{"sku": "mug"}]}, "flags": [True, None]})), []),  # nested
        (f'{OPEN}{{"name": "act", "arguments": {{"city": "東京", "e": "\\u00e9"}}}}{C}', calls(("act", {"city": "東京", "e": "é"})),
         []),  # unicode
        (f'{OPEN}{{"name": "pwd", "arguments": {{}}}}{C}', calls(("pwd", {})), []),  # empty
        (f'{OPEN}{{"name": "act", "arguments": {{"t": "say \\"hi\\" </tool_call"}}}}{C}', calls(("act", {"t": 'say "hi" </tool_call'})),
         []),  # quoted
        (f'I look.\n{OPEN}\n{{"name": "a", "arguments": {{}}}}\n{C}\n{OPEN}\n{{"name": "b", "arguments": {{}}}}\n{C}',
         calls(("a", {}), ("b", {}), content="I look."), []),  # several, text before: what the template writes
        (f'Hi {OPEN}{{"name": "a", "arguments": {{}}}}{C} done', calls(("a", {}), content="Hi  done"),
         ["text between or after the <tool_call> blocks"]),
        (f'{OPEN}{{"name": "a", "arguments": "{{\\"x\\": 1}}"}}{C}', calls(("a", {"x": 1})), ["arguments given as a JSON string"]),
        (f'{OPEN}{{"name": "a", "arguments": {{}}, "id": 3}}{C}', calls(("a", {})), ["extra keys in tool call 1"]),
    ],
)
def test_granite4_reads(text, expected, fixes):
    parsed = granite4.parse_lenient(text)
    assert (parsed.result, parsed.fixes) == (expected, fixes)
    assert granite4.parse_strict(text) == expected if not fixes else isinstance(granite4.parse_strict(text), FormatError)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("No call.", "no <tool_call> block"),
        (f'{OPEN}{{"name": "a", "arguments": {{"x": 1', "cut off"),  # vLLM reads none either (Hermes' lenient parse would)
        (f'{OPEN}{{"name": "a", "arguments": {{}}}}{C}{OPEN}{{"name": "b"', "cut off"),  # one bad block: no call at all
        (f'{OPEN}{OPEN}{{"name": "a", "arguments": {{}}}}{C}', "two <tool_call> in a row"),
        (f"{C}", "without a <tool_call> before it"),
        (f"{OPEN}{C}", "empty"),
        (f"{OPEN}{{'name': 'a', 'arguments': {{}}}}{C}", "not valid JSON"),  # Hermes' lenient parse reads it; vLLM not
        (f'{OPEN}```json\n{{"name": "a", "arguments": {{}}}}\n```{C}', "not valid JSON"),
        (f'{OPEN}{{"name": "a"}}{C}', 'a "name" string and "arguments"'),
        (f'{OPEN}{{"name": "a", "arguments": null}}{C}', '"arguments" must be a JSON object'),
        (f'{OPEN}{{"name": "a", "arguments": [1]}}{C}', '"arguments" must be a JSON object'),  # vLLM passes [1] on (known)
        (f'{OPEN}{{"name": "a", "arguments": "x"}}{C}', "the arguments string is not JSON"),
    ],
)
def test_granite4_refuses(text, reason):
    result = granite4.parse(text)
    assert isinstance(result, FormatError) and reason in result.reason


def test_granite4_writes_what_its_template_writes():
    """Granite 4.0's template: the content, then per call `\\n<tool_call>\\n{"name": "N", "arguments": tojson}\\n
    </tool_call>` (written out here; the template's own rendering: tests/test_family_granite4.py)."""
    message = calls(("act", {"q": "東京", "n": 1}), ("pwd", {}), content="I look.")
    assert granite4.render(message) == (
        'I look.\n<tool_call>\n{"name": "act", "arguments": {"q": "東京", "n": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>'
    )
    assert granite4.parse_strict(granite4.render(message)) == message
    tool = {"type": "function", "function": {"name": "act"}}
    assert granite4.system_prompt([tool]).endswith("notify the user that you do not have the ability to fulfill the "
                                                   "request.")
    assert '\n{"type": "function", "function": {"name": "act"}}\n</tools>' in granite4.system_prompt([tool])


@pytest.mark.parametrize("name", ["tool_call:gemma4", "tool_call:granite4"])
@settings(max_examples=200, deadline=None)
@given(text=st.sampled_from(["", S, f"{S}call:", OPEN, f"{OPEN}{{", Q]).flatmap(
    lambda start: st.text(max_size=80).map(lambda rest: start + rest)))
def test_parse_never_raises(name, text):
    fmt = get_format(name)
    for result in (fmt.parse(text), fmt.parse_strict(text), fmt.parse_lenient(text).result):
        assert isinstance(result, Message | FormatError)
