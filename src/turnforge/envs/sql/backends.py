"""Database backends: one isolated database per episode, model SQL under a statement timeout.

    open_backend("")                         SQLite, in memory (default; nothing to install)
    open_backend("mysql://user:pw@127.0.0.1:3306")      MariaDB / MySQL (pymysql; turnforge[sql])
    open_backend("postgresql://user@127.0.0.1:5432/db") PostgreSQL (psycopg; turnforge[sql])

Isolation: SQLite gets a new in-memory database per episode (ATTACH refused, so no file is touched);
MySQL a new database `turnforge_<random>`, PostgreSQL a new schema, both dropped at `close()`. So a
`DROP TABLE` in one episode is invisible to every other, also to episodes running at the same time.

Timeouts: SQLite interrupts from a progress handler after `timeout` seconds of the statement's own CPU time
(the thread's, so a loaded machine interrupts no statement it would otherwise finish, issue 40); MariaDB
`max_statement_time`, MySQL `max_execution_time` (SELECT only) plus KILL QUERY when the client read times out;
PostgreSQL `statement_timeout` (the servers' limits are wall-clock: a loaded server can interrupt). A
timed-out model statement is an error observation, like any other SQL error. The verdict's own query (the
table hash) timing out is no verdict: `table_hash` raises CheckerUnavailable (the episode's env error).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from turnforge.envs.isolation import CheckerUnavailable
from turnforge.envs.sql.data import Table
from turnforge.envs.sql.scoring import mysql_hash_query, table_hash

# AgentBench: the observation is cut to 800 characters, then "[TRUNCATED]" is appended.
OBSERVATION_LIMIT = 800
HEAP_LIMIT_BYTES = 1 << 30  # 1 GiB for all in-memory episode databases of this process
_FETCH_BATCH = 256


@dataclass
class QueryResult:
    """Rows of one statement (`[]` when it returns none), or the error text."""

    rows: list[tuple] | None
    error: str | None = None
    complete: bool = True
    """False when fetching stopped early: the rows already fill the observation (AgentBench truncates)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    def observation(self) -> str:
        """`str(rows)` or the error text, truncated as AgentBench does."""
        text = str(self.rows) if self.error is None else self.error
        return text[:OBSERVATION_LIMIT] + "[TRUNCATED]" if len(text) > OBSERVATION_LIMIT else text


def fetch_for_observation(cursor: Any) -> tuple[list[tuple], bool]:
    """(rows, complete): fetch until the rows' text passes the observation limit, never more.

    A runaway `SELECT` of a cross join would otherwise fill memory; the observation is the same because
    the text of the rows fetched already runs past the cut.
    """
    rows: list[tuple] = []
    length = 1
    while batch := cursor.fetchmany(_FETCH_BATCH):
        for row in batch:
            rows.append(tuple(row))
            length += len(repr(tuple(row))) + 2
            if length > OBSERVATION_LIMIT + 1:
                return rows, False
    return rows, True


class SqlBackend(Protocol):
    """One episode's database at a time: `create(table)`, `execute(sql)`..., `table_hash`, `close()`."""

    dialect: str

    def create(self, table: Table) -> str | None:
        """A fresh database holding `table`; the setup error text when the table could not be made."""
        ...

    def execute(self, sql: str) -> QueryResult: ...
    def table_hash(self, table: Table) -> str: ...
    def close(self) -> None: ...


def quote(name: str, dialect: str) -> str:
    """A quoted identifier: `name` for MySQL, "name" for SQLite and PostgreSQL."""
    mark = "`" if dialect == "mysql" else '"'
    return mark + name.replace(mark, mark * 2) + mark


def create_table_sql(table: Table, dialect: str) -> tuple[str, str]:
    """(CREATE TABLE, INSERT with placeholders): every column TEXT, as AgentBench's build_init_sql."""
    cols = ", ".join(f"{quote(c, dialect)} TEXT" for c in table.columns)
    names = ", ".join(quote(c, dialect) for c in table.columns)
    mark = "?" if dialect == "sqlite" else "%s"
    values = ", ".join([mark] * len(table.columns))
    name = quote(table.name, dialect)
    return f"CREATE TABLE {name} ({cols})", f"INSERT INTO {name} ({names}) VALUES ({values})"


def row_count_error(table: Table) -> str | None:
    """MySQL's error for a row whose value count is not the column count, else None.

    AgentBench inserts all rows in ONE statement, so one bad row (standard.jsonl has two such items) leaves the
    table created but empty, and the episode goes on with the error ignored; every backend does the same.
    """
    for i, row in enumerate(table.rows, start=1):
        if len(row) != len(table.columns):
            return f"1136 (21S01): Column count doesn't match value count at row {i}"
    return None


def table_values(table: Table) -> list[tuple]:
    """Rows as text (None stays NULL): the same stored values on every backend."""
    return [tuple(None if v is None else str(v) for v in row) for row in table.rows]


