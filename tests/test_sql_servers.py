"""The sql env on real servers: MariaDB and PostgreSQL started here on loopback, stopped afterwards.

Each fixture starts a throwaway server in a temporary folder when its binaries are on this machine
(Debian: `apt-get install mariadb-server`; PostgreSQL's initdb/postgres) and the Python driver is
installed (`pip install 'turnforge[sql]'`); otherwise the tests skip and say which is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Task

pytestmark = pytest.mark.integration

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbbench" / "dev.jsonl"
PG_BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
             default=Path("/usr/lib/postgresql/15/bin"))  # Debian's layout, any version (bookworm: 15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(connect, what: str, log: Path, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            connect().close()
            return
        except Exception:
            if time.monotonic() > deadline:
                pytest.fail(f"{what} did not accept connections in {seconds:g} s; log:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def mariadb_url(tmp_path_factory) -> Iterator[str]:
    pymysql = pytest.importorskip("pymysql", reason="pip install 'turnforge[sql]' (pymysql)")
    server, install = shutil.which("mariadbd") or "/usr/sbin/mariadbd", shutil.which("mariadb-install-db")
    if not (Path(server).exists() and install):
        pytest.skip("no MariaDB server on this machine (Debian: apt-get install mariadb-server)")
    root = tmp_path_factory.mktemp("mariadb")
    data, log, port = root / "data", root / "server.log", _free_port()
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run([install, f"--datadir={data}", "--auth-root-authentication-method=normal", *user],
                   check=True, capture_output=True)
    # Loopback only; no grant tables: a throwaway server reached by this test alone.
    process = subprocess.Popen(
        [server, "--no-defaults", f"--datadir={data}", f"--socket={root / 'sock'}", f"--port={port}",
         "--bind-address=127.0.0.1", "--skip-grant-tables", f"--log-error={log}", *user],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: pymysql.connect(host="127.0.0.1", port=port, user="root"), "MariaDB", log)
        yield f"mysql://root@127.0.0.1:{port}"
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg", reason="pip install 'turnforge[sql]' (psycopg)")
    initdb, server = shutil.which("initdb") or str(PG_BIN / "initdb"), shutil.which("postgres") or str(PG_BIN / "postgres")
    if not (Path(initdb).exists() and Path(server).exists()):
        pytest.skip("no PostgreSQL server on this machine (Debian: apt-get install postgresql)")
    # Not under pytest's folder: its parents are private to root, and PostgreSQL runs as its own user.
    root = Path(tempfile.mkdtemp(prefix="turnforge-pg-"))
    data, log, port = root / "data", root / "server.log", _free_port()
    run_as: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
            pytest.skip("running as root without a 'postgres' user to start PostgreSQL as")
        shutil.chown(root, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"], check=True, capture_output=True)
    with log.open("w") as sink:
        process = subprocess.Popen(
            [*run_as, server, "-D", str(data), "-p", str(port), "-k", str(root), "-c", "listen_addresses=127.0.0.1"],
            stdout=sink, stderr=subprocess.STDOUT,
        )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        _wait_for(lambda: psycopg.connect(url), "PostgreSQL", log)
        yield url
    finally:
        _stop(process)
        shutil.rmtree(root, ignore_errors=True)


def _verdicts(tasks: list[Task], env_name: str, **options) -> dict[str, bool]:
    trajs = run_episodes(ExpertPolicy(), lambda: make_env(env_name, **options), tasks, 1, RolloutLimits())
    return {t.task_id: t.score.success for t in trajs}


def _op(sql: str) -> str:
    return f"Action: Operation\n```sql\n{sql}\n```"


def _run(env, sql: str) -> str:
    return env.step(env.format.parse(_op(sql))).messages[0].content


# --- MariaDB ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not DEV.is_file(), reason=f"{DEV} is absent (../shared not beside the repo)")
def test_mariadb_gives_the_same_verdicts_as_sqlite_on_the_dev_set(mariadb_url):
    """AgentBench's own MD5 query on MariaDB reproduces every dev answer_md5, as the Python hash on SQLite."""
    tasks = load_tasks("dbbench", "dev", data=str(DEV))
    on_server = _verdicts(tasks, "dbbench", db_url=mariadb_url)
    assert on_server == _verdicts(tasks, "dbbench")
    assert all(on_server.values())


