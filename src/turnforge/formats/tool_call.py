"""tool_call: Qwen3 / Hermes `<tool_call>` JSON blocks, one per function call.

    I will look it up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

This is what Qwen2.5/Qwen3 chat templates write for an assistant message with `tool_calls` (and what
their tool prompt asks for), following NousResearch's Hermes function-calling format. It parses to
`Message("assistant", "I will look it up.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])`.

`parse` is lenient, like vLLM's hermes tool parser and then some: code fences inside a block,
single-quoted / Python-literal dicts (read with `ast.literal_eval`, never `eval`), `arguments` given as
a JSON string, a missing `</tool_call>` at the end, stray text after the blocks. `parse_lenient` says
which of those fixes it needed; `parse_strict` rejects any reply that needed one, so evaluation can
report how often a model's calls were valid as written.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.types import Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"

# Non-greedy to the first closing tag, or to the end for a reply cut off before `</tool_call>`.
_BLOCK = re.compile(re.escape(OPEN) + r"(?P<body>.*?)(?P<close>" + re.escape(CLOSE) + r"|\Z)", re.S)
_FENCED = re.compile(r"\A```[\w+-]*\n?(?P<inner>.*?)(?:```)?\Z", re.S)

# Qwen3's chat template, tool section, verbatim (Qwen/Qwen3-4B-Instruct-2507 tokenizer_config.json).
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_CALL_INSTRUCTIONS = (
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


@dataclass
class ToolCallParse:
    """A lenient parse and the fixes it needed; `fixes == []` means the reply was strictly valid."""

    result: Message | FormatError
    fixes: list[str] = field(default_factory=list)


class _JsonNames(ast.NodeTransformer):
    """Reads JSON's `true`/`false`/`null` inside a Python-literal dict (`{'x': true}` is common)."""

    _VALUES = {"true": True, "false": False, "null": None}

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self._VALUES:
            return ast.copy_location(ast.Constant(self._VALUES[node.id]), node)
        return node


def _python_literal(body: str) -> Any:
    """`ast.literal_eval` with JSON names; raises on anything that is not a plain literal."""
    tree = _JsonNames().visit(ast.parse(body, mode="eval"))
    # Round-trip through JSON so tuples become lists and sets/bytes are refused like JSON would.
    return json.loads(json.dumps(ast.literal_eval(tree)))


def _decode(body: str, fixes: list[str]) -> Any | FormatError:
    """The JSON value in a block body, tolerating trailing text and Python literals (recorded in `fixes`)."""
    try:
        value, end = json.JSONDecoder().raw_decode(body)
    except (ValueError, RecursionError) as json_error:
        try:
            value = _python_literal(body)
        # literal_eval can fail in many ways on arbitrary text (SyntaxError, ValueError, MemoryError,
        # RecursionError, TypeError); every one of them means "not a literal".
        except Exception:
            return FormatError(reason=f"invalid JSON ({_describe(json_error)})", text=body)
        fixes.append("Python literal instead of JSON (single quotes?)")
        return value
    if body[end:].strip():
        fixes.append("text after the JSON object inside <tool_call>")
    return value


def _describe(error: Exception) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at line {error.lineno} column {error.colno}"
    return type(error).__name__


def _arguments(call: dict[str, Any], fixes: list[str]) -> dict[str, Any] | str:
    """The call's arguments as a dict, or why they are unusable."""
    if "arguments" in call:
        args = call["arguments"]
    elif "parameters" in call:
        fixes.append('"parameters" instead of "arguments"')
        args = call["parameters"]
    else:
        fixes.append('no "arguments" key')
        args = {}
    if isinstance(args, str):
        fixes.append("arguments given as a JSON string")
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as error:
            return f"arguments string is not JSON ({_describe(error)})"
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    return args


