"""The service env's random baseline: any tool of the domain, its arguments drawn from what the agent was shown.

`--policy random` picks uniformly among `ServiceEnv.admissible_actions()`. Those were the task's gold calls,
so "random" scored 43 % on retail (issue 40, defect 6): a floor that knew the answer. Now the list holds, for
each tool of the domain, `DRAWS` calls whose arguments are drawn by the tool's JSON schema from the values the
conversation has shown the agent (the user's words that look like ids, names or numbers, and every value in
the tool results, preferred under the parameter's own key), or a plain value of the schema's type when nothing
fits. The draws come from an RNG seeded by the task and the conversation's length, so an episode is
reproducible; the random policy's own pick among them varies the arguments between samples.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from turnforge.types import Message

DRAWS = 4  # argument draws listed per tool (and copies of each non-tool action, to keep the pick uniform)
_TOKEN = re.compile(r"[#\w][\w.@#+-]*\w|\w")


@dataclass
class ShownValues:
    """The values a conversation has shown the agent: by the key they came under, and by type."""

    by_key: dict[str, list[Any]] = field(default_factory=lambda: defaultdict(list))
    strings: list[str] = field(default_factory=list)
    numbers: list[int | float] = field(default_factory=list)

    def add(self, key: str | None, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                self.strings.append(k)  # tau2 tables are keyed by id (a user's payment methods, ...)
                self.add(k, v)
        elif isinstance(value, list):
            for v in value:
                self.add(key, v)
        elif isinstance(value, bool) or value is None:
            return
        else:
            if key is not None:
                self.by_key[key].append(value)
            (self.numbers if isinstance(value, int | float) else self.strings).append(value)

    def add_text(self, text: str) -> None:
        """Words of free text that look like values: with a digit or #@_ (ids, emails, dates), or capitalized."""
        for token in _TOKEN.findall(text):
            if any(c.isdigit() or c in "#@_" for c in token) or token[0].isupper():
                self.strings.append(token)
                if token.isdecimal():  # not isdigit: "⁴" is a digit int() cannot read
                    self.numbers.append(int(token))


def shown_values(history: list[Message]) -> ShownValues:
    """What the user said and what the tools answered, in an episode's history."""
    shown = ShownValues()
    for message in history:
        if message.role == "user" and message.content:
            shown.add_text(message.content)
        elif message.role == "tool":
            try:
                shown.add(None, json.loads(message.content))
            except json.JSONDecodeError:
                shown.add_text(message.content)
    return shown


def random_calls(schemas: list[dict], shown: ShownValues, rng: random.Random) -> list[dict]:
    """`DRAWS` calls `{"name", "arguments"}` of every tool in `schemas`, in schema order."""
    calls = []
    for schema in schemas:
        function = schema["function"]
        parameters = function.get("parameters") or {}
        for _ in range(DRAWS):
            arguments = _draw_object(parameters, parameters.get("$defs", {}), shown, rng)
            calls.append({"name": function["name"], "arguments": arguments})
    return calls


def _draw_object(schema: dict, defs: dict, shown: ShownValues, rng: random.Random) -> dict:
    properties = schema.get("properties") or {}
    return {name: _draw(name, properties[name], defs, shown, rng) for name in schema.get("required") or []
            if name in properties}


def _draw(name: str, schema: dict, defs: dict, shown: ShownValues, rng: random.Random) -> Any:
    if "$ref" in schema:
        return _draw(name, defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs, shown, rng)
    if "anyOf" in schema:
        return _draw(name, rng.choice(schema["anyOf"]), defs, shown, rng)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "string")
    if kind == "object":
        return _draw_object(schema, defs, shown, rng)
    if kind == "array":
        return [_draw(name, schema.get("items") or {}, defs, shown, rng)]
    if kind == "boolean":
        return rng.random() < 0.5
    same_key = [v for v in _under_key(name, shown) if isinstance(v, str) == (kind == "string")]
    if kind in ("integer", "number"):
        pool = same_key or shown.numbers
        value = rng.choice(pool) if pool else rng.randint(0, 100)
        return int(value) if kind == "integer" else value
    pool = same_key or shown.strings
    return str(rng.choice(pool)) if pool else ""


def _under_key(name: str, shown: ShownValues) -> list[Any]:
    """Values seen under the parameter's name, or under its plural without `_id` (order_id <- "orders")."""
    stem = name.removesuffix("_id")
    return shown.by_key.get(name, []) + shown.by_key.get(stem + "s", [])
