"""tool_call:gemma4: Gemma 4's `<|tool_call>call:name{key:value,...}<tool_call|>` blocks, strings quoted by `<|"|>`.

    <|tool_call>call:act{action:<|"|>look<|"|>,n:2}<tool_call|>

This is what Gemma 4's chat template (trl/chat_templates/gemma4.jinja .. gemma4_v5.jinja) writes for an assistant
message with `tool_calls`: the calls back to back, keys unquoted and sorted (Jinja's `dictsort`, case-insensitive),
strings between `<|"|>` (never escaped), numbers as Python prints them, `true`/`false`/`null`, nested `{k:v}` and
`[a,b]`; then the message's text (the template writes it after the calls). It parses to
`Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look", "n": 2})])`.

`parse` reads the calls vLLM's Gemma 4 parser reads (`Gemma4EngineToolParser`, `vllm serve --tool-call-parser gemma4`:
`vllm/parser/gemma4.py`'s state machine and `_parse_gemma4_args`; held against it reply by reply in
benchmarks/tool_call_parsers.py): every `<|tool_call>` outside a call opens one; the name runs from the first `:` after
it (`call:`, or a bare `:`) to `{` or `(`; the arguments run to `<tool_call|>`, one trailing `}` (or unbalanced `)`)
dropped, and are read by vLLM's rules, ported here (a `key:` runs to the first colon; a value is a `<|"|>` string, a
`{...}` / `[...]` scanned past strings, or bare text up to `,` `}` `]`). Values are typed as vLLM types them wherever
the tools' JSON schemas type them (`formats.schema_values`; the rollout binds each episode's tools, `bind_tools`).

Hand-written because the reference reader lives in vLLM (not a dependency of the main venv) and transformers' reader
(TRL's Gemma 4 response template) raises on cut-off replies.

Known disagreements, where vLLM is wrong for an env: a bare value no schema types (`id:5` inside an `object` property
with no `properties`, a `[true,null,1.5]` with no `items`, any bare value of a call without tools) is read as written
(5, true, null, 1.5) where vLLM passes the text on as a string ("5", "true", "null"); a reply cut off inside a call
(no `<tool_call|>`) is a FormatError where vLLM reads the unfinished call with the arguments written so far; a call with
no name, or a `<|tool_call>` opened inside an unclosed call, is a FormatError where vLLM skips it or reads the rest as
arguments. The content is the text outside the calls less Gemma's reasoning channel (vLLM keeps only the text before the
first call; the template writes a message's text after its calls, so `parse(render(m)) == m` needs it).

A null argument is written `null`, as gemma4_v5.jinja writes it; the templates before it write Python's `None`, which
neither vLLM nor turnforge reads back as null (it is the text "None").
"""

from __future__ import annotations

import json
import re
from typing import Any

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.schema_values import SchemaTyped, tool_properties, typed_value
from turnforge.formats.tool_call import LenientParsing, ToolCallParse
from turnforge.types import Message, ToolCall

START, END = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
_CHANNEL = re.compile(r"<\|channel>.*?(?:<channel\|>|\Z)", re.S)  # Gemma 4's reasoning, never content

_INSTRUCTIONS = (
    f"To call a function, write {START}call:function_name{{argument:value,...}}{END}, strings between {QUOTE} "
    f"quotes: {START}call:function_name{{name:{QUOTE}text{QUOTE},count:2,flag:true}}{END}"
)


class _Bare(str):
    """A value written without `<|"|>` quotes: a number, true/false/null, or a bare word."""


def _bracketed(text: str, i: int) -> tuple[Any, int]:
    """The `{...}` or `[...]` at `text[i]` and the index after it, scanned past strings as vLLM scans it (an unclosed
    one is read as partial)."""
    opening, closing = text[i], "}" if text[i] == "{" else "]"
    depth, start = 1, i + 1
    i += 1
    while i < len(text) and depth:
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            i = len(text) if end == -1 else end + len(QUOTE)
            continue
        depth += {opening: 1, closing: -1}.get(text[i], 0)
        i += 1
    read = _object if opening == "{" else _array
    return (read(text[start:i], partial=True) if depth else read(text[start : i - 1])), i


