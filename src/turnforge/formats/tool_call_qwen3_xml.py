"""tool_call:qwen3_xml: Qwen3.5 / Qwen3-Coder `<tool_call>` blocks, a `<function=name>` with `<parameter=key>` values.

    I will look.

    <tool_call>
    <function=act>
    <parameter=action>
    look
    </parameter>
    <parameter=n>
    2
    </parameter>
    </function>
    </tool_call>

This is what Qwen3.5's chat template (trl/chat_templates/qwen3_5_think.jinja; Qwen3-Coder's writes calls alike) writes
for an assistant message with `tool_calls`: the content, a blank line, then the calls one per line; a string value as
it is, a dict or list as JSON, any other value as Python's `str` (`True`, `None`, `1.5`). It parses to
`Message("assistant", "I will look.", tool_calls=[ToolCall("act", {"action": "look", "n": 2})])` — given the tools.

A value's type is not in the text, so, as vLLM's parser (`vllm serve --tool-call-parser qwen3_xml`, or `qwen3_coder`:
both `Qwen3EngineToolParser`, vllm/parser/qwen3.py) does, values are read by the tools' JSON schemas, as the GLM-4
format reads them (`tool_call_glm4`): an `integer` property's "2" is 2, a `boolean`'s "True" is True, an
`object`/`array`'s text is JSON, a `string`'s stays as written; a value whose property has no schema, or any value
without tools, stays a string. The tools come from the constructor or `bind_tools` (the rollout binds each episode's
after its reset). A top-level `None` does not come back: the template writes it `None`, which no schema type reads
(vLLM's `null` wants `null`), so it parses as the string "None". Unlike GLM-4's parser, vLLM keeps a call of a
function not among the tools, and so does turnforge (the env answers it).

`parse` reads what vLLM's engine reads (held against it reply by reply in benchmarks/tool_call_parsers.py), walking
the same states over the same tags: `<tool_call>`, then `<function=`, the name up to `>`, the parameters up to
`</function>`, then `</tool_call>`. A name is stripped; a parameter's name is not, its value loses one newline at each
end. Fixes (`parse_lenient`): a `<function=` without `<tool_call>`, a missing `</tool_call>` after `</function>`, a
`<parameter=` without `</parameter>` (the value runs to the next tag), text outside the parameters, between the calls
or after them. The content is the text before the first call.

Known disagreements, where vLLM's reading is wrong for an env: a reply cut off inside a call (no `</function>`, as
when generation hits max_tokens) or right after a `<tool_call>` is a FormatError here; vLLM reads the unfinished call,
even with a half-written name (`transf({})`), with the parameters closed so far. A `<tool_call>` block without a
`<function=` in it (a Hermes JSON call) or a call with no name is a FormatError; vLLM skips it and reads the others.
The last parameter of a call written without its `</parameter>` is read here (a fix); vLLM drops it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.schema_values import SchemaTyped, tool_properties, typed_value
from turnforge.formats.tool_call import LenientParsing, ToolCallParse, tools_section
from turnforge.types import Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"

# vLLM's lexer tags (vllm/parser/qwen3.py, qwen3_config), leftmost first: a `>` inside a longer tag is that tag's.
_TAGS = re.compile("|".join(re.escape(tag) for tag in (
    "<think>", "</think>", OPEN, CLOSE, FUNCTION, FUNCTION_END, "<parameter=", "</parameter>", ">")))
# vLLM's `_PARAM_RE`: a parameter ends at `</parameter>` or where the next one starts.
_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:(?P<close><\s*/\s*parameter\s*>)|(?=<\s*parameter\s*=))",
                        re.S)
_OPEN_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]+)>(.*)\Z", re.S)

# Qwen3.5's chat template, tool section, verbatim (trl/chat_templates/qwen3_5_think.jinja).
_TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
_CALL_INSTRUCTIONS = (
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
)


class _State(Enum):
    """vLLM's engine states (ParserState) between the tags."""

    content = "content"  # free text
    preamble = "preamble"  # after <tool_call>, before <function=
    name = "name"  # after <function=, before >
    parameters = "parameters"  # after >, before </function>
    between = "between"  # after </function>, before </tool_call>


@dataclass
class _Call:
    """One call as the tags delimit it, before its values are read."""

    start: int
    wrapped: bool
    """Opened by `<tool_call>` (vLLM also reads a bare `<function=`)."""
    name: str = ""
    body: str = ""
    has_function: bool = False
    finished: bool = False
    """Its `</function>` came."""
    closed: bool = False
    """Its `</tool_call>` came."""
    stray: str = ""
    """Text inside `<tool_call>` outside the function: vLLM drops it."""
    after: str = ""
    """Free text after it, up to the next call."""


def _scan(text: str) -> list[_Call]:
    """The calls in `text`, delimited by vLLM's state machine over its tags."""
    calls: list[_Call] = []
    state, position = _State.content, 0
    for match in [*_TAGS.finditer(text), None]:
        _add_text(state, calls, text[position : match.start() if match else len(text)])
        if match is None:
            return calls
        position = match.end()
        state = _step(state, match.group(), calls, match.start())
    return calls


def _add_text(state: _State, calls: list[_Call], chunk: str) -> None:
    if not chunk or not calls:
        return
    if state is _State.name:
        calls[-1].name += chunk
    elif state is _State.parameters:
        calls[-1].body += chunk
    elif state is _State.content:
        calls[-1].after += chunk
    else:
        calls[-1].stray += chunk


