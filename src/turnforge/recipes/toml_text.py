"""TOML as text: where a key sits in a file (for error messages), and writing a resolved recipe back.

`tomllib` reads TOML but keeps no line numbers and cannot write; recipes use a small part of TOML (tables,
arrays of tables, scalars, arrays), so a line scan and a short writer cover them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

Loc = tuple[str | int, ...]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def key_line(text: str, loc: Loc) -> int | None:
    """The 1-based line that sets `loc` (e.g. ("stages", 2, "learning_rate")), best effort.

    Falls back to the line of the closest enclosing table or key (a missing field points at its table's
    header). Arrays of tables count from 0, like `loc`. None when nothing of `loc` is in the text.
    """
    table: Loc = ()
    counts: dict[Loc, int] = {}
    best, best_len = None, 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("[["):
            parts = _split_key(line[2:].split("]]")[0])
            name = _with_indices(parts[:-1], counts) + parts[-1:]
            counts[name] = counts.get(name, -1) + 1
            table = name + (counts[name],)
            path = table
        elif line.startswith("["):
            table = _with_indices(_split_key(line[1:].split("]")[0]), counts)
            path = table
        elif "=" in line and not line.startswith("#"):
            path = table + _split_key(line.split("=", 1)[0])
        else:
            continue
        if path == loc[: len(path)] and len(path) > best_len:
            best, best_len = lineno, len(path)
    return best


def _split_key(key: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in key.split("."))


def _with_indices(name: tuple[str, ...], counts: dict[Loc, int]) -> Loc:
    """("stages", "lora") -> ("stages", 2, "lora"): a sub-table of the last element of an array of tables."""
    path: Loc = ()
    for part in name:
        path += (part,)
        if path in counts:
            path += (counts[path],)
    return path


def dump_toml(data: dict[str, Any]) -> str:
    """A TOML document for `data` (nested dicts, lists of dicts as arrays of tables); None values are left out."""
    lines: list[str] = []
    _write_table(lines, (), data, array=False)
    return "\n".join(lines).strip() + "\n"


def _write_table(lines: list[str], path: tuple[str, ...], table: dict[str, Any], array: bool) -> None:
    scalars = {k: v for k, v in table.items() if v is not None and not _is_table(v) and not _is_tables(v)}
    if path and (scalars or array):
        lines += ["", f"[[{_key(path)}]]" if array else f"[{_key(path)}]"]
    lines += [f"{_key((k,))} = {_value(v)}" for k, v in scalars.items()]
    for k, v in table.items():
        if _is_table(v) and v:
            _write_table(lines, (*path, k), v, array=False)
        elif _is_tables(v):
            for item in v:
                _write_table(lines, (*path, k), item, array=True)


def _is_table(v: Any) -> bool:
    return isinstance(v, dict)


def _is_tables(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _key(path: tuple[str, ...]) -> str:
    return ".".join(k if _BARE_KEY.match(k) else json.dumps(k) for k in path)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key((k,))} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} {v!r} as TOML")