def _bare(text: str, i: int, stops: str, partial: bool) -> tuple[_Bare | None, int]:
    """Bare text from `i` to the first of `stops`; None where vLLM reads none (nothing, or maybe unfinished)."""
    start = i
    while i < len(text) and text[i] not in stops:
        i += 1
    raw = text[start:i].strip()
    if i == start or (partial and (i >= len(text) or raw.endswith("."))):
        return None, i
    return _Bare(raw), i


def _object(text: str, partial: bool = False) -> dict[str, Any]:
    """`key:value,...` as vLLM's `_parse_gemma4_args` reads it (`partial`: the text was cut off)."""
    result: dict[str, Any] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,\n\t":
            i += 1
        colon = text.find(":", i)
        if i >= n or colon == -1:
            break
        key = text[i:colon].strip()
        if key.startswith(QUOTE) and key.endswith(QUOTE):
            key = key[len(QUOTE) : -len(QUOTE)]
        i = colon + 1
        while i < n and text[i] in " \n\t":
            i += 1
        if i >= n:
            if not partial:
                result[key] = ""
            break
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            if end == -1:  # an unclosed string takes the rest, less a half-written closing quote
                value = text[i + len(QUOTE) :]
                result[key] = _less_partial_quote(value) if partial else value
                break
            result[key], i = text[i + len(QUOTE) : end], end + len(QUOTE)
        elif text[i] in "{[":
            result[key], i = _bracketed(text, i)
        else:
            value, i = _bare(text, i, ",}]", partial)
            if value is None:
                break
            result[key] = value
    return result


def _array(text: str, partial: bool = False) -> list[Any]:
    """`a,b,...` as vLLM's `_parse_gemma4_array` reads it (a bare item ends at `,` or `]`, not `}`)."""
    items: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,\n\t":
            i += 1
        if i >= n:
            break
        if text.startswith(QUOTE, i):
            end = text.find(QUOTE, i + len(QUOTE))
            if end == -1:
                items.append(text[i + len(QUOTE) :])
                break
            items.append(text[i + len(QUOTE) : end])
            i = end + len(QUOTE)
        elif text[i] in "{[":
            value, i = _bracketed(text, i)
            items.append(value)
        else:
            value, i = _bare(text, i, ",]", partial)
            if value is None:
                break
            items.append(value)
    return items


def _less_partial_quote(value: str) -> str:
    for k in range(len(QUOTE), 0, -1):
        if value.endswith(QUOTE[:k]):
            return value[:-k]
    return value


def _arguments(raw: str) -> dict[str, Any]:
    """The text between `{` and `<tool_call|>` as vLLM's `_gemma4_arg_converter` reads it, values still text."""
    text = raw.strip()
    if text.endswith("}") or (text.endswith(")") and text.count("(") < text.count(")")):
        text = text[:-1]
    return _object(text)


def _typed(value: Any, schema: dict | None) -> Any:
    """A value typed by its schema where it has one (vLLM's `ParserEngine._coerce_value`), else as written."""
    if isinstance(value, str):
        if schema is not None:
            return typed_value(str(value), schema)
        return _as_written(value) if isinstance(value, _Bare) else str(value)
    nested = (schema or {}).get("properties" if isinstance(value, dict) else "items")
    if isinstance(value, dict):
        properties = nested if isinstance(nested, dict) else {}
        return {k: _typed(v, properties.get(k) if isinstance(properties.get(k), dict) else None)
                for k, v in value.items()}
    return [_typed(v, nested if isinstance(nested, dict) else None) for v in value]


