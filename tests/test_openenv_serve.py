"""`turnforge env serve` (issue 42, requirement 1) driven by openenv's own clients: GenericEnvClient, MCPToolClient,
a bare WebSocket. Loopback only; tau2 retail tests skip when ../shared/data/tau2 is absent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("openenv")

from openenv_servers import (  # noqa: E402
    RETAIL,
    TAU2,
    client,
    expert_run,
    forget_servers,  # noqa: F401 (autouse)
    needs_tau2,
    play,
    replies,
)
from turnforge.envs.base import make_env  # noqa: E402
from turnforge.integrations.openenv.server import running_server  # noqa: E402
from turnforge.rollouts_file import run_eval  # noqa: E402
from turnforge.types import Trajectory  # noqa: E402


@pytest.fixture(scope="module")
def household_url():
    with running_server("household", {}, "test") as url:
        yield url


@pytest.fixture(scope="module")
def retail_url():
    if not (TAU2 / "retail" / "db.json").is_file():
        pytest.skip("../shared/data/tau2 absent")
    with running_server("service", RETAIL, "test") as url:
        yield url


@pytest.mark.parametrize(("env", "options", "fmt"), [
    ("household", {}, "act_line"), ("sql", {"format": "tool_call"}, "tool_call")])
def test_reset_then_steps_as_text_and_as_messages_reach_the_experts_reward(env, options, fmt, tmp_path):
    _, episodes = expert_run(env, options, 4, tmp_path / "direct")
    with running_server(env, options, "test") as url, client(url) as session:
        for traj, how in zip(episodes, ("text", "stored", "parsed", "stored"), strict=True):
            result, state = play(session, traj, how, options)
            assert result.done and result.reward == traj.score.reward == 1.0
            assert state["score"]["success"] and state["task_id"] == traj.task_id and state["done"]
            assert state["step_count"] == len(traj.turns) and state["format"] == fmt


def test_reset_without_task_id_deals_the_split_in_order_and_index_picks_one(household_url):
    with client(household_url) as session:
        by_index = session.reset(index=4).observation["metadata"]
        assert by_index["task_id"] == "test-00004" and by_index["split"] == "test"
        dealt = {session.reset().observation["metadata"]["task_id"] for _ in range(3)}
        assert len(dealt) == 3  # server-wide order: three different tasks
        assert session.reset(split="train", index=0).observation["metadata"]["task_id"].startswith("train-")


def test_a_bad_action_gets_the_envs_own_error_observation(household_url):
    direct = make_env("household")
    from turnforge.envs.base import load_tasks

    direct.reset(load_tasks("household", "test", limit=1)[0])
    expected = direct.step(direct.format.parse("ACTION: fly to the moon")).messages[0].content
    with client(household_url) as session:
        session.reset(index=0)
        result = session.step({"text": "ACTION: fly to the moon"})
        assert result.observation["messages"] == [{"role": "user", "content": expected}] and not result.done
        assert "hint" not in result.observation["metadata"]  # hints off: no correction, not even beside the text
        unparsable = session.step({"text": "no action line here"})
        assert unparsable.observation["messages"][0]["content"] == direct.step(direct.format.parse("no action line here")).messages[0].content


@pytest.mark.parametrize("how", ["message", "text"])
def test_the_experts_reply_stepped_as_it_came_takes_the_experts_action(household_url, how):
    """Issue 60: `{"type": "expert"}` answered `go to desk 1`, the parsed action without the format's `ACTION: `.
    Stepped as it came (`{"message": reply}` or `{"text": reply["content"]}`) it was a format error, answered
    "Nothing happens." as ALFWorld answers one: 50 steps, reward 0, and no step said why. Now the reply is the text
    the expert policy writes, and a reply the format cannot read is named in the step's metadata."""
    with client(household_url) as session:
        session.reset(index=0)
        for _ in range(50):
            reply = session.step({"type": "expert"}).observation["messages"][0]
            assert reply["content"].startswith("ACTION: ") and not reply.get("tool_calls")
            result = session.step({"message": reply} if how == "message" else {"text": reply["content"]})
            assert "format_error" not in result.observation["metadata"]
            if result.done:
                break
        assert result.reward == 1.0 and session.state()["score"]["success"]
        session.reset(index=0)
        unparsable = session.step({"text": "go to desk 1"})
        assert unparsable.observation["messages"][0]["content"] == "Nothing happens."
        assert unparsable.observation["metadata"]["format_error"] == 'no "ACTION:" line'


