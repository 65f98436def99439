"""tool_call:lfm2: LiquidAI LFM2's Python call list between `<|tool_call_start|>` and `<|tool_call_end|>`.

    <|tool_call_start|>[get_status(candidate_id="12345", verbose=True)]<|tool_call_end|>Checking it now.

This is how LFM2 writes tool calls (its model card; its chat template writes an assistant turn's content verbatim, so
the calls are in the content as the model wrote them); it parses to `Message("assistant", "Checking it now.",
tool_calls=[ToolCall("get_status", {"candidate_id": "12345", "verbose": True})])`.

`parse` reads what vLLM's `Lfm2ToolParser` reads (`vllm serve --tool-call-parser lfm2`; held against it reply by
reply in benchmarks/tool_call_parsers.py): the first `<|tool_call_start|>` up to the first `<|tool_call_end|>` after it
(or to the end, for a reply cut off) holds one `[...]` list of keyword-argument calls (`f(a=1)`, dotted `a.b(x=1)`);
values are Python or JSON literals (`True`/`true`, `None`/`null`), tuples and sets read as lists, negative numbers and
placeholder-free f-strings as values. Like vLLM it repairs, and records among the fixes: raw newlines/tabs inside
strings, zero-padded integers (`month=07`), parameters named by a Python keyword (`from=1`). The content is the text
before and after the block (vLLM's content), less an echo of the call the model sometimes repeats after it (everything
up to a second `<|tool_call_end|>`). Only the first block counts, as in vLLM: a second block's calls are dropped (a
fix, so strict parsing refuses the reply).

Known disagreements (never written by the model card's format): positional arguments (`f(1)`) are a FormatError —
vLLM drops them silently and calls the tool without them; vLLM's repair of unescaped nested quotes
(`cmd='sed -n '1,9p' f'`), a heuristic that picks the one closing quote that parses, is not copied (the reply is a
FormatError here).
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.tool_call import LenientParsing, ToolCallParse
from turnforge.types import Message, ToolCall

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
TOOL_LIST_START, TOOL_LIST_END = "<|tool_list_start|>", "<|tool_list_end|>"

_INSTRUCTIONS = (
    f"To call functions, write them as a Python list between {START} and {END}, every argument as name=value: "
    f'{START}[function_name(argument_name="value", other_argument=2)]{END}'
)
_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x00": "\\x00"}
_NAME_OR_NUMBER = re.compile(r"[A-Za-z_]\w*|\d[\w]*")
_JSON_NAMES = {"null": None, "true": True, "false": False}
_RESERVED_SUFFIX = "_pyreservedkw_"  # vLLM's own suffix for renamed keyword parameters


def _split_strings(text: str) -> list[tuple[bool, str]]:
    """(inside a string literal, piece) of `text`, quotes scanned as vLLM's repairs scan them (no triple quotes)."""
    pieces: list[tuple[bool, str]] = []
    quote, start, index = None, 0, 0
    while index < len(text):
        char = text[index]
        if quote is None and char in "'\"":
            pieces.append((False, text[start:index]))
            quote, start = char, index
        elif quote is not None and char == "\\":
            index += 1
        elif char == quote:
            pieces.append((True, text[start : index + 1]))
            quote, start = None, index + 1
        index += 1
    pieces.append((quote is not None, text[start:]))
    return pieces


def _zero_padded(code: str) -> str:
    """`07` -> `7` where a name/number run is a zero-padded decimal integer (not `0x1`, `1e07`, `07.5`, `.07`)."""
    out, last = [], 0
    for match in _NAME_OR_NUMBER.finditer(code):
        token = match.group()
        start, end = match.span()
        before = code[start - 1] if start else ""
        after = code[end] if end < len(code) else ""
        digits = token.replace("_", "")
        if (digits.isdigit() and digits[0] == "0" and digits.strip("0") and before != "."
                and after not in ".eEjJ"):
            out.append(code[last:start] + str(int(digits)))
            last = end
    return "".join(out) + code[last:]


def _repairs(text: str) -> list[tuple[str, str]]:
    """(repaired text, fix) candidates, in vLLM's order: control characters escaped and zero-padded integers
    unpadded; then keyword-named parameters renamed."""
    pieces = _split_strings(text)
    escaped = "".join(
        "".join(_CONTROL.get(c, c) for c in piece) if inside else _zero_padded(piece) for inside, piece in pieces
    )
    candidates = [(escaped, "raw control characters or zero-padded integers repaired")]
    renamed = _renamed_keywords(escaped)
    if renamed != escaped:
        candidates.append((renamed, "a parameter named by a Python keyword"))
    return candidates


def _renamed_keywords(text: str) -> str:
    out, last_significant = [], ""
    for inside, piece in _split_strings(text):
        if inside:
            out.append(piece)
            last_significant = piece[-1:]
            continue
        index = 0
        while index < len(piece):
            match = _NAME_OR_NUMBER.match(piece, index)
            if match is None:
                char = piece[index]
                out.append(char)
                last_significant = char if not char.isspace() else last_significant
                index += 1
                continue
            word, end = match.group(), match.end()
            rest = piece[end:].lstrip()
            if keyword.iskeyword(word) and rest.startswith("=") and not rest.startswith("==") and last_significant in (
                    "(", ","):
                word += _RESERVED_SUFFIX
            out.append(word)
            last_significant = word[-1]
            index = end
    return "".join(out)