def _tool_call(body: str, index: int, fixes: list[str]) -> ToolCall | str:
    """One block body -> ToolCall, or the reason it is not one (prefixed with the call's number)."""
    where = f"tool call {index + 1}"
    body = body.strip()
    fenced = _FENCED.match(body)
    if fenced is not None:
        fixes.append("code fence inside <tool_call>")
        body = fenced.group("inner").strip()
    if not body:
        return f"{where} is empty"
    call = _decode(body, fixes)
    if isinstance(call, FormatError):
        return f"{where}: {call.reason}"
    if not isinstance(call, dict):
        return f"{where} must be a JSON object with name and arguments"
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return f'{where} has no "name" string'
    args = _arguments(call, fixes)
    if isinstance(args, str):
        return f"{where}: {args}"
    if set(call) - {"name", "arguments", "parameters"}:
        fixes.append(f"extra keys in {where}")
    return ToolCall(name=name, arguments=args)


class LenientParsing:
    """`parse` and `parse_strict` of a tool-call format from its own `parse_lenient` (every family's format has one)."""

    def parse(self, text: str) -> Message | FormatError:
        return self.parse_lenient(text).result

    def parse_strict(self, text: str) -> Message | FormatError:
        """Like `parse`, but a reply that needed any lenient fix is a FormatError naming the fixes."""
        parsed = self.parse_lenient(text)
        if parsed.fixes and not isinstance(parsed.result, FormatError):
            return FormatError(reason="not strictly valid: " + "; ".join(parsed.fixes), text=text)
        return parsed.result


def tools_section(tools: list[dict] | None, header: str, instructions: str) -> str:
    """A `<tools>` section as Hermes-style templates write it (Qwen3's, Qwen3.5's, Granite 4.0's words differ): the
    header, one JSON line per tool, `</tools>`, then how to call; the call instructions alone without tools."""
    if tools is None:
        return instructions
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return f"{header}{listed}\n</tools>\n\n{instructions}"


class ToolCallFormat(LenientParsing, ToolActions):
    """Free text, then one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""

    name = "tool_call"
    call_marker = OPEN  # text without it holds no call attempt (PlainTextEndsTurn)
    tools_header, call_instructions = _TOOLS_HEADER, _CALL_INSTRUCTIONS
    """The template's words around the tools (a family writing the same calls has its own: Granite 4.0's)."""

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """Qwen3's own tool section when `tools` (JSON schemas) are given, else just the call format.

        Use it for models prompted as text; with a real tokenizer pass `tools=` to its chat template
        instead, which writes this same section, so the tools are not listed twice.
        """
        return tools_section(tools, self.tools_header, self.call_instructions)

    def parse_lenient(self, text: str) -> ToolCallParse:
        fixes: list[str] = []
        blocks = list(_BLOCK.finditer(text))
        if not blocks:
            return ToolCallParse(FormatError(reason="no <tool_call> block", text=text))
        calls: list[ToolCall] = []
        for index, block in enumerate(blocks):
            call = _tool_call(block.group("body"), index, fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            calls.append(call)
        fixes.extend(_stray_text_fixes(text, blocks))
        content = text[: blocks[0].start()].strip()
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Exactly what Qwen3's chat template writes for this assistant message; a `thought` is free text before
        the calls (it parses back as the message's content)."""
        blocks = [
            f"{OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{CLOSE}"
            for c in message.tool_calls or []
        ]
        return "\n".join([text for text in (thought, message.content) if text] + blocks)

    def error_observation(self, error: FormatError) -> str:
        return (
            f"Invalid tool call: {error.reason}. Write each call as "
            f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
        )


def _stray_text_fixes(text: str, blocks: list[re.Match[str]]) -> list[str]:
    """Lenient fixes outside the blocks: a missing final `</tool_call>`, text between or after blocks."""
    fixes = []
    if not blocks[-1].group("close"):
        fixes.append(f"missing {CLOSE} at the end")
    gaps = [text[a.end() : b.start()] for a, b in zip(blocks, blocks[1:], strict=False)]
    if any(gap.strip() for gap in gaps):
        fixes.append("text between tool calls")
    if text[blocks[-1].end() :].strip():
        fixes.append(f"text after the last {CLOSE}")
    return fixes
