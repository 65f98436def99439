"""tool_call:phi4_mini: Phi-4-mini's `functools[...]`, a JSON list of `{"name": ..., "arguments": {...}}` calls.

    functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "pwd", "arguments": {}}]

This is how Phi-4-mini-instruct writes tool calls (its model card; its chat template writes an assistant reply's
content verbatim); it parses to `Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"}),
ToolCall("pwd", {})])`.

`parse` reads what vLLM's `Phi4MiniJsonToolParser` reads (`vllm serve --tool-call-parser phi4_mini_json`; held against
it reply by reply in benchmarks/tool_call_parsers.py): the first `functools[...]` in the reply, each element an object
with a "name" and "arguments" (or "parameters"); text around it is dropped (vLLM returns no content beside calls), so
`thoughts = False`.

Known disagreement, where vLLM is plainly wrong: vLLM ends the list at the first `]` (`functools\\[(.*?)\\]`), so a
call whose arguments hold a list or a `]` in a string (`{"items": [1, 2]}`) is cut there, fails to load, and vLLM
reads no call; turnforge reads the whole JSON list. Arguments that are not a JSON object are a FormatError here (vLLM
passes them on). `parse_lenient` lists the fixes a reply needed (text around the list, "parameters" instead of
"arguments", extra keys); `parse_strict` refuses any reply that needed one.
"""

from __future__ import annotations

import json
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.tool_call import LenientParsing, ToolCallParse
from turnforge.types import Message, ToolCall

BOT = "functools"
TOOL_OPEN, TOOL_CLOSE = "<|tool|>", "<|/tool|>"

_INSTRUCTIONS = (
    f'To call functions, write them as a JSON list after "{BOT}": '
    f'{BOT}[{{"name": <function-name>, "arguments": <args-json-object>}}, ...]'
)


def _tool_call(value: Any, index: int, fixes: list[str]) -> ToolCall | str:
    where = f"tool call {index + 1}"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return f'{where} must be a JSON object with a "name" string'
    if "arguments" in value:
        args = value["arguments"]
    elif "parameters" in value:
        fixes.append('"parameters" instead of "arguments"')
        args = value["parameters"]
    else:
        return f'{where} ({value["name"]}) has no "arguments"'
    if not isinstance(args, dict):
        return f'{where} ({value["name"]}): "arguments" must be a JSON object, got {type(args).__name__}'
    if set(value) - {"name", "arguments", "parameters"}:
        fixes.append(f"extra keys in {where}")
    return ToolCall(name=value["name"], arguments=args)


class Phi4MiniToolCallFormat(LenientParsing, ToolActions):
    """`functools[{"name": ..., "arguments": {...}}, ...]`, the calls alone."""

    name = "tool_call:phi4_mini"
    call_marker = BOT + "["  # vLLM reads no call from a reply without it
    thoughts = False

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """How to write a call, then the tools as Phi-4-mini's model card lists them (`<|tool|>[...]<|/tool|>`)."""
        if tools is None:
            return _INSTRUCTIONS
        return f"{_INSTRUCTIONS}\n{TOOL_OPEN}{json.dumps(tools, ensure_ascii=False)}{TOOL_CLOSE}"

    def parse_lenient(self, text: str) -> ToolCallParse:
        start = text.find(self.call_marker)
        if start == -1:
            return ToolCallParse(FormatError(reason=f"no {self.call_marker}...] list", text=text))
        try:
            value, end = json.JSONDecoder().raw_decode(text, start + len(BOT))
        # raw_decode raises ValueError on bad JSON and RecursionError on deep nesting; both mean "no list here"
        except (ValueError, RecursionError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else type(error).__name__
            return ToolCallParse(FormatError(reason=f"the {BOT}[...] list is not valid JSON ({detail})", text=text))
        if not value:
            return ToolCallParse(FormatError(reason=f"the {BOT}[...] list is empty", text=text))
        fixes: list[str] = []
        calls = []
        for index, element in enumerate(value):
            call = _tool_call(element, index, fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            calls.append(call)
        if text[:start].strip():
            fixes.append(f"text before {BOT}")
        if text[end:].strip():
            fixes.append(f"text after the {BOT} list")
        return ToolCallParse(Message(role="assistant", content="", tool_calls=calls), fixes)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """The calls as Phi-4-mini writes them. Text beside calls has no place in the format (vLLM drops it)."""
        if thought is not None:
            raise ValueError(f"{self.name} has no place for a thought: a Phi-4-mini tool-call reply is the calls alone")
        if not message.tool_calls:
            return message.content
        if message.content:
            raise ValueError(f"{self.name} cannot write text beside tool calls (vLLM's parser drops it)")
        listed = ", ".join(json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
                           for c in message.tool_calls)
        return f"{BOT}[{listed}]"

    def error_observation(self, error: FormatError) -> str:
        return (f'Invalid tool call: {error.reason}. Write calls as '
                f'{BOT}[{{"name": <function-name>, "arguments": <args-json-object>}}]')
