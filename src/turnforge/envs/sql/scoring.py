"""DBBench grading, as AgentBench v0.2 computes it (src/server/tasks/dbbench/__init__.py, `metrics`).

- SELECT-style: the answer text is read as a Python literal and turned into a list (falling back to
  `[text]`); one value each -> float compare, else string compare; otherwise set equality with `label`.
  AgentBench uses `eval`; we use `ast.literal_eval` (the same for every literal, and safe).
- INSERT/UPDATE/DELETE: the MD5 table hash (MySQL query below), compared as the string
  `str(cursor.fetchall())`, e.g. "[('03b2eddd4fe471e0f29fc9e907fd5a5d',)]".

    select md5(group_concat(rowhash order by rowhash)) as hash
    from (SELECT substring(MD5(CONCAT_WS(',', `c1`, `c2`, ...)), 1, 5) AS rowhash FROM `t`) as sub;
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

# MySQL's default group_concat_max_len: GROUP_CONCAT's result is cut to this many bytes.
GROUP_CONCAT_MAX_LEN = 1024


def answer_values(answer: str) -> list[Any]:
    """AgentBench's `list(eval(answer))`, falling back to `[answer]` (a literal that is not iterable too)."""
    try:
        value = ast.literal_eval(answer)
    # literal_eval fails in many ways on model text (SyntaxError, ValueError, MemoryError, RecursionError...).
    except Exception:
        return [answer]
    try:
        return list(value)  # AgentBench quirk kept: a bare string literal becomes its characters
    except TypeError:
        return [answer]


def select_correct(answer: str, label: Sequence[str]) -> bool:
    """Whether a final answer (the text after "Final Answer:") matches a SELECT-style `label`.

    >>> select_correct(' ["7"]', ["7.0"]), select_correct(' ["b", "a"]', ["a", "b"]), select_correct(" 7", ["7"])
    (True, True, True)
    """
    return values_correct(answer_values(answer), label)


def values_correct(values: Sequence[Any], label: Sequence[str]) -> bool:
    """The comparison itself, for an answer already a list (the function-calling `answers` argument)."""
    if len(values) == 1 and len(label) == 1:
        try:
            return float(values[0]) == float(label[0])
        except (ValueError, TypeError, OverflowError):
            return values[0] == label[0]
    try:
        return set(values) == set(label)
    except TypeError:  # an unhashable value (a nested list) never matches, as in AgentBench
        return False


def _mysql_text(value: Any) -> str:
    """How CONCAT_WS writes a non-NULL value of a TEXT column (SQLite may hand back numbers or bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def row_hash(row: Iterable[Any]) -> str:
    """substring(MD5(CONCAT_WS(',', cols...)), 1, 5): CONCAT_WS skips NULLs."""
    text = ",".join(_mysql_text(v) for v in row if v is not None)
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:5]


def table_hash(rows: Iterable[Iterable[Any]]) -> str:
    """The MD5 table hash of `rows` as AgentBench's MySQL query returns it (str of the fetched rows).

    >>> table_hash([])
    '[(None,)]'
    """
    hashes = sorted(row_hash(r) for r in rows)
    if not hashes:  # GROUP_CONCAT over no rows is NULL, and MD5(NULL) is NULL
        return "[(None,)]"
    joined = ",".join(hashes).encode("utf-8")[:GROUP_CONCAT_MAX_LEN]
    return str([(hashlib.md5(joined).hexdigest(),)])


def mysql_hash_query(table: str, columns: Sequence[str]) -> str:
    """AgentBench's own hash query, run as is on MySQL/MariaDB backends."""
    cols = ",".join(f"`{c}`" for c in columns)
    return (
        "select md5(group_concat(rowhash order by rowhash)) as hash "
        f"from( SELECT substring(MD5(CONCAT_WS(',', {cols})), 1, 5) AS rowhash FROM `{table}`) as sub;"
    )