@pytest.mark.parametrize(("action", "says"), [
    ({"bogus": 1}, "unknown key(s) ['bogus']"),
    ({"text": "ACTION: look", "message": {"content": "x"}}, "2 of message, text, type"),
    ({"message": {"role": "user", "content": "hi"}}, "the message of a step is the assistant's"),
    ({"message": {"content": "", "tool_calls": [{"function": {}}]}}, "not an assistant message in OpenAI chat shape"),
    ({"type": "call_tool"}, "call_tool needs a tool_name"),
])
def test_malformed_steps_get_one_clear_error_and_the_session_goes_on(household_url, action, says):
    with client(household_url) as session:
        session.reset(index=0)
        with pytest.raises(RuntimeError, match="Server error: .*" + re.escape(says)):
            session.step(action)
        assert session.step({"text": "ACTION: look"}).observation["messages"]  # the same session still serves


def test_bad_resets_and_steps_out_of_order_are_clear_errors(household_url):
    with client(household_url) as session:
        with pytest.raises(RuntimeError, match="step before reset"):
            session.step({"text": "ACTION: look"})
        with pytest.raises(RuntimeError, match="has no task 'nope'"):
            session.reset(task_id="nope")
        with pytest.raises(RuntimeError, match=r"unknown argument\(s\) \['colour'\]"):
            session.reset(colour="red")
        with pytest.raises(RuntimeError, match="has no split 'dev'; splits are"):
            session.reset(split="dev")
        assert session.reset(index=0).observation["messages"]


def test_http_routes_answer_a_bad_request_with_a_400_that_says_why(household_url):
    """OpenEnv's stateless HTTP routes (a fresh env per request): a refused request is a 400 with one line, not
    Starlette's bare 500 and a traceback in the server's log."""
    import httpx

    step = httpx.post(f"{household_url}/step", json={"action": {"text": "ACTION: look"}})
    assert step.status_code == 400 and "step before reset" in step.json()["detail"]
    assert "use the WebSocket" in step.json()["detail"]
    reset = httpx.post(f"{household_url}/reset", json={"task_id": "nope"})
    assert reset.status_code == 400 and "has no task 'nope'" in reset.json()["detail"]
    assert httpx.post(f"{household_url}/reset", json={"index": 0}).status_code == 200


