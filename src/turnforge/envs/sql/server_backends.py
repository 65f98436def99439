"""MariaDB/MySQL and PostgreSQL backends (by URL), each episode in its own database / schema.

Needs `pip install turnforge[sql]` (pymysql, psycopg). On MySQL/MariaDB the table hash is AgentBench's
own MD5 query run by the server; on PostgreSQL it is computed in Python from the rows (scoring.table_hash),
as for SQLite.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.isolation import CheckerUnavailable
from turnforge.envs.sql.backends import (
    QueryResult,
    create_table_sql,
    episode_name,
    fetch_for_observation,
    quote,
    row_count_error,
    table_values,
    url_parts,
)
from turnforge.envs.sql.data import Table
from turnforge.envs.sql.scoring import mysql_hash_query, table_hash


def _require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise ValueError(f"this db_url needs the {module} package: pip install 'turnforge[sql]'") from None


class MySqlBackend:
    """MariaDB / MySQL: database `turnforge_<random>` per episode, dropped at `close()`."""

    dialect = "mysql"

    def __init__(self, db_url: str, timeout: float = 10.0):
        self.pymysql = _require("pymysql")
        parts = url_parts(db_url)
        self.connect_args = {
            "host": parts["host"], "port": parts["port"] or 3306, "user": parts["user"] or "root",
            "password": parts["password"] or "", "autocommit": True, "charset": "utf8mb4",
            # A statement the server does not stop in time is killed when the read times out.
            "read_timeout": int(timeout) + 5,
        }
        self.timeout = timeout
        self.conn: Any = None
        self.database: str | None = None

    def _connect(self) -> Any:
        conn = self.pymysql.connect(**self.connect_args)
        with conn.cursor() as cursor:
            # MySQL's default (AgentBench's server); MariaDB's is 1 MB, which would change long tables' hash.
            cursor.execute("SET SESSION group_concat_max_len = 1024")
            try:  # MariaDB: seconds, every statement
                cursor.execute("SET SESSION max_statement_time = %s", (self.timeout,))
            except self.pymysql.Error:  # MySQL: milliseconds, SELECT only (KILL QUERY covers the rest)
                cursor.execute("SET SESSION max_execution_time = %s", (int(self.timeout * 1000),))
        return conn

    def create(self, table: Table) -> str | None:
        self.close()
        self.conn = self._connect()
        self.database = episode_name()
        create, insert = create_table_sql(table, self.dialect)
        with self.conn.cursor() as cursor:
            # utf8mb4 as MySQL 8 (AgentBench's server) defaults to; a MariaDB default may be latin1.
            cursor.execute(f"CREATE DATABASE {quote(self.database, self.dialect)} CHARACTER SET utf8mb4")
            self.conn.select_db(self.database)
            try:  # AgentBench ignores a failing setup (e.g. an empty column name MySQL refuses)
                cursor.execute(create)
                if (bad_rows := row_count_error(table)) is not None:
                    return bad_rows
                cursor.executemany(insert, table_values(table))
            except self.pymysql.Error as e:
                return str(e)
        return None

    def execute(self, sql: str) -> QueryResult:
        assert self.conn is not None, "create(table) first"
        try:
            self.conn.select_db(self.database)  # AgentBench runs `use db` before every statement
            with self.conn.cursor() as cursor:
                cursor.execute(sql)
                rows, complete = fetch_for_observation(cursor) if cursor.description else ([], True)
        except self.pymysql.err.OperationalError as e:
            if e.args and e.args[0] in (2006, 2013):  # connection lost / read timeout: kill and reconnect
                self._kill_and_reconnect()
                return QueryResult(None, f"interrupted: the statement ran longer than the {self.timeout:g} s limit")
            return QueryResult(None, str(e))
        except self.pymysql.Error as e:
            return QueryResult(None, str(e))
        return QueryResult(rows, complete=complete)

    def _kill_and_reconnect(self) -> None:
        thread_id = self.conn.thread_id()
        admin = self.pymysql.connect(**self.connect_args)
        try:
            with admin.cursor() as cursor:
                cursor.execute(f"KILL QUERY {int(thread_id)}")
        except self.pymysql.Error:
            pass  # the statement may have finished meanwhile
        finally:
            admin.close()
        self.conn = self._connect()

    def table_hash(self, table: Table) -> str:
        result = self.execute(mysql_hash_query(table.name, table.columns))
        if not result.ok and str(result.error).startswith("interrupted:"):
            raise CheckerUnavailable(f"hashing table {table.name} for the verdict: {result.error}; no verdict")
        return str(result.rows) if result.ok else str(result.error)

    def close(self) -> None:
        if self.conn is None:
            return
        drop = f"DROP DATABASE IF EXISTS {quote(self.database, self.dialect)}"
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(drop)
        except self.pymysql.Error:
            try:  # a broken connection must not leave the database behind
                self.conn = self._connect()
                with self.conn.cursor() as cursor:
                    cursor.execute(drop)
            except self.pymysql.Error:
                pass  # the server is gone (e.g. stopped before this env was collected)
        finally:
            self.conn.close()
            self.conn, self.database = None, None


class PostgresBackend:
    """PostgreSQL: schema `turnforge_<random>` per episode (on the search_path), dropped at `close()`."""

    dialect = "postgres"

    def __init__(self, db_url: str, timeout: float = 10.0):
        self.psycopg = _require("psycopg")
        self.db_url = db_url.replace("postgres+psycopg://", "postgresql://")
        self.timeout = timeout
        self.conn: Any = None
        self.schema: str | None = None

    def create(self, table: Table) -> str | None:
        self.close()
        self.conn = self.psycopg.connect(self.db_url, autocommit=True)
        self.schema = episode_name()
        create, insert = create_table_sql(table, self.dialect)
        with self.conn.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {quote(self.schema, self.dialect)}")
            cursor.execute(f"SET search_path TO {quote(self.schema, self.dialect)}")
            cursor.execute(f"SET statement_timeout = {int(self.timeout * 1000)}")
            try:  # as AgentBench, a failing setup leaves the episode without its table
                cursor.execute(create)
                if (bad_rows := row_count_error(table)) is not None:
                    return bad_rows
                cursor.executemany(insert, table_values(table))
            except self.psycopg.Error as e:
                return str(e).strip()
        return None

    def execute(self, sql: str) -> QueryResult:
        assert self.conn is not None, "create(table) first"
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(f"SET search_path TO {quote(self.schema, self.dialect)}")
                cursor.execute(sql.encode("utf-8"))  # bytes: no client-side %-placeholders
                rows, complete = fetch_for_observation(cursor) if cursor.description else ([], True)
        except (self.psycopg.Error, ValueError) as e:  # ValueError: e.g. a NUL character
            return QueryResult(None, str(e).strip())
        return QueryResult(rows, complete=complete)

    def table_hash(self, table: Table) -> str:
        cols = ", ".join(quote(c, self.dialect) for c in table.columns)
        try:
            with self.conn.cursor() as cursor:
                cursor.execute(f"SET search_path TO {quote(self.schema, self.dialect)}")
                cursor.execute(f"SELECT {cols} FROM {quote(table.name, self.dialect)}")
                return table_hash(cursor.fetchall())
        except self.psycopg.errors.QueryCanceled as e:  # statement_timeout
            raise CheckerUnavailable(f"hashing table {table.name} for the verdict: {str(e).strip()}; no verdict") from None
        except self.psycopg.Error as e:
            return str(e).strip()

    def close(self) -> None:
        if self.conn is None:
            return
        try:
            with self.conn.cursor() as cursor:
                cursor.execute("SET statement_timeout = 0")
                cursor.execute(f"DROP SCHEMA IF EXISTS {quote(self.schema, self.dialect)} CASCADE")
        except self.psycopg.Error:
            pass  # the server is gone (e.g. stopped before this env was collected)
        finally:
            self.conn.close()
            self.conn, self.schema = None, None
