"""Argument values written as untyped text (GLM-4's `<arg_value>`, Qwen3.5's `<parameter=...>`), read by the tools' JSON
schemas as vLLM's parsers read them (`vllm/tool_parsers/utils.py`, `coerce_to_schema_type`): the formats that need
the tools at parse time share this (`formats.base.bind_tools` gives them the episode's).
"""

from __future__ import annotations

import json
import math
from typing import Any

# vLLM's type aliases and order of trying types (vllm/tool_parsers/utils.py, coerce_to_schema_type).
_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
            "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
            "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer", "float": "number",
            "float32": "number", "float64": "number", "double": "number", "bool": "boolean", "dict": "object",
            "arr": "array", "list": "array", "sequence": "array"}
_ORDER = ["null", "integer", "number", "boolean", "object", "array", "string"]
_ENUM_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"))


def _schema_types(schema: Any) -> set[str]:
    """The JSON types a property's schema allows ("type", "enum" values, anyOf/oneOf/allOf); {"string"} if none."""
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    types.update([declared] if isinstance(declared, str) else [t for t in declared or [] if isinstance(t, str)]
                 if isinstance(declared, list) else [])
    for value in schema.get("enum") or [] if isinstance(schema.get("enum"), list) else []:
        types.add("null" if value is None else next(name for kind, name in _ENUM_TYPES if isinstance(value, kind)))
    for choice in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(choice), list):
            for option in schema[choice]:
                types |= _schema_types(option)
    return types or {"string"}


def _finite(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError):
        return False
    return True


def typed_value(value: str, schema: Any) -> Any:
    """A raw argument value (text) read as its property's type, as vLLM's `coerce_to_schema_type` reads it."""
    types = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in _schema_types(schema)}
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind == "integer":
            try:
                return int(value)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        if kind == "boolean" and value.lower().strip() in ("true", "1", "false", "0"):
            return value.lower().strip() in ("true", "1")
        if kind in ("object", "array"):
            try:
                parsed = json.loads(value)
            except (ValueError, RecursionError):
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return parsed if _finite(parsed) else value


def tool_properties(tools: list[dict] | None, name: str) -> dict[str, Any]:
    """The JSON schemas of the arguments of tool `name` among `tools` (OpenAI shape); {} for an unknown tool."""
    for tool in tools or []:
        function = tool.get("function", tool)
        if function.get("name") == name:
            return (function.get("parameters") or {}).get("properties", {}) or {}
    return {}


class SchemaTyped:
    """The tools a format reads values by: given at construction, or bound by the rollout after each reset (and by
    `turnforge serve` per request) through `formats.base.bind_tools`."""

    def __init__(self, tools: list[dict] | None = None) -> None:
        self.tools = tools
        """The tools' JSON schemas (OpenAI shape, as `Env.tools()` gives them): values are read by their types."""

    def bind_tools(self, tools: list[dict] | None) -> None:
        """The tools of the episode (or request) parsed next."""
        self.tools = tools
