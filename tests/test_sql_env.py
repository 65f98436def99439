"""SQL env (dbbench / sql): AgentBench scoring, loader, protocol, isolation, timeouts, defects, expert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.envs.sql.backends import OBSERVATION_LIMIT, QueryResult, SQLiteBackend
from turnforge.envs.sql.data import Table, load_dbbench
from turnforge.envs.sql.defects import tables_in, touches_task_table
from turnforge.envs.sql.scoring import answer_values, row_hash, select_correct, table_hash
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Message, StopReason, Task, ToolCall

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dbbench" / "dev.jsonl"
needs_dev = pytest.mark.skipif(not DEV.is_file(), reason=f"{DEV} is absent (../shared not beside the repo)")

TABLE = {"name": "Teams", "columns": ["Team", "Wins"], "rows": [["Lions", "3"], ["Sharks", "5"], ["Hawks", None]]}


def _task(category="counting", label=("2",), gold=None, answer_md5=None) -> Task:
    data = {"question": "How many teams won more than 2 games?", "add_description": "The name of this table is Teams.",
            "type": category, "table": TABLE, "label": list(label), "answer_md5": answer_md5, "gold_sql": gold}
    return Task(id="t-0", env="dbbench", split="test", category=category, data=data)


def _op(sql: str) -> str:
    return f"Thought: look.\nAction: Operation\n```sql\n{sql}\n```"


def _step_text(env, text: str):
    return env.step(env.format.parse(text))


# --- scoring (hand-worked) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "label", "correct"),
    [
        (' ["7"]', ["7.0"], True),          # one value each: float compare
        (" 7", ["7"], True),                 # not a list literal: [" 7"], float(" 7") == 7.0
        (' ["b", "a"]', ["a", "b"], True),   # several: set equality
        (' ["a", "a", "b"]', ["a", "b"], True),
        (' ["a"]', ["a", "b"], False),
        (" March 19, 1998", ["March 19, 1998"], False),  # AgentBench keeps the leading space: no match
        (' ["March 19, 1998"]', ["March 19, 1998"], True),
        (' "abc"', ["abc"], False),          # list("abc") == ["a", "b", "c"]: AgentBench's quirk, kept
        (' [["x"]]', ["x", "y"], False),     # unhashable values never match
        (" none", ["none"], False),
        (' ["none"]', ["none"], True),
        (" __import__('os')", ["0"], False),  # never evaluated
    ],
)
def test_select_answers_are_compared_like_agentbench(answer, label, correct):
    assert select_correct(answer, label) is correct


def test_answer_values_reads_literals_only():
    assert answer_values(' ["a", 1]') == ["a", 1]
    assert answer_values(" (1, 2)") == [1, 2]
    assert answer_values(" 12") == [" 12"]
    assert answer_values(" x + 1") == [" x + 1"]


def test_table_hash_hand_worked():
    """Rows ("a","b") and ("c",NULL): CONCAT_WS skips NULL -> md5("a,b")[:5]="b345e", md5("c")[:5]="4a8a0";
    sorted and joined "4a8a0,b345e" -> md5 = 735a884f6654b59bf5392f2135e1065d."""
    assert row_hash(["a", "b"]) == "b345e"
    assert row_hash(["c", None]) == "4a8a0"
    assert table_hash([("a", "b"), ("c", None)]) == "[('735a884f6654b59bf5392f2135e1065d',)]"
    assert table_hash([("c", None), ("a", "b")]) == table_hash([("a", "b"), ("c", None)])  # order-free
    assert table_hash([]) == "[(None,)]"


def test_observation_is_truncated_at_800_characters():
    long = QueryResult([("x" * 900,)])
    assert long.observation() == str([("x" * 900,)])[:OBSERVATION_LIMIT] + "[TRUNCATED]"
    assert QueryResult([(1,)]).observation() == "[(1,)]"
    assert QueryResult(None, "no such table: t").observation() == "no such table: t"


# --- loader -----------------------------------------------------------------------------------------


def test_loader_reports_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"description": "q", "label": [], "type": ["other"]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a DBBench entry.*'table'"):
        load_dbbench(bad, "test")
    bad.write_text("{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not valid JSON"):
        load_dbbench(bad, "test")
    with pytest.raises(ValueError, match="needs its data file"):
        load_tasks("dbbench", "test")


@needs_dev
def test_loader_reads_the_dev_set():
    tasks = load_tasks("dbbench", "dev", data=str(DEV))
    assert len(tasks) == 60
    kinds = [t.category for t in tasks]
    assert kinds.count("INSERT") == 20 and kinds.count("UPDATE") == 20
    insert = next(t for t in tasks if t.category == "INSERT")
    assert insert.data["gold_sql"].startswith("INSERT INTO") and insert.data["answer_md5"].startswith("[('")


# --- the expert and AgentBench's figures ------------------------------------------------------------


@needs_dev
@pytest.mark.parametrize("fmt", ["react_sql", "tool_call"])
def test_expert_solves_every_dev_task(tmp_path, fmt):
    """Done-when: 100 % SELECT-style; every INSERT/UPDATE reproduces answer_md5 (dev has no exception)."""
    from turnforge.rollouts_file import run_eval

    summary = run_eval("dbbench", {"data": str(DEV), "format": fmt}, "expert", "dev", None, 1, 0, tmp_path / fmt)
    metrics = summary["env_metrics"]
    assert (metrics["SELECT_accuracy"], metrics["INSERT_accuracy"], metrics["UPDATE_accuracy"]) == (1.0, 1.0, 1.0)
    assert metrics["overall_cat_accuracy"] == 1.0 and summary["success"] == 1.0
    episodes = [json.loads(line) for line in (tmp_path / fmt / "episodes.jsonl").open()]
    assert all(e["score"]["details"]["sql_errors"] == 0 for e in episodes)


def test_generated_tasks_are_solved_by_the_expert_and_cover_all_categories(tmp_path):
    from turnforge.rollouts_file import run_eval

    summary = run_eval("sql", {"generate": 66}, "expert", "train", None, 1, 0, tmp_path)
    assert summary["success"] == 1.0
    assert set(summary["by_category"]) == set(get_env_spec("sql").categories)
    assert all(v["n"] == 6 for v in summary["by_category"].values())
    assert summary["env_metrics"]["overall_cat_accuracy"] == 1.0


def test_generated_splits_are_stable_and_disjoint():
    a = load_tasks("sql", "train", generate=30)
    assert [t.data for t in a] == [t.data for t in load_tasks("sql", "train", generate=30)]
    assert [t.data for t in a[:5]] == [t.data for t in load_tasks("sql", "train", generate=5)]
    test = {json.dumps(t.data, sort_keys=True) for t in load_tasks("sql", "test", generate=30)}
    assert not test & {json.dumps(t.data, sort_keys=True) for t in a}


# --- protocol ---------------------------------------------------------------------------------------


def test_react_protocol_and_defects():
    env = make_env("dbbench")
    messages = env.reset(_task(gold="SELECT COUNT(*) FROM `Teams` WHERE Wins + 0 > 2"))
    assert [m.role for m in messages] == ["user", "assistant", "user"]
    assert messages[0].content.startswith("\nI will ask you a question") and messages[1].content == "Ok."
    assert messages[2].content == "How many teams won more than 2 games?\nThe name of this table is Teams."
    r = _step_text(env, _op("SELECT * FROM nowhere"))
    assert r.messages[0].content == "no such table: nowhere" and set(r.info["defects"]) == {"sql_error", "wrong_table"}
    assert not r.done and r.info["progress"] == 0.0
    r = _step_text(env, _op("SELECT COUNT(*)\nFROM `Teams`\nWHERE Wins + 0 > 2"))  # newlines become spaces
    assert r.messages[0].content == "[(2,)]" and r.info["defects"] == []
    assert r.info["progress"] == pytest.approx(2 / 3)
    r = _step_text(env, 'Action: Answer\nFinal Answer: ["2"]')
    assert r.done and r.stop == StopReason.success and r.reward == 1.0 and r.info["progress"] == 1.0
    assert env.score().success


def test_answer_without_query_and_unparsable_reply_end_like_agentbench():
    env = make_env("dbbench")
    env.reset(_task())
    r = _step_text(env, 'Action: Answer\nFinal Answer: ["2"]')
    assert r.done and r.info["defects"] == ["answer_without_query"] and r.stop == StopReason.success
    env.reset(_task())
    r = _step_text(env, "Action: SELECT 1")  # not "Operation": AgentBench's validation fails
    assert r.done and r.stop == StopReason.format_error_limit and not env.score().success
    hinted = make_env("dbbench", hints=True)
    hinted.reset(_task())
    r = _step_text(hinted, "Action: SELECT 1")
    assert not r.done and "Invalid format" in r.messages[0].content and "hint" in r.info


def test_sixteenth_operation_ends_the_episode_unexecuted():
    env = make_env("dbbench", max_rounds=2)
    env.reset(_task())
    assert not _step_text(env, _op("SELECT 1")).done
    assert not _step_text(env, _op("SELECT 2")).done
    r = _step_text(env, _op("DELETE FROM Teams"))
    assert r.done and r.stop == StopReason.max_turns and r.messages == [] and env.statements == ["SELECT 1", "SELECT 2"]


def test_mutation_graded_by_table_hash_however_the_episode_ends():
    rows = [["Lions", "3"], ["Sharks", "5"], ["Hawks", None], ["Owls", "1"]]
    target = table_hash([tuple(r) for r in rows])
    task = _task("INSERT", label=["INSERT INTO Teams VALUES ('Owls', '1')"], answer_md5=target,
                 gold="INSERT INTO Teams VALUES ('Owls', '1')")
    env = make_env("dbbench")
    env.reset(task)
    r = _step_text(env, _op("INSERT INTO `Teams` (`Team`, `Wins`) VALUES ('Owls', '1')"))
    assert r.messages[0].content == "[]" and r.info["progress"] == pytest.approx(3 / 4)
    r = _step_text(env, "no pattern at all")  # AgentBench still hashes the table
    assert r.done and r.reward == 1.0 and env.score().details["compared"] == target


def test_function_calling_variant():
    env = make_env("dbbench", format="tool_call")
    messages = env.reset(_task())
    assert messages[0].role == "system" and [t["function"]["name"] for t in env.tools()] == [
        "execute_sql", "commit_final_answer"]
    call = Message("assistant", "", tool_calls=[ToolCall("execute_sql", {"query": "SELECT COUNT(*) FROM Teams"}, "c1")])
    r = env.step(call)
    assert r.messages == [Message("tool", "[(3,)]", tool_call_id="c1", name="execute_sql")]
    r = env.step(env.format.parse("I think it is 2."))
    assert not r.done and r.messages[0].content == "No executable tool calls found. Please call a tool."
    r = env.step(Message("assistant", "", tool_calls=[ToolCall("commit_final_answer", {"answers": ["2"]})]))
    assert r.done and r.reward == 1.0


# --- isolation and timeouts -------------------------------------------------------------------------


def test_destructive_sql_in_one_episode_is_not_seen_by_the_next():
    env = make_env("dbbench")
    env.reset(_task())
    assert _step_text(env, _op("DROP TABLE Teams")).messages[0].content == "[]"
    assert "no such table" in _step_text(env, _op("SELECT * FROM Teams")).messages[0].content
    other = make_env("dbbench")
    other.reset(_task())
    assert _step_text(other, _op("SELECT COUNT(*) FROM Teams")).messages[0].content == "[(3,)]"
    env.reset(_task())  # the same env object, next episode
    assert _step_text(env, _op("SELECT COUNT(*) FROM Teams")).messages[0].content == "[(3,)]"


def test_runaway_query_is_interrupted_and_attach_refused():
    db = SQLiteBackend(timeout=0.3)
    db.create(Table.from_dict(TABLE))
    runaway = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    result = db.execute(runaway)
    assert not result.ok and "interrupted" in result.error
    assert db.execute("SELECT COUNT(*) FROM Teams").rows == [(3,)]  # still usable afterwards
    assert "not authorized" in db.execute("ATTACH DATABASE '/tmp/x.db' AS x").error
    big = db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 10000000) SELECT i FROM n")
    assert big.ok and not big.complete and big.observation().endswith("[TRUNCATED]")


def test_a_wall_clock_stall_interrupts_no_statement(monkeypatch):
    """Issue 40: the SQLite limit was wall-clock time, so a loaded machine (here: the wall clock jumping 1000 s
    while the statement runs) interrupted statements that cost milliseconds. It is now the statement's CPU time."""
    import itertools
    import time

    db = SQLiteBackend(timeout=0.3)
    db.create(Table.from_dict(TABLE))
    clock = itertools.count(step=1000)  # each reading of the wall clock 1000 s after the last
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    query = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 20000) SELECT COUNT(*) FROM n"
    assert db.execute(query).rows == [(20000,)]


