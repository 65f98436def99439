"""Calling a service toolkit in tests: `ok` expects success (the parsed JSON, or the text), `err` an error text."""

from __future__ import annotations

import json


def ok(tools, name, **args):
    result = tools.call(name, args)
    assert not result.error, result.content
    try:
        return json.loads(result.content)
    except json.JSONDecodeError:
        return result.content


def err(tools, name, **args) -> str:
    result = tools.call(name, args)
    assert result.error
    return result.content
