"""tool_call:granite4: IBM Granite 4.0's `<tool_call>` JSON blocks, read as strictly as vLLM's Granite 4 parser.

    I will look.
    <tool_call>
    {"name": "act", "arguments": {"action": "look"}}
    </tool_call>

Granite 4.0's chat template writes an assistant message as its content, then per call `\\n<tool_call>\\n{"name": "...",
"arguments": ...}\\n</tool_call>` (arguments by `tojson`): Qwen3's text exactly, so `render` is `tool_call`'s. TRL
ships no Granite template; the `granite4` family's is turnforge's rendition of IBM's (formats/templates/granite4.jinja),
whose rendering of a reply's `tool_calls` tests/test_family_granite4.py holds equal to `render`.

`parse` reads what vLLM's `Granite4ToolParser` reads (`vllm serve --tool-call-parser granite4`; held against it reply
by reply in benchmarks/tool_call_parsers.py), which is stricter than Hermes's: every `<tool_call>` must be closed by
`</tool_call>` before the next opens, with a non-empty JSON object between them holding "name" and "arguments"; one
block that is not (a reply cut off, two openings in a row, a closing without an opening, bad JSON, a missing key)
means the reply holds no call at all. The content is all the text outside the blocks.

Known disagreement: "arguments" that are not a JSON object (or a string holding one) are a FormatError here; vLLM
passes them on (a list, a number, any string) to a tool that cannot take them.
"""

from __future__ import annotations

import json
import re

from turnforge.formats.base import FormatError
from turnforge.formats.tool_call import CLOSE, OPEN, ToolCallFormat, ToolCallParse
from turnforge.types import Message, ToolCall

_TAG = re.compile(re.escape(OPEN) + "|" + re.escape(CLOSE))

# Granite 4.0's chat template, tool section, verbatim.
_TOOLS_HEADER = (
    "You are a helpful assistant with access to the following tools. You may call one or more tools to assist with "
    "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_CALL_INSTRUCTIONS = (
    "For each tool call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>. If a tool does not '
    "exist in the provided list of tools, notify the user that you do not have the ability to fulfill the request."
)


def _blocks(text: str) -> list[tuple[int, int, str]] | str:
    """(start, end, body) of each `<tool_call>...</tool_call>` block, or why the tags do not pair up."""
    blocks, opened = [], None
    for tag in _TAG.finditer(text):
        if tag.group() == OPEN:
            if opened is not None:
                return f"two {OPEN} in a row (the first call is not closed)"
            opened = tag
        else:
            if opened is None:
                return f"{CLOSE} without a {OPEN} before it"
            body = text[opened.end() : tag.start()]
            if not body:
                return f"an empty {OPEN}{CLOSE} block"
            blocks.append((opened.start(), tag.end(), body))
            opened = None
    if opened is not None:
        return f"the reply was cut off inside a {OPEN} block (no {CLOSE})"
    return blocks


def _tool_call(body: str, index: int, fixes: list[str]) -> ToolCall | str:
    where = f"tool call {index + 1}"
    try:
        call = json.loads(body)
    # json.loads raises ValueError on bad JSON and RecursionError on deep nesting: both mean "not a call"
    except (ValueError, RecursionError) as error:
        detail = error.msg if isinstance(error, json.JSONDecodeError) else type(error).__name__
        return f"{where} is not valid JSON ({detail})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return f'{where} must be a JSON object with a "name" string and "arguments"'
    args = call["arguments"]
    if isinstance(args, str):
        fixes.append("arguments given as a JSON string")
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return f"{where} ({call['name']}): the arguments string is not JSON"
    if not isinstance(args, dict):
        return f'{where} ({call["name"]}): "arguments" must be a JSON object, got {type(args).__name__}'
    if set(call) - {"name", "arguments"}:
        fixes.append(f"extra keys in {where}")
    return ToolCall(name=call["name"], arguments=args)


class Granite4ToolCallFormat(ToolCallFormat):
    """Free text, then `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, each one well formed."""

    name = "tool_call:granite4"
    tools_header, call_instructions = _TOOLS_HEADER, _CALL_INSTRUCTIONS  # Granite 4.0's template's words

    def parse_lenient(self, text: str) -> ToolCallParse:
        blocks = _blocks(text)
        if isinstance(blocks, str):
            return ToolCallParse(FormatError(reason=blocks, text=text))
        if not blocks:
            return ToolCallParse(FormatError(reason=f"no {OPEN} block", text=text))
        fixes: list[str] = []
        calls = []
        for index, (_, _, body) in enumerate(blocks):
            call = _tool_call(body, index, fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            calls.append(call)
        outside = [text[a[1] : b[0]] for a, b in zip(blocks, blocks[1:], strict=False)] + [text[blocks[-1][1] :]]
        if any(gap.strip() for gap in outside):
            fixes.append(f"text between or after the {OPEN} blocks")
        content = (text[: blocks[0][0]] + "".join(outside)).strip()
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)