def test_the_verdicts_table_hash_timing_out_is_no_verdict(monkeypatch):
    """Issue 40: a table hash past its limit came back as the error text, compared to the answer's md5: a failed
    verdict. It now raises CheckerUnavailable (the episode's env error)."""
    import itertools
    import time

    from turnforge.envs.isolation import CheckerUnavailable

    db = SQLiteBackend(timeout=0.3)
    table = Table.from_dict({**TABLE, "rows": [[f"team {i}", str(i)] for i in range(5000)]})
    db.create(table)
    clock = itertools.count(step=1000)  # each reading 1000 s after the last: the budget is spent at once
    monkeypatch.setattr(time, "thread_time", lambda: next(clock))
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))  # (the same, for the wall-clock limit before the fix)
    with pytest.raises(CheckerUnavailable, match="reading table Teams for the verdict ran past its 0.3 CPU s"):
        db.table_hash(table)


def test_memory_hungry_query_fails_as_an_observation():
    """A statement that would hold ~2 GB in SQLite's heap stops at the heap cap (and never spills to files)."""
    db = SQLiteBackend(timeout=30)
    db.create(Table.from_dict(TABLE))
    hog = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 1500) "
        "SELECT i, hex(zeroblob(1000000)) AS b FROM n ORDER BY b, i DESC"  # a 3 GB sort
    )
    result = db.execute(hog)
    assert not result.ok and "out of memory" in result.error, result.error
    assert db.execute("SELECT COUNT(*) FROM Teams").rows == [(3,)]