def _value(node: ast.expr) -> Any:
    """A literal argument value as vLLM's `get_parameter_value` reads it; ValueError on anything else."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, str | int | float):
            return node.value
    elif isinstance(node, ast.Dict):
        if all(isinstance(k, ast.Constant) for k in node.keys):
            return {k.value: _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    elif isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_value(v) for v in node.elts]
    elif isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _value(node.operand)
        if isinstance(operand, int | float) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise ValueError(f"{ast.unparse(node)[:40]!r} is not a literal (quote strings)")


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _call(node: ast.Call, index: int) -> ToolCall | str:
    where = f"call {index + 1}"
    name = _dotted(node.func)
    if name is None:
        return f"{where} has no plain function name"
    if node.args or any(k.arg is None for k in node.keywords):
        return f"{where} ({name}) has positional or ** arguments; write every argument as name=value"
    try:
        arguments = {k.arg: _value(k.value) for k in node.keywords}
        # vLLM sends the arguments as JSON: keys become strings, and a name it renamed gets its keyword back
        arguments = json.loads(json.dumps(arguments, ensure_ascii=False))
    except (ValueError, TypeError, RecursionError) as error:
        return f"{where} ({name}): {error}"
    return ToolCall(name, {k.removesuffix(_RESERVED_SUFFIX) if keyword.iskeyword(k.removesuffix(_RESERVED_SUFFIX))
                           else k: v for k, v in arguments.items()})


def _call_list(source: str, fixes: list[str]) -> list[ToolCall] | str:
    """The calls of one `[f(a=1), ...]` list, or why it is not one."""
    if not (source.startswith("[") and source.endswith("]")):
        return f"the text between {START} and {END} is not one [...] list of calls"
    tree = None
    # ast.parse raises SyntaxError, ValueError (NUL), RecursionError or MemoryError: all mean "not Python"
    for candidate, fix in [(source, None), *_repairs(source)]:
        try:
            tree = ast.parse(candidate)
        except Exception:  # noqa: BLE001 - see above
            continue
        if fix is not None:
            fixes.append(fix)
        break
    if tree is None:
        return "the call list is not valid Python (check brackets and quotes)"
    body = getattr(tree.body[0], "value", None) if tree.body else None
    if not isinstance(body, ast.List) or not body.elts or not all(isinstance(e, ast.Call) for e in body.elts):
        return "the call list must be a non-empty [...] list of function calls"
    calls = []
    for index, element in enumerate(body.elts):
        call = _call(element, index)
        if isinstance(call, str):
            return call
        calls.append(call)
    return calls


def _literal(value: Any) -> str:
    """`value` as a Python literal, strings double-quoted as LFM2 writes them."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are Python's
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} as an argument value")


class Lfm2ToolCallFormat(LenientParsing, ToolActions):
    """Free text, then `<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>`, then free text."""

    name = "tool_call:lfm2"
    call_marker = START  # vLLM reads no call from a reply without it

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """LFM2's template's tool list when `tools` are given (its system prompt line), else how to write a call."""
        if tools is None:
            return _INSTRUCTIONS
        listed = ", ".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return f"List of tools: {TOOL_LIST_START}[{listed}]{TOOL_LIST_END}"

    def parse_lenient(self, text: str) -> ToolCallParse:
        start = text.find(START)
        if start == -1:
            return ToolCallParse(FormatError(reason=f"no {START} block", text=text))
        fixes: list[str] = []
        body_start = start + len(START)
        end = text.find(END, body_start)
        if end == -1:
            fixes.append(f"missing {END} at the end")
            body, after = text[body_start:], ""
        else:
            body, after = text[body_start:end], text[end + len(END) :]
            echo = after.rfind(END)
            if echo != -1:
                fixes.append(f"a second {START} block or an echoed call after {END} (ignored, as vLLM does)")
                after = after[echo + len(END) :]
        calls = _call_list(body.strip(), fixes)
        if isinstance(calls, str):
            return ToolCallParse(FormatError(reason=calls, text=text), fixes)
        content = "\n".join(part for part in (text[:start].strip(), after.strip()) if part)
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """The calls as LFM2 writes them (its template writes a reply verbatim); a `thought` and the content are free
        text before the block (they parse back as the content)."""
        text = "\n".join(t for t in (thought, message.content) if t)
        if not message.tool_calls:
            return text
        listed = ", ".join(
            f"{call.name}(" + ", ".join(f"{k}={_literal(v)}" for k, v in call.arguments.items()) + ")"
            for call in message.tool_calls
        )
        return (text + "\n" if text else "") + f"{START}[{listed}]{END}"

    def error_observation(self, error: FormatError) -> str:
        return f'Invalid tool call: {error.reason}. Write calls as {START}[function_name(argument_name="value")]{END}'
