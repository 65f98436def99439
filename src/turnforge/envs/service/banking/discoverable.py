"""Discoverable tools (tau2-bench `environment/toolkit.py` `is_discoverable_tool`, banking_knowledge `tools.py`).

A discoverable tool is a toolkit method that is not in the agent's (or user's) tool list: the knowledge base names
it, the agent unlocks it (`unlock_discoverable_agent_tool`) and calls it through `call_discoverable_agent_tool`, or
gives it to the user (`give_discoverable_user_tool`), who calls it through `call_discoverable_user_tool`. Its
docstring is its definition, parsed and shown as tau2 does. As in tau2, a discoverable tool can also be called
by its own name like any tool (tau2's `use_tool` finds it), which then skips the unlock and the logging.

Its `__qualname__` is tau2's (`KnowledgeTools.<name>`), because an argument error's text names it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from turnforge.envs.service.toolkit import ToolKind

DISCOVERABLE_ATTR = "__banking_discoverable__"


def discoverable(kind: ToolKind, mutates: bool | None = None) -> Callable[[Callable], Callable]:
    """Mark a method as a discoverable tool; `mutates` defaults to kind == WRITE (tau2's `mutates_state`)."""

    def mark(method: Callable) -> Callable:
        setattr(method, DISCOVERABLE_ATTR, (kind, kind == ToolKind.WRITE if mutates is None else mutates))
        return method

    return mark


@functools.cache
def discoverable_tools(cls: type) -> dict[str, Callable]:
    """Name -> method of every discoverable tool of a toolkit class (read once per class; do not change it)."""
    return {name: getattr(cls, name) for name in dir(cls)
            if getattr(getattr(cls, name, None), DISCOVERABLE_ATTR, None) is not None}


def mutates(method: Callable) -> bool:
    return getattr(method, DISCOVERABLE_ATTR)[1]


def named_as(owner: str, cls: type) -> type:
    """Give the discoverable tools of `cls` tau2's qualified name `owner.<name>` (its TypeError texts show it)."""
    for name, method in vars(cls).items():
        if getattr(method, DISCOVERABLE_ATTR, None) is not None:
            method.__qualname__ = f"{owner}.{name}"
    return cls


_ARG = re.compile(r"^\s*(\w+)\s*(?:\(([^)]+)\))?\s*:\s*(.+?)$", re.MULTILINE)


def tool_info(method: Callable) -> dict[str, Any]:
    """tau2's `parse_discoverable_tool_docstring`: description, parameters (type, description, required) and the
    first line of Returns as the success message."""
    docstring = inspect.getdoc(method) or ""
    parts = re.split(r"\n\s*Args:\s*\n", docstring, maxsplit=1)
    parameters: dict[str, dict[str, Any]] = {}
    success = "Action completed successfully."
    if len(parts) > 1:
        args_and_returns = re.split(r"\n\s*Returns:\s*\n", parts[1], maxsplit=1)
        if len(args_and_returns) > 1:
            success = args_and_returns[1].strip().split("\n")[0].strip()
        for match in _ARG.finditer(args_and_returns[0]):
            type_info = match.group(2) or "string"
            kind = re.sub(r",?\s*optional", "", type_info, flags=re.IGNORECASE).strip() or "string"
            parameters[match.group(1)] = {"type": kind, "description": match.group(3).strip(),
                                          "required": "optional" not in type_info.lower()}
    return {"name": method.__name__, "description": parts[0].strip(), "parameters": parameters,
            "success_message": success}


def format_for_agent(info: dict[str, Any]) -> str:
    """tau2's `format_discoverable_tool_for_agent`."""
    params = [f"  - {name}: {p.get('type', 'string')}{' (required)' if p.get('required', True) else ' (optional)'} - "
              f"{p.get('description', '')}" for name, p in info.get("parameters", {}).items()]
    section = "\n".join(params) if params else "  (no parameters)"
    return f"Tool: {info['name']}\nDescription: {info['description']}\nParameters:\n{section}"
