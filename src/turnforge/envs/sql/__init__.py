"""SQL environments: AgentBench DBBench tasks ("dbbench") and generated ones ("sql").

    turnforge eval --env dbbench --env-opt data=dev.jsonl --policy expert --out runs/db-gold
    turnforge eval --env dbbench --env-opt data=dev.jsonl --env-opt db_url=mysql://root@127.0.0.1:3306 ...
    turnforge eval --env sql --env-opt generate=500 --split test --policy expert --out runs/sql-synth
"""

from __future__ import annotations

from turnforge.envs.base import MAX_GENERATED, EnvOption, EnvSpec, register_env
from turnforge.envs.sql.data import CATEGORIES, Table, load_dbbench
from turnforge.envs.sql.env import FORMATS, SqlEnv
from turnforge.envs.sql.generator import GENERATED_CATEGORIES, SPLITS, TEMPLATES, generate_tasks
from turnforge.envs.sql.metrics import agentbench_accuracies
from turnforge.types import Task

__all__ = ["SqlEnv", "agentbench_accuracies", "load_dbbench"]

_EPISODE_OPTIONS = [
    EnvOption("format", str, "react_sql", "react_sql (Action: Operation / Final Answer) or tool_call "
              "(execute_sql / commit_final_answer)", FORMATS),
    EnvOption("db_url", str, "", "database server (mysql://user:pw@host:port, postgresql://...); "
              "empty = SQLite in memory"),
    EnvOption("max_rounds", int, 15, "SQL statements per episode (AgentBench dbbench.yaml: 15)", at_least=1),
    EnvOption("timeout", float, 10.0, "statement limit in seconds: CPU time on SQLite, the server's wall-clock "
              "statement timeout on MariaDB/MySQL/PostgreSQL", at_least=0.01),
    EnvOption("hints", bool, False, "answer an unparsable reply with a correction instead of ending the episode"),
]


# What a model writes in DBBench's SQL (AgentBench's gold statements use these) but the expert never does: it reads
# the table with one `SELECT *` and answers. A tokenizer trained on the env's text (the tiny model's) gets each whole.
SQL_KEYWORDS = (
    "SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "NULL", "IS", "IN", "LIKE", "BETWEEN", "AS", "DISTINCT",
    "COUNT", "SUM", "AVG", "MIN", "MAX", "GROUP BY", "ORDER BY", "HAVING", "ASC", "DESC", "LIMIT", "JOIN", "ON",
    "INSERT INTO", "VALUES", "UPDATE", "SET", "DELETE",
)
# The options that choose an SQL env's text: its format, as the defaults sample only `tool_call` (tiny_model.py).
_CORPUS_OPTIONS = ("format",)


def dbbench_vocabulary(options: dict) -> list[str]:
    """SQL keywords and every table and column name of the data file."""
    tables = [Table.from_dict(t.data["table"]) for t in load_dbbench(options["data"], "test")]
    return [*SQL_KEYWORDS, *sorted({n for t in tables for n in (t.name, *t.columns)})]


def generated_vocabulary(_options: dict) -> list[str]:
    """SQL keywords and every table, column and value name the generator uses."""
    names = {n for t in TEMPLATES for n in (*t.names, t.key, *t.key_values, t.group, *t.group_values)}
    return [*SQL_KEYWORDS, *sorted(names | {column for t in TEMPLATES for column, _, _ in t.numbers})]


def load_dbbench_tasks(split: str, limit: int | None = None, *, data: str, **_episode_options) -> list[Task]:
    """The tasks of the DBBench JSONL file `data` (the split only labels them)."""
    if not data:
        raise ValueError("env 'dbbench' needs its data file: --env-opt data=path/to/standard.jsonl (or dev.jsonl)")
    return load_dbbench(data, split, limit)


def _make_dbbench(**options) -> SqlEnv:
    return SqlEnv(name="dbbench", **options)


DBBENCH_SPEC = register_env(
    EnvSpec(
        name="dbbench",
        description="AgentBench DBBench tasks from a JSONL file (SQLite in memory, or MySQL/MariaDB/PostgreSQL by URL)",
        factory=_make_dbbench,
        load_tasks=load_dbbench_tasks,
        categories=CATEGORIES,
        splits=("test", "dev", "train"),
        env_metrics=agentbench_accuracies,
        vocabulary=dbbench_vocabulary,
        corpus_options=(*_CORPUS_OPTIONS, "data"),
        options=[EnvOption("data", str, "", "DBBench JSONL file (AgentBench data/dbbench/*.jsonl)"), *_EPISODE_OPTIONS],
    )
)


def load_generated_tasks(
    split: str, limit: int | None = None, *, generate: int, seed: int, **_episode_options
) -> list[Task]:
    """`generate` synthetic tasks of `split` (the first `limit` of them)."""
    if generate < 1:
        raise ValueError(f"env 'sql' option generate must be at least 1, got {generate}")
    n = generate if limit is None else min(limit, generate)
    return [
        Task(id=f"sql-{split}-{i:05d}", env="sql", split=split, category=d["type"], data=d)
        for i, d in enumerate(generate_tasks(split, n, seed))
    ]


def _make_sql(**options) -> SqlEnv:
    return SqlEnv(name="sql", **options)


SQL_SPEC = register_env(
    EnvSpec(
        name="sql",
        description="generated DBBench-style tasks (products, employees, sports, books, cities) with gold SQL",
        factory=_make_sql,
        load_tasks=load_generated_tasks,
        categories=GENERATED_CATEGORIES,
        splits=SPLITS,
        split_size=lambda _split, options: options["generate"],
        env_metrics=agentbench_accuracies,
        vocabulary=generated_vocabulary,
        corpus_options=(*_CORPUS_OPTIONS, "generate", "seed"),
        options=[
            EnvOption("generate", int, 200, "number of generated tasks in the split (they are built in memory)",
                      at_least=1, at_most=MAX_GENERATED),
            EnvOption("seed", int, 0, "generator seed"),
            *_EPISODE_OPTIONS,
        ],
    )
)