# --- tables touched ---------------------------------------------------------------------------------


def test_tables_touched():
    assert tables_in("SELECT a FROM `Season Results` s JOIN t2 ON s.x = t2.y") == {"season results", "t2"}
    assert tables_in("UPDATE `T` SET a = 1") == {"t"}
    assert tables_in("SELECT 1") == set()
    assert touches_task_table("select * from teams", {"teams"})
    assert not touches_task_table("SELECT 1", {"teams"})
    assert touches_task_table("SELECT Presentation of Credentials FROM teams x y (", {"teams"})  # unparsable


# --- never raises -----------------------------------------------------------------------------------

FRAGMENTS = ["Action: Operation\n", "Action: Answer\n", "Final Answer: ", "```sql\n", "\n```", "```", "SELECT ",
             "* FROM Teams", "DROP TABLE Teams;", "'", '"', "[", "]", "\n", "Observation:", "\x00", "é", "; ", "--"]
replies = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=12), max_size=12).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replies)
def test_parser_and_env_never_raise(text):
    parsed = get_format("react_sql").parse(text)
    assert isinstance(parsed, (Message, FormatError))
    env = make_env("dbbench", hints=True, timeout=1.0)
    env.reset(_task())
    result = env.step(parsed)
    assert 0.0 <= result.info["progress"] <= 1.0
    assert set(result.info["defects"]) <= {"sql_error", "wrong_table", "answer_without_query"}
    env.score()


