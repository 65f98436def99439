"""A tool's JSON schema as a Python method whose signature and docstring give TRL that schema back.

TRL's `environment_factory` offers an environment's public methods as tools; transformers turns each into a
schema with `get_json_schema` (type hints + a Google-style docstring), both in the prompt's tool list and when it
types a parsed call's arguments. So each env tool becomes a method carrying type hints and a docstring built
from the env's own schema. What hints and docstrings cannot write is lost (docs/decisions.md; the test
`test_generated_tool_schemas_are_the_envs` pins it): pydantic's `title`s, `default`s (tau2, BFCL), the
properties of a nested object (tau2 airline's `$defs`: a plain `object`), line breaks inside an argument's
description, and an empty `required` list. Names, descriptions, types, enums, array items and required are kept.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, Literal

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def tool_method(schema: dict[str, Any], call: Callable[[Any, str, dict[str, Any]], str]) -> Callable[..., str]:
    """A method named after the tool whose call runs `call(self, name, arguments)`.

    It takes `**arguments` (the signature shown to transformers is the schema's): an argument the schema does
    not have reaches the env, which answers it with its own error observation, as in a turnforge rollout.
    """
    function = schema["function"]
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = list(parameters.get("required") or [])
    defs = parameters.get("$defs") or {}

    def method(self: Any, /, **arguments: Any) -> str:  # an argument named "self" reaches the env too
        return call(self, name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(function.get("description") or name, properties)
    method.__annotations__ = {p: _hint(s, defs) for p, s in properties.items()}
    method.__signature__ = _signature(properties, required)  # type: ignore[attr-defined]
    return method


def _signature(properties: dict[str, Any], required: list[str]) -> inspect.Signature:
    # get_json_schema lists `required` in signature order: the schema's required ones first, in its order.
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p for p in required if p in properties] + [p for p in properties if p not in required]
    params = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=Any,
                                default=inspect.Parameter.empty if p in required else None) for p in names]
    return inspect.Signature([self_param, *params])  # no return hint: get_json_schema would add a "return" key


def _docstring(description: str, properties: dict[str, Any]) -> str:
    """Google style, as transformers parses it; an argument without a description gets its name."""
    lines = [description.strip(), "", "Args:"]
    lines += [f"    {p}: {_one_line(s.get('description') or p)}" for p, s in properties.items()]
    return "\n".join(lines)


def _one_line(text: str) -> str:
    # transformers joins an argument's lines with spaces; a line that looks like "word: ..." would start a new one.
    return " ".join(text.split())


def _hint(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """The type hint get_json_schema reads back as `schema` (as closely as hints can write it)."""
    if "$ref" in schema:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {"type": "object"})
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    if "anyOf" in schema:
        return typing.Union[tuple(_hint(s, defs) for s in schema["anyOf"])]  # noqa: UP007 (built at run time)
    kind = schema.get("type")
    if isinstance(kind, list):
        return typing.Union[tuple(_hint({"type": k}, defs) for k in kind)]  # noqa: UP007
    if kind == "array":
        items = schema.get("items")
        return list[_hint(items, defs)] if isinstance(items, dict) and items else list
    if kind == "object":
        extra = schema.get("additionalProperties")
        return dict[str, _hint(extra, defs)] if isinstance(extra, dict) and extra else dict
    return _SCALARS.get(kind, Any)