class SQLiteBackend:
    """In-memory SQLite; a new database per `create`."""

    dialect = "sqlite"

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self.conn: sqlite3.Connection | None = None
        self._deadline = 0.0

    def create(self, table: Table) -> str | None:
        self.close()
        # isolation_level=None: autocommit, like AgentBench's commit after every statement.
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.set_authorizer(_refuse_attach)
        # Memory: SQLite's heap cap is process-wide; a runaway sort or recursive CTE fails with "out of memory"
        # (an observation) instead of taking the machine's memory.
        self.conn.execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT_BYTES}")
        self.conn.execute("PRAGMA temp_store = MEMORY")  # sorts and temp tables never spill to disk files
        create, insert = create_table_sql(table, self.dialect)
        try:
            self.conn.execute(create)
            if (bad_rows := row_count_error(table)) is not None:
                return bad_rows
            self.conn.executemany(insert, table_values(table))
        except sqlite3.Error as e:
            return str(e)
        # Checked every 1000 VM instructions; a non-zero return interrupts the statement. CPU time of this
        # thread (the one running the statement), not wall time: the budget is the statement's own cost.
        self.conn.set_progress_handler(lambda: int(time.thread_time() > self._deadline), 1000)
        return None

    def execute(self, sql: str) -> QueryResult:
        assert self.conn is not None, "create(table) first"
        self._deadline = time.thread_time() + self.timeout
        try:
            cursor = self.conn.execute(sql)
            rows, complete = fetch_for_observation(cursor) if cursor.description else ([], True)
            cursor.close()
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as e:  # Warning: 2 statements (3.11)
            if self.conn.in_transaction:  # a failed statement inside BEGIN ... must not leak on
                self.conn.rollback()
            return QueryResult(None, _sqlite_error(e, self.timeout))
        except MemoryError:  # SQLITE_NOMEM: the statement hit HEAP_LIMIT_BYTES; the database stays usable
            if self.conn.in_transaction:
                self.conn.rollback()
            return QueryResult(None, f"out of memory: the statement needed more than {HEAP_LIMIT_BYTES >> 20} MiB")
        return QueryResult(rows, complete=complete)

    def table_rows(self, table: Table) -> list[tuple] | str:
        """All rows of the task table (its original columns), or the error text (e.g. the table was dropped)."""
        self._deadline = time.thread_time() + self.timeout
        cols = ", ".join(quote(c, self.dialect) for c in table.columns)
        try:
            return self.conn.execute(f"SELECT {cols} FROM {quote(table.name, self.dialect)}").fetchall()
        except sqlite3.Error as e:
            if str(e) == "interrupted":
                raise CheckerUnavailable(f"reading table {table.name} for the verdict ran past its {self.timeout:g} "
                                         "CPU s: no verdict") from None
            return str(e)

    def table_hash(self, table: Table) -> str:
        """The verdict's hash of the table, or the error text (e.g. the model dropped it); a timeout raises."""
        rows = self.table_rows(table)
        return rows if isinstance(rows, str) else table_hash(rows)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _refuse_attach(action: int, *_args: Any) -> int:
    """SQLite authorizer: ATTACH/DETACH would reach files outside the episode's in-memory database."""
    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


def _sqlite_error(error: Exception, timeout: float) -> str:
    if isinstance(error, sqlite3.OperationalError) and str(error) == "interrupted":
        return f"interrupted: the statement ran longer than the {timeout:g} s limit"
    return str(error)


def open_backend(db_url: str = "", timeout: float = 10.0) -> SqlBackend:
    """The backend a URL names ("" = SQLite in memory); a clear error for an unknown scheme."""
    if not db_url or db_url.startswith("sqlite"):
        if db_url not in ("", "sqlite://", "sqlite:///:memory:"):
            raise ValueError(f"db_url {db_url!r}: only in-memory SQLite is supported (give no db_url)")
        return SQLiteBackend(timeout)
    scheme = urlsplit(db_url).scheme.split("+")[0]
    if scheme in ("mysql", "mariadb"):
        from turnforge.envs.sql.server_backends import MySqlBackend

        return MySqlBackend(db_url, timeout)
    if scheme in ("postgres", "postgresql"):
        from turnforge.envs.sql.server_backends import PostgresBackend

        return PostgresBackend(db_url, timeout)
    raise ValueError(f"db_url {db_url!r}: the scheme must be mysql://, mariadb://, postgresql:// (or none for SQLite)")


def episode_name() -> str:
    """A fresh database / schema name for one episode."""
    return f"turnforge_{uuid.uuid4().hex[:16]}"


def url_parts(db_url: str) -> dict[str, Any]:
    """host, port, user, password and database of a server URL (percent-decoded)."""
    u = urlsplit(db_url)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port,
        "user": unquote(u.username) if u.username else None,
        "password": unquote(u.password) if u.password else None,
        "database": u.path.lstrip("/") or None,
    }


__all__ = ["QueryResult", "SQLiteBackend", "SqlBackend", "mysql_hash_query", "open_backend", "quote"]