def test_expert_rollout_records_defects_free_turns():
    tasks = load_tasks("sql", "dev", generate=11)
    trajs = run_episodes(ExpertPolicy(), lambda: make_env("sql"), tasks, 1, RolloutLimits())
    assert all(t.score.success for t in trajs)
    assert all(len(t.turns) == 2 for t in trajs)


@needs_dev
def test_a_malformed_item_fails_its_own_episode_and_the_rest_of_the_file_runs(tmp_path):
    """Issue 17: AgentBench's standard.jsonl has items with a row shorter than the columns (or empty); the whole
    file was refused. As in AgentBench, the table is created empty, the setup error is recorded in that episode's
    details and counted, and every other item runs."""
    from turnforge.rollouts_file import run_eval
    from turnforge.types import Trajectory

    lines = DEV.read_text().splitlines()[:6]
    broken = [json.loads(line) for line in lines]
    broken[1]["table"]["table_info"]["rows"][0] = broken[1]["table"]["table_info"]["rows"][0][:-1]
    broken[3]["table"]["table_info"]["rows"].append([])
    data = tmp_path / "six.jsonl"
    data.write_text("".join(json.dumps(entry) + "\n" for entry in broken))
    summary = run_eval("dbbench", {"data": str(data)}, "expert", "dev", None, 1, 0, tmp_path / "run")
    episodes = [Trajectory.from_json(x) for x in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    errors = {e.task_id: e.score.details.get("setup_error") for e in episodes}
    assert "Column count doesn't match value count at row 1" in errors["six-0001"]
    assert "Column count doesn't match value count" in errors["six-0003"]
    assert sorted(k for k, v in errors.items() if v) == ["six-0001", "six-0003"]
    assert all(e.score.success for e in episodes if not errors[e.task_id])
    assert summary["env_metrics"]["setup_errors"] == 2 and summary["n_episodes"] == 6
    with pytest.raises(ValueError, match=r"six.jsonl:2: not valid JSON"):  # a broken FILE is still an error
        data.write_text(lines[0] + "\n{not json\n")
        load_tasks("dbbench", "dev", data=str(data))
