"""DBBench tasks: the AgentBench v0.2 JSONL format (`standard.jsonl` = test, `dev.jsonl`) read into Tasks.

One line is one single-table task (shared/benchmarks.md §3):

    {"description": ..., "add_description": ..., "type": ["counting"], "label": ["17"],
     "table": {"table_name": ..., "table_info": {"columns": [{"name", "type"}...], "rows": [[...], ...]}},
     "sql": {"query": ...},              # SELECT-style only; noisy, so never used for grading
     "answer_md5": "[('03b2...',)]"}     # INSERT/UPDATE/DELETE: the table hash after the gold SQL (label[0])

`Task.data` keeps what the env needs, in one JSON-able dict (see `task_payload`); the category is `type[0]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.types import Task

# AgentBench v0.2 metric names: every type that is not INSERT/UPDATE counts in the SELECT bucket.
SELECT_TYPES = (
    "other", "counting", "comparison", "ranking",
    "aggregation-SUM", "aggregation-MIN", "aggregation-MAX", "aggregation-AVG",
)
MUTATION_TYPES = ("INSERT", "UPDATE", "DELETE")
CATEGORIES = SELECT_TYPES + MUTATION_TYPES


@dataclass
class Table:
    """The task's one table: every column is TEXT, as AgentBench creates it whatever the declared type."""

    name: str
    columns: list[str]
    rows: list[list[Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "columns": self.columns, "rows": self.rows}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Table:
        return cls(name=d["name"], columns=list(d["columns"]), rows=[list(r) for r in d["rows"]])


def is_mutation(category: str) -> bool:
    """INSERT/UPDATE/DELETE tasks are graded by the table hash; all others against `label`."""
    return category in MUTATION_TYPES


def task_payload(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """The Task.data of one DBBench line; raises ValueError naming `where` (file:line) and the bad key."""
    try:
        table_json = entry["table"]
        info = table_json["table_info"]
        table = Table(
            name=str(table_json["table_name"]),
            columns=[str(c["name"]) for c in info["columns"]],
            rows=[list(r) for r in info["rows"]],
        )
        category = str(entry["type"][0])
        label = entry["label"]
        question = str(entry["description"])
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{where}: not a DBBench entry (missing or malformed {e})") from None
    # A row with another number of values than columns is the item's problem, not the file's: the episode's
    # setup records it (backends.row_count_error), as AgentBench's does, and every other item still runs.
    if not isinstance(label, list):
        raise ValueError(f"{where}: label must be a list, got {type(label).__name__}")
    answer_md5 = entry.get("answer_md5")
    if is_mutation(category) and not isinstance(answer_md5, str):
        raise ValueError(f"{where}: a {category} entry needs an answer_md5 string")
    gold = label[0] if is_mutation(category) and label else (entry.get("sql") or {}).get("query")
    return {
        "question": question,
        "add_description": str(entry.get("add_description", "")),
        "type": category,
        "table": table.to_dict(),
        "label": label,
        "answer_md5": answer_md5,
        "gold_sql": gold,
        "source": entry.get("source", ""),
    }


def load_dbbench(path: str | Path, split: str, limit: int | None = None) -> list[Task]:
    """Tasks of a DBBench JSONL file, ids `<file stem>-<line index>` in file order."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"DBBench data file {path} does not exist; pass --env-opt data=PATH "
            "(AgentBench data/dbbench/standard.jsonl or dev.jsonl)"
        )
    tasks: list[Task] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if limit is not None and len(tasks) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected a JSON object")
            data = task_payload(entry, where)
            index = len(tasks)
            tasks.append(Task(id=f"{path.stem}-{index:04d}", env="dbbench", split=split, category=data["type"], data=data))
    return tasks