def _step(state: _State, tag: str, calls: list[_Call], start: int) -> _State:
    """The state after `tag`; a tag with no transition in `state` is text there, as in vLLM."""
    if state in (_State.content, _State.between) and tag in (OPEN, FUNCTION):
        calls.append(_Call(start, wrapped=tag == OPEN, has_function=tag == FUNCTION))
        return _State.preamble if tag == OPEN else _State.name
    if state is _State.preamble and tag == FUNCTION:
        calls[-1].has_function = True
        return _State.name
    if state is _State.name and tag == ">":
        return _State.parameters
    if state in (_State.name, _State.parameters) and tag == FUNCTION_END:
        calls[-1].finished = True
        return _State.between
    if state in (_State.preamble, _State.between) and tag == CLOSE:
        calls[-1].closed = True
        return _State.content
    _add_text(state, calls, tag)
    return state


def _parameters(body: str, fixes: list[str], where: str) -> dict[str, str]:
    """A call's `<parameter=name>value</parameter>`s as vLLM's `_qwen3_arg_converter` reads them (but the last
    unclosed one, which vLLM drops), each value less one newline at each end."""
    values: dict[str, str] = {}
    unclosed = False
    for match in _PARAMETER.finditer(body):
        values[match.group(1)] = _trim_newlines(match.group(2))
        unclosed = unclosed or not match.group("close")
    rest = _PARAMETER.sub("", body)
    last = _OPEN_PARAMETER.search(rest)
    if last:
        values[last.group(1)] = _trim_newlines(last.group(2))
        unclosed, rest = True, rest[: last.start()]
    if unclosed:
        fixes.append(f"a parameter of {where} has no </parameter>")
    if rest.strip():
        fixes.append(f"text between the parameters of {where}")
    return values


def _trim_newlines(value: str) -> str:
    """One newline off each end: the template writes `<parameter=k>\\nvalue\\n</parameter>`."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _written(value: Any) -> str:
    """A value as the template writes it: a dict or list as JSON, a string as it is, anything else as `str`."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)


class Qwen3XmlToolCallFormat(SchemaTyped, LenientParsing, ToolActions):
    """Free text, then `<tool_call><function=name><parameter=k>v</parameter></function></tool_call>` blocks."""

    name = "tool_call:qwen3_xml"
    call_marker = FUNCTION  # every call vLLM reads has it (a bare one too); text without it holds no call attempt

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """Qwen3.5's own tool section when `tools` are given (its template's words), else just the call format."""
        return tools_section(tools, _TOOLS_HEADER, _CALL_INSTRUCTIONS)

    def parse_lenient(self, text: str) -> ToolCallParse:
        found = _scan(text)
        if not found:
            return ToolCallParse(FormatError(reason=f"no {FUNCTION}...{FUNCTION_END} call", text=text))
        fixes: list[str] = []
        calls = []
        for index, call in enumerate(found):
            read = self._call(call, index, fixes)
            if isinstance(read, str):
                return ToolCallParse(FormatError(reason=read, text=text), fixes)
            calls.append(read)
        if any(not call.wrapped for call in found):
            fixes.append(f"{FUNCTION} without {OPEN}")
        if any(call.wrapped and not call.closed for call in found):
            fixes.append(f"missing {CLOSE}")
        if any(call.after.strip() for call in found[:-1]):
            fixes.append("text between tool calls")
        if found[-1].after.strip():
            fixes.append(f"text after the last {CLOSE}")
        content = text[: found[0].start].strip()
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)

    def _call(self, call: _Call, index: int, fixes: list[str]) -> ToolCall | str:
        where = f"tool call {index + 1}"
        if not call.has_function:
            return f"{where} has no {FUNCTION}name> in its {OPEN}" + ("" if call.closed else " (cut off?)")
        if not call.finished:
            return f"the reply was cut off inside {where} (no {FUNCTION_END})"
        name = call.name.strip()
        if not name:
            return f"{where} has no function name after {FUNCTION}"
        if call.stray.strip():
            fixes.append(f"text inside {OPEN} outside the function of {where}")
        properties = tool_properties(self.tools, name)
        arguments = {}
        for key, value in _parameters(call.body, fixes, where).items():
            schema = properties.get(key)
            arguments[key] = typed_value(value, schema) if isinstance(schema, dict) else value
        return ToolCall(name=name, arguments=arguments)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Exactly what Qwen3.5's chat template writes for this assistant message (after its think block, where it
        writes one); a `thought` is free text before the calls (it parses back as the content)."""
        blocks = [
            f"{OPEN}\n{FUNCTION}{call.name}>\n"
            + "".join(f"<parameter={key}>\n{_written(value)}\n</parameter>\n" for key, value in call.arguments.items())
            + f"{FUNCTION_END}\n{CLOSE}"
            for call in message.tool_calls or []
        ]
        text = "\n".join(part.strip() for part in (thought, message.content) if part and part.strip())
        return text + ("\n\n" if text and blocks else "") + "\n".join(blocks)

    def error_observation(self, error: FormatError) -> str:
        return (
            f"Invalid tool call: {error.reason}. Write each call as {OPEN}\n{FUNCTION}{{function-name}}>\n"
            f"<parameter={{parameter-name}}>\n{{value}}\n</parameter>\n{FUNCTION_END}\n{CLOSE}"
        )
