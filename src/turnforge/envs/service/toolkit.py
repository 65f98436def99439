"""Toolkits: typed, docstringed methods over a domain DB, turned into tool JSON schemas and called by name.

A domain's tools are methods of a `Toolkit` subclass marked `@tool(ToolKind.READ | WRITE | GENERIC)`, as
tau2-bench marks them (`@is_tool(ToolType...)`): the name, the signature's types and the Google-style
docstring (summary, `Args:`) become the OpenAI tool schema, like tau2's `Tool.openai_schema` (the parameters
are a pydantic model built from the signature, so the schema is pydantic's `model_json_schema`).

Calls run as tau2's `Environment.get_response` does: the arguments go to the method as keyword arguments,
unvalidated; any exception becomes the observation `"Error: {exception}"` (counted as an error), and the
result is serialised as tau2's `Environment.to_json_str` does (pydantic models dumped, lists and dicts
recursively, numbers as strings at any depth, strings as they are, then `json.dumps(..., default=str)`).
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, Field, create_model

TOOL_KIND_ATTR = "__service_tool_kind__"


class ToolKind(enum.StrEnum):
    """tau2's ToolType: READ queries, WRITE changes the DB, GENERIC is neither (calculate, transfer)."""

    READ = "read"
    WRITE = "write"
    GENERIC = "generic"


def tool(kind: ToolKind) -> Callable[[Callable], Callable]:
    """Mark a Toolkit method as a tool of `kind`."""

    def mark(method: Callable) -> Callable:
        setattr(method, TOOL_KIND_ATTR, kind)
        return method

    return mark


@dataclass
class ToolResult:
    """One call's observation text and whether it was an error (tau2's `ToolMessage.error`)."""

    content: str
    error: bool


class Toolkit:
    """The tools of one domain over one episode's DB (`self.db`). Subclasses add `@tool` methods."""

    def __init__(self, db: Any):
        self.db = db

    @classmethod
    def tool_kinds(cls) -> dict[str, ToolKind]:
        """Tool name -> kind, in name order (tau2 lists a toolkit's tools by name)."""
        return dict(_tool_kinds(cls))

    @classmethod
    def callable_names(cls) -> set[str]:
        """The names `call` accepts: the tools, and in a domain with discoverable tools those too (banking)."""
        return set(cls.tool_kinds())

    def start_task(self, task: dict) -> None:
        """Per-task settings of a toolkit, before the task's initial state (banking: which discoverable reads are
        logged); none by default."""

    @classmethod
    def schemas(cls) -> list[dict]:
        """The OpenAI / HF tool schemas of every tool, in name order."""
        return [tool_schema(getattr(cls, name)) for name in cls.tool_kinds()]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run tool `name` with `arguments` as tau2 does; errors are observations, never exceptions."""
        try:
            if name not in self.callable_names():
                raise ValueError(f"Tool '{name}' not found.")  # tau2 ToolKitBase.use_tool
            if not isinstance(arguments, dict):
                raise TypeError("arguments must be a JSON object")
            result = getattr(self, name)(**arguments)
        except Exception as e:  # any failure of the call is the agent's observation (tau2: "Error: {e}")
            return ToolResult(to_json_str(f"Error: {e}"), True)
        return ToolResult(to_json_str(result), False)


@functools.cache
def _tool_kinds(cls: type) -> tuple[tuple[str, ToolKind], ...]:
    """A toolkit class's tools, read once (every call asks; `dir` of a 60-method class is not free)."""
    kinds = []
    for name in sorted(dir(cls)):
        kind = getattr(getattr(cls, name, None), TOOL_KIND_ATTR, None)
        if kind is not None:
            kinds.append((name, kind))
    return tuple(kinds)


def to_json_str(value: Any) -> str:
    """tau2's `Environment.to_json_str`: a string stays as it is, anything else is JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(_plain(value), default=str)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)  # tau2 writes numbers as strings, at any depth
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    raise ValueError(f"Unsupported type: {type(value)}")


# ---- schemas from signatures and docstrings ---------------------------------------------------------------

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Note)\s*:\s*$")
_ARG = re.compile(r"^(\s*)(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, str, dict[str, str]]:
    """(short description, long description, {arg: description}) of a Google-style docstring.

    >>> parse_docstring('''Add two numbers.
    ...     Both are floats.
    ...
    ...     Args:
    ...         a: The first one.
    ...         b: The second,
    ...             on two lines.
    ...     ''')
    ('Add two numbers.', 'Both are floats.', {'a': 'The first one.', 'b': 'The second,\\non two lines.'})
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    body: list[str] = []
    args: dict[str, str] = {}
    section, current, indent = None, None, None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current, indent = header.group(1), None, None
            continue
        if section is None:
            body.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            match = _ARG.match(line)
            this_indent = len(line) - len(line.lstrip())
            if match and (indent is None or this_indent <= indent):
                indent, current = this_indent, match.group(2)
                args[current] = match.group(4).strip()
            elif current is not None:
                args[current] = (args[current] + "\n" + line.strip()).strip()
    # As docstring_parser (which tau2 uses) splits: the first line is the short description, the rest the long.
    short, _, long = "\n".join(body).strip().partition("\n")
    return short.strip(), long.strip(), args


def tool_schema(method: Callable) -> dict:
    """tau2's `Tool.openai_schema`: description = short (+ blank line + long) description; parameters = the
    JSON schema of a pydantic model named "parameters" built from the signature, with docstring descriptions."""
    short, long, arg_docs = parse_docstring(method.__doc__)
    hints = typing.get_type_hints(method)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(method).parameters.items():
        if name == "self":
            continue
        default = ... if param.default is param.empty else param.default
        if name in arg_docs:
            default = Field(default, description=arg_docs[name])
        fields[name] = (hints.get(name, Any), default)
    params = create_model("parameters", **fields)
    description = short + ("\n\n" + long if long else "") if short else method.__name__
    return {
        "type": "function",
        "function": {"name": method.__name__, "description": description, "parameters": params.model_json_schema()},
    }