def test_mariadb_same_verdicts_on_generated_tasks(mariadb_url):
    tasks = load_tasks("sql", "test", generate=22)
    assert _verdicts(tasks, "sql", db_url=mariadb_url) == _verdicts(tasks, "sql") == {t.id: True for t in tasks}


def test_mariadb_hash_query_equals_the_python_hash_after_edits(mariadb_url):
    task = load_tasks("sql", "test", generate=1)[0]
    envs = {"sqlite": make_env("sql"), "mariadb": make_env("sql", db_url=mariadb_url)}
    for env in envs.values():
        env.reset(task)
        table = f"`{env.table.name}`"
        _run(env, f"UPDATE {table} SET `{env.table.columns[1]}` = NULL LIMIT 2")
        _run(env, f"INSERT INTO {table} (`{env.table.columns[0]}`) VALUES ('Zoë ''quoted''')")
    hashes = {name: env.backend.table_hash(env.table) for name, env in envs.items()}
    assert hashes["sqlite"] == hashes["mariadb"] and hashes["sqlite"].startswith("[('")


def test_mariadb_isolation_timeout_and_cleanup(mariadb_url):
    import pymysql

    task = load_tasks("sql", "test", generate=1)[0]
    a, b = make_env("sql", db_url=mariadb_url, timeout=1.0), make_env("sql", db_url=mariadb_url)
    a.reset(task)
    b.reset(task)
    name = f"`{task.data['table']['name']}`"
    rows = len(task.data["table"]["rows"])
    assert _run(a, f"DROP TABLE {name}") == "[]"
    assert _run(b, f"SELECT COUNT(*) FROM {name}") == f"[({rows},)]"  # a concurrent episode is untouched
    started = time.monotonic()
    text = _run(a, "SELECT BENCHMARK(10000000000, MD5('runaway'))")
    # Minutes of work, stopped at the 1 s limit (MariaDB ends BENCHMARK early rather than raising).
    assert time.monotonic() - started < 8, text
    a.reset(task)  # next episode: a fresh database with the original table
    assert _run(a, f"SELECT COUNT(*) FROM {name}") == f"[({rows},)]"
    a.close()
    b.close()
    conn = pymysql.connect(host="127.0.0.1", port=int(mariadb_url.rsplit(":", 1)[1]), user="root")
    with conn.cursor() as cursor:
        cursor.execute("SHOW DATABASES LIKE 'turnforge\\_%'")
        assert cursor.fetchall() == ()
    conn.close()


# --- PostgreSQL -------------------------------------------------------------------------------------


def test_postgres_episode_isolation_timeout_and_hash(postgres_url):
    """PostgreSQL speaks its own SQL (double quotes, no backticks): the expert's look query and a PG
    mutation give the same table hash as SQLite, one schema per episode, statement_timeout applies."""
    task = load_tasks("sql", "test", generate=1)[0]
    name, key = f'"{task.data["table"]["name"]}"', f'"{task.data["table"]["columns"][0]}"'
    rows = len(task.data["table"]["rows"])
    pg, lite = make_env("sql", db_url=postgres_url, timeout=1.0), make_env("sql")
    other = make_env("sql", db_url=postgres_url)
    for env in (pg, lite, other):
        env.reset(task)
    assert _run(pg, f"SELECT COUNT(*) FROM {name}") == f"[({rows},)]"
    for env in (pg, lite):
        _run(env, f"UPDATE {name} SET {key} = 'renamed' WHERE {key} = '{task.data['table']['rows'][0][0]}'")
    assert pg.backend.table_hash(pg.table) == lite.backend.table_hash(lite.table)
    assert _run(pg, f"DROP TABLE {name}") == "[]"
    assert _run(other, f"SELECT COUNT(*) FROM {name}") == f"[({rows},)]"
    assert "statement timeout" in _run(pg, "SELECT pg_sleep(5)")
    pg.reset(task)
    assert _run(pg, f"SELECT COUNT(*) FROM {name}") == f"[({rows},)]"
    reply = pg.expert_reply()
    assert reply.content.startswith('SELECT * FROM "') or json.loads(json.dumps(reply.content))
    for env in (pg, other):
        env.close()
