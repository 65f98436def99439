"""Which tables a statement touches, and the per-step SQL defects of the DPO contract.

Defects (shared contract_defects): "sql_error" (the statement raised), "wrong_table" (it touched no table
the task or its gold SQL names), "answer_without_query" (a final answer before any statement ran).
Tables are read with sqlglot (a real SQL parser, MySQL dialect as DBBench's prompt asks); a statement it
cannot parse falls back to "does the statement's text name a task table".
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

SQL_ERROR, WRONG_TABLE, ANSWER_WITHOUT_QUERY = "sql_error", "wrong_table", "answer_without_query"


def tables_in(sql: str) -> set[str] | None:
    """Lower-cased names of the tables `sql` reads or writes; None when sqlglot cannot parse it."""
    try:
        trees = sqlglot.parse(sql, read="mysql")
    # sqlglot raises ParseError / TokenError, and on odd input other errors too; all mean "not parsed".
    except Exception:
        return None
    return {t.name.lower() for tree in trees if tree is not None for t in tree.find_all(exp.Table) if t.name}


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
    try:
        trees = sqlglot.parse(sql, read="mysql")
    except Exception:
        return False
    return bool(trees) and all(isinstance(t, (exp.Select, exp.SetOperation)) for t in trees if t is not None)