def _as_written(text: str) -> Any:
    """A bare value as the template writes it: a JSON number, true, false or null; any other text stays text."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return value if value is None or isinstance(value, bool | int | float) else text


def _written(value: Any) -> str:
    """`value` as Gemma 4's template's `format_argument(value, escape_keys=False)` writes it."""
    if value is None:
        return "null"
    if isinstance(value, str):
        if QUOTE in value:
            raise ValueError(f"cannot write a string holding {QUOTE} (Gemma 4's strings have no escape): {value!r}")
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_written(v)}" for k, v in _dictsort(value)) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_written(v) for v in value) + "]"
    return str(value)


def _dictsort(mapping: dict[str, Any]) -> list[tuple[str, Any]]:
    return sorted(mapping.items(), key=lambda item: item[0].lower())  # Jinja's dictsort: case-insensitive, stable


class Gemma4ToolCallFormat(SchemaTyped, LenientParsing, ToolActions):
    """`<|tool_call>call:name{key:value}<tool_call|>` blocks back to back, then the reply's text."""

    name = "tool_call:gemma4"
    call_marker = START  # vLLM reads no call from a reply without it
    thoughts = False  # Gemma 4 thinks in its `<|channel>` block; its template writes a reply's text after the calls

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """How to write a call, then the tools as JSON lines when given. Gemma 4's template declares tools in its own
        syntax (`<|tool>declaration:...<tool|>`): with a real tokenizer pass `tools=` to it instead."""
        if tools is None:
            return _INSTRUCTIONS
        return _INSTRUCTIONS + "\n\nTools:\n" + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)

    def parse_lenient(self, text: str) -> ToolCallParse:
        if START not in text:
            return ToolCallParse(FormatError(reason=f"no {START} block", text=text))
        fixes: list[str] = []
        calls, spans = [], []
        start = text.find(START)
        while start != -1:
            call = self._call(text, start, len(calls), fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            calls.append(call[0])
            spans.append((start, call[1]))
            start = text.find(START, call[1])
        gaps = [text[a[1] : b[0]] for a, b in zip(spans, spans[1:], strict=False)]
        if any(gap.strip() for gap in gaps):
            fixes.append("text between tool calls")
        before = _CHANNEL.sub("", text[: spans[0][0]]).strip()
        if before:
            fixes.append("text before the first call (Gemma 4's template writes a reply's text after its calls)")
        after = _CHANNEL.sub("", text[spans[-1][1] :]).replace(END, "").strip()
        content = "\n".join(part for part in (before, after) if part)
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)

    def _call(self, text: str, start: int, index: int, fixes: list[str]) -> tuple[ToolCall, int] | str:
        """The call opened at `text[start]` and the index after its `<tool_call|>`, or why it is not one."""
        where = f"tool call {index + 1}"
        body_start = start + len(START)
        end = text.find(END, body_start)
        if end == -1:
            return f"the reply was cut off inside {where} (no {END})"
        body = text[body_start:end]
        if START in body:
            return f"{where} is not closed with {END} before the next {START}"
        colon = body.find(":")
        if colon == -1:
            return f"{where} has no function name (write {START}call:name{{...}}{END})"
        if body[:colon] != "call":
            fixes.append(f"{where} does not start with call:")
        rest = body[colon + 1 :]
        opener = min((p for p in (rest.find("{"), rest.find("(")) if p != -1), default=-1)
        name = (rest if opener == -1 else rest[:opener]).strip()
        if not name:
            return f"{where} has no function name (write {START}call:name{{...}}{END})"
        raw = "" if opener == -1 else rest[opener + 1 :]
        if opener == -1 or rest[opener] == "(":
            fixes.append(f"{where} has no {{...}} around its arguments")
        properties = tool_properties(self.tools, name)
        arguments = {key: _typed(value, properties.get(key) if isinstance(properties.get(key), dict) else None)
                     for key, value in _arguments(raw).items()}
        return ToolCall(name=name, arguments=arguments), end + len(END)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Exactly what Gemma 4's chat template writes for this assistant message (less the `<|tool_response>` or
        `<turn|>` after it): the calls, then the text. There is no place for a thought before the calls."""
        if thought is not None:
            raise ValueError(f"{self.name} has no place for a thought: Gemma 4 reasons in its <|channel> block, and its "
                             "template writes a reply's text after the calls")
        calls = "".join(
            f"{START}call:{call.name}{{" + ",".join(f"{k}:{_written(v)}" for k, v in _dictsort(call.arguments))
            + f"}}{END}"
            for call in message.tool_calls or []
        )
        return calls + _CHANNEL.sub("", message.content).strip()

    def error_observation(self, error: FormatError) -> str:
        return (f"Invalid tool call: {error.reason}. Write each call as "
                f"{START}call:function_name{{argument:{QUOTE}text{QUOTE},count:2}}{END}")
