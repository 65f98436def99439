"""The gold solver (`--policy expert`): run the gold statement once, then answer.

- INSERT/UPDATE/DELETE: the gold SQL (DBBench's `label[0]`), then any answer (AgentBench grades the table).
- SELECT-style: the answer is the `label`. Before it, one statement on the task table, so that the
  episode shows a query (no `answer_without_query` defect): the gold `sql.query` when it runs and gives the
  label (DBBench's is noisy: about half do), else a look at the whole table.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.sql.backends import SqlBackend, quote
from turnforge.envs.sql.data import Table, is_mutation
from turnforge.envs.sql.defects import is_read_only
from turnforge.envs.sql.scoring import values_correct


def _same(a: str, b: str) -> bool:
    return a.replace("\n", " ").strip() == b.replace("\n", " ").strip()


def gold_reproduces_label(gold: str | None, label: list[str], backend: SqlBackend) -> bool:
    """Whether the gold SELECT runs and its values equal `label` (by the benchmark's comparison)."""
    if not gold or not is_read_only(gold):
        return False
    result = backend.execute(gold)
    if not result.ok or not result.complete:
        return False
    return values_correct([str(v) for row in result.rows for v in row], label)


def expert_action(data: dict[str, Any], backend: SqlBackend, statements: list[str], table: Table) -> tuple[str, Any]:
    """("sql", statement) or ("answer", answers) for the current state (`statements` = those run so far)."""
    if is_mutation(data["type"]):
        gold = data["gold_sql"]
        if gold and not any(_same(gold, s) for s in statements):
            return "sql", gold
        return "answer", []
    label = [str(v) for v in data["label"]]
    if statements:
        return "answer", label
    gold = data.get("gold_sql")
    if gold_reproduces_label(gold, label, backend):
        return "sql", gold
    # Backticks as the MySQL prompt asks (SQLite reads them too); PostgreSQL needs double quotes.
    dialect = "postgres" if backend.dialect == "postgres" else "mysql"
    return "sql", f"SELECT * FROM {quote(table.name, dialect)}"