def test_invalid_json_on_the_socket_is_refused_and_the_socket_still_serves(household_url):
    from websockets.sync.client import connect

    with connect(household_url.replace("http", "ws") + "/ws") as ws:
        ws.send("{not json")
        error = json.loads(ws.recv())
        assert error["type"] == "error" and error["data"]["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "reset", "data": {"index": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"


def test_a_session_that_disconnects_closes_its_env(monkeypatch):
    from websockets.sync.client import connect

    from turnforge.envs.household.env import HouseholdEnv

    closed = []
    original = HouseholdEnv.close
    monkeypatch.setattr(HouseholdEnv, "close", lambda self: (closed.append(self), original(self)))
    with running_server("household", {}, "test") as url:
        before = len(closed)  # the server's startup probe
        with client(url) as session:
            session.reset(index=0)
        with connect(url.replace("http", "ws") + "/ws") as ws:  # a socket dropped without OpenEnv's close message
            ws.send(json.dumps({"type": "reset", "data": {"index": 1}}))
            ws.recv()
        deadline = time.monotonic() + 10
        while len(closed) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(closed) == before + 2


@needs_tau2
def test_retail_expert_episodes_replayed_through_generic_env_client_get_evals_rewards(retail_url, tmp_path):
    """Issue 42's "done when": every tau2 retail test task's expert episode, replayed through GenericEnvClient against
    `turnforge env serve`, gets the reward `turnforge eval` gave it."""
    summary, episodes = expert_run("service", RETAIL, None, tmp_path / "direct")
    assert summary["n_episodes"] == len(episodes) > 0
    with client(retail_url) as session:
        for i, traj in enumerate(episodes):
            result, state = play(session, traj, ("text", "stored", "parsed")[i % 3], RETAIL)
            assert (result.done, result.reward, state["score"]["reward"]) == (True, traj.score.reward, traj.score.reward)
        run_eval("service", RETAIL, "random", "test", 10, 1, 0, tmp_path / "random")  # failures too
        lines = (tmp_path / "random" / "episodes.jsonl").read_text().splitlines()
        for traj in map(Trajectory.from_json, lines):
            _, state = play(session, traj)
            assert (state["score"]["success"], state["score"]["reward"]) == (traj.score.success, traj.score.reward)
        assert {Trajectory.from_json(line).score.reward for line in lines} >= {0.0}


@needs_tau2
def test_an_episodes_jsonl_message_is_read_as_the_text_it_holds(retail_url, tmp_path):
    """Issue 53: an assistant message as episodes.jsonl stores it (the tool call written as the format's text in
    `content`, no `tool_calls`) was applied as a message to the user, silently: the call never ran, the scripted user
    confirmed each turn, reward 0. Now it is parsed by the env's format as `{"text": ...}` is: the same reward."""
    _, episodes = expert_run("service", RETAIL, 3, tmp_path / "direct")
    stored = [t.messages[i].to_dict() for t in episodes for i in t.reply_indices()]
    assert any("<tool_call>" in m["content"] and not m.get("tool_calls") for m in stored)
    with client(retail_url) as session:
        for traj in episodes:
            by_text, _ = play(session, traj, "text")
            by_message, state = play(session, traj, "stored")
            assert by_message.done and by_message.reward == by_text.reward == traj.score.reward == 1.0
            assert state["score"]["success"]


@needs_tau2
def test_concurrent_retail_sessions_on_one_task_keep_their_own_database(retail_url, tmp_path):
    """Two sessions play the same task's writes turn by turn, interleaved: with one shared DB the second's writes
    would fail (the order already changed) and its verdict differ."""
    _, episodes = expert_run("service", RETAIL, 5, tmp_path / "direct")
    traj = max(episodes, key=lambda t: len(t.turns))
    assert any(write in text for text in replies(traj) for write in ("modify_", "cancel_", "exchange_", "return_"))
    with client(retail_url) as a, client(retail_url) as b:
        a.reset(task_id=traj.task_id), b.reset(task_id=traj.task_id)
        for text in replies(traj):
            results = a.step({"text": text}), b.step({"text": text})
        assert [r.reward for r in results] == [traj.score.reward, traj.score.reward] == [1.0, 1.0]


def test_sql_tools_are_openenv_mcp_tools(tmp_path):
    """A tool env's tools are MCP tools the way OpenEnv's MCPToolClient lists and calls them (RFC 003 actions)."""
    from openenv.core.mcp_client import MCPToolClient

    with running_server("sql", {"format": "tool_call"}, "test") as url, MCPToolClient(base_url=url).sync() as mcp:
        listed = mcp.list_tools()
        assert [t.name for t in listed] == ["execute_sql", "commit_final_answer"]
        assert listed[0].input_schema["properties"]["query"]["type"] == "string"
        mcp.reset(index=0)  # the WebSocket joins the MCP session: one episode
        assert mcp.call_tool("execute_sql", query="SELECT 1 + 1") == "[(2,)]"
        assert mcp.state().step_count == 1
    with running_server("sql", {"format": "tool_call"}, "test") as url, client(url) as session:
        session.reset(index=0)
        called = session.step({"type": "call_tool", "tool_name": "execute_sql", "arguments": {"query": "SELECT 1 + 1"}})
        assert called.observation["tool_name"] == "execute_sql" and called.observation["result"] == "[(2,)]"
        assert session.step({"type": "list_tools"}).observation["tools"][1]["name"] == "commit_final_answer"


def test_env_serve_command_serves_until_stopped(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "turnforge", "env", "serve", "--env", "household", "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        url = line.split(" at ")[1].split(" ")[0]
        with client(url) as session:
            assert session.reset(index=0).observation["messages"][0]["role"] == "system"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_env_serve_refuses_options_it_cannot_serve():
    from turnforge.integrations.openenv.server import ServedEnv

    with pytest.raises(ValueError, match="needs model role\\(s\\) \\['user'\\], which env serve does not play"):
        ServedEnv("service", {"user": "hf:some/model"}, "test")
    with pytest.raises(ValueError, match="has no option 'colour'"):
        ServedEnv("household", {"colour": "red"}, "test")
