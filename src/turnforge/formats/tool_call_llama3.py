"""tool_call:llama3: Llama 3.x JSON tool calls, a bare `{"name": ..., "parameters": {...}}` object per call.

    {"name": "act", "parameters": {"action": "look", "n": 2}}

This is what Llama-3.2's chat template writes for an assistant message with one tool call (and what its tool prompt
asks for: "Respond in the format {"name": function name, "parameters": dictionary of argument name and its
value}"); it parses to `Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look", "n": 2})])`.

`parse` reads what vLLM's `Llama3JsonToolParser` reads (`vllm serve --tool-call-parser llama3_json`; held against it
reply by reply in benchmarks/tool_call_parsers.py): every `{` outside an object already read starts a JSON object,
each with a "name" and "parameters" (or "arguments"); anything between them (vLLM's docstring says "; ", the model
writes `<|python_tag|>` first at times) is skipped, and so is text before and after. One `{` that does not start such
an object (prose with a brace, a reply cut off mid-call) means the reply holds no call at all, as in vLLM, even where
whole calls come before it. The text around the calls is dropped (vLLM returns no content beside calls, and
Llama 3.2's template cannot write text with a call), so `thoughts = False`.

Where turnforge departs from vLLM (known disagreements, never written by the template): arguments that are not a JSON
object (`"parameters": "x"`, `[1]`) are a FormatError; vLLM passes them on as a string or list, which no tool can
take. `call_marker` is `"{"`: vLLM's own quick check, since a call is a bare JSON object and `<|python_tag|>` is
optional.

`parse_lenient` lists the fixes a reply needed (text around the calls, separators other than "; ", "arguments"
instead of "parameters", extra keys); `parse_strict` refuses any reply that needed one.
"""

from __future__ import annotations

import json
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.tool_call import LenientParsing, ToolCallParse
from turnforge.types import Message, ToolCall

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = "; "

# Llama-3.2's chat template, tools in the first user message (its default), verbatim (trl/chat_templates/llama3_2.jinja).
_CALL_INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    "Do not use variables.\n\n"
)


def _objects(text: str) -> list[tuple[int, int, Any]] | str:
    """(start, end, value) of each JSON value starting at a `{` outside the ones already read, as vLLM scans them;
    or why one `{` starts none."""
    decoder = json.JSONDecoder()
    found: list[tuple[int, int, Any]] = []
    end = -1
    start = text.find("{")
    while start != -1:
        try:
            value, length = decoder.raw_decode(text[start:])
        # raw_decode raises ValueError on bad JSON and RecursionError on deep nesting; both mean "no object here"
        except (ValueError, RecursionError) as error:
            detail = f"{error.msg} at character {start + error.pos}" if isinstance(error, json.JSONDecodeError) else (
                type(error).__name__)
            return f"the JSON object at character {start} is not valid JSON ({detail})"
        end = start + length
        found.append((start, end, value))
        start = text.find("{", end)
    return found


def _tool_call(value: Any, index: int, fixes: list[str]) -> ToolCall | str:
    where = f"tool call {index + 1}"
    if not isinstance(value, dict) or "name" not in value:
        return f'{where} has no "name"'
    name = value["name"]
    if not isinstance(name, str):
        return f'{where}: "name" must be a string, got {type(name).__name__}'
    if "arguments" in value:
        fixes.append('"arguments" instead of "parameters"')
        args = value["arguments"]
    elif "parameters" in value:
        args = value["parameters"]
    else:
        return f'{where} ({name}) has no "parameters"'
    if not isinstance(args, dict):
        return f'{where} ({name}): "parameters" must be a JSON object, got {type(args).__name__}'
    if set(value) - {"name", "parameters", "arguments"}:
        fixes.append(f"extra keys in {where}")
    return ToolCall(name=name, arguments=args)


def _stray_text_fixes(text: str, objects: list[tuple[int, int, Any]]) -> list[str]:
    fixes = []
    before = text[: objects[0][0]].strip()
    if before and before != PYTHON_TAG:
        fixes.append("text before the call")
    gaps = [text[a[1] : b[0]] for a, b in zip(objects, objects[1:], strict=False)]
    if any(gap.strip() != SEPARATOR.strip() for gap in gaps):
        fixes.append(f"calls separated by something other than {SEPARATOR!r}")
    if text[objects[-1][1] :].strip():
        fixes.append("text after the call")
    return fixes


class Llama3ToolCallFormat(LenientParsing, ToolActions):
    """Llama 3.x: one `{"name": ..., "parameters": {...}}` JSON object per call, several joined by "; "."""

    name = "tool_call:llama3"
    call_marker = "{"  # a call is a bare JSON object: text without a brace holds no call attempt
    thoughts = False

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """Llama 3.2's own tool instructions (the template puts them in the first user message), the tools as its
        template lists them (`tojson(indent=4)`) when given."""
        listed = "".join(json.dumps(tool, ensure_ascii=False, indent=4) + "\n\n" for tool in tools or [])
        return _CALL_INSTRUCTIONS + listed

    def parse_lenient(self, text: str) -> ToolCallParse:
        objects = _objects(text)
        if isinstance(objects, str):
            return ToolCallParse(FormatError(reason=objects, text=text))
        if not objects:
            return ToolCallParse(FormatError(reason="no tool call (a JSON object with name and parameters)", text=text))
        fixes: list[str] = []
        calls = []
        for index, (_, _, value) in enumerate(objects):
            call = _tool_call(value, index, fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            calls.append(call)
        fixes.extend(_stray_text_fixes(text, objects))
        return ToolCallParse(Message(role="assistant", content="", tool_calls=calls), fixes)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Exactly what Llama 3.2's chat template writes for this assistant message (one call; several are joined by
        "; ", which vLLM reads and the template refuses). Text beside calls has no place in the format."""
        if thought is not None:
            raise ValueError(f"{self.name} has no place for a thought: a Llama 3 tool-call reply is the calls alone")
        if not message.tool_calls:
            return message.content.strip()  # the template writes `content | trim`
        if message.content:
            raise ValueError(f"{self.name} cannot write text beside tool calls (Llama 3.2's template drops it)")
        return SEPARATOR.join(
            '{"name": "' + call.name + '", "parameters": ' + json.dumps(call.arguments, ensure_ascii=False) + "}"
            for call in message.tool_calls
        )

    def error_observation(self, error: FormatError) -> str:
        return (
            f"Invalid tool call: {error.reason}. Respond with JSON for a function call, in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}'
        )
