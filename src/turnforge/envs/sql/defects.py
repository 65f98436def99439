"""Which tables a statement touches, and the per-step SQL defects of the DPO contract.

Defects (shared contract_defects): "sql_error" (the statement raised), "wrong_table" (it touched no table
the task or its gold SQL names), "answer_without_query" (a final answer before any statement ran).
Tables are read with sqlglot (a real SQL parser, MySQL dialect as DBBench's prompt asks; in
turnforge[sql]); a statement it cannot parse, or a machine without sqlglot, falls back to "does the
statement's text name a task table" (SQLite episodes need no extra package).
"""

from __future__ import annotations

import re
from typing import Any

SQL_ERROR, WRONG_TABLE, ANSWER_WITHOUT_QUERY = "sql_error", "wrong_table", "answer_without_query"


def _parse(sql: str) -> tuple[list[Any], Any] | None:
    """(statement trees, sqlglot.exp) or None when sqlglot is missing or cannot parse `sql`."""
    try:
        import sqlglot
        from sqlglot import exp
    except ImportError:
        return None
    try:
        return [t for t in sqlglot.parse(sql, read="mysql") if t is not None], exp
    # sqlglot raises ParseError / TokenError, and on odd input other errors too; all mean "not parsed".
    except Exception:
        return None


def tables_in(sql: str) -> set[str] | None:
    """Lower-cased names of the tables `sql` reads or writes; None when it cannot be parsed."""
    parsed = _parse(sql)
    if parsed is None:
        return None
    trees, exp = parsed
    return {t.name.lower() for tree in trees for t in tree.find_all(exp.Table) if t.name}


def task_tables(table_name: str, gold_sql: str | None) -> set[str]:
    """The task's table plus every table its gold SQL names (lower-cased)."""
    names = {table_name.lower()}
    if gold_sql:
        names |= tables_in(gold_sql) or set()
    return names


def touches_task_table(sql: str, allowed: set[str]) -> bool:
    """Whether `sql` reads or writes one of the `allowed` tables."""
    touched = tables_in(sql)
    if touched is None:
        text = sql.lower()
        return any(name in text for name in allowed)
    return bool(touched & allowed)


def is_read_only(sql: str) -> bool:
    """A plain SELECT (or a set operation of them): it cannot change the table."""
    parsed = _parse(sql)
    if parsed is None:  # without a parse tree: one statement that starts with SELECT
        return re.match(r"\s*\(?\s*select\b", sql, re.I) is not None and ";" not in sql.strip().rstrip(";")
    trees, exp = parsed
    return bool(trees) and all(isinstance(t, (exp.Select, exp.SetOperation)) for t in trees)
