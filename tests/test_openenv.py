"""OpenEnv both ways (issue 42): `turnforge env serve` driven by openenv's own clients, and `--env openenv:URL`
against a server written here with openenv's server classes and against `turnforge env serve` (a round trip gives
the direct env's episodes and scores). Loopback only; tau2 retail tests skip when ../shared/data/tau2 is absent."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv")

from openenv import GenericEnvClient  # noqa: E402
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from turnforge.envs.base import make_env  # noqa: E402
from turnforge.eval.runner import run_eval  # noqa: E402
from turnforge.integrations.openenv.server import running_server  # noqa: E402
from turnforge.types import Trajectory  # noqa: E402

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
RETAIL = {"domain": "retail", "data_dir": str(TAU2 / "retail")}
needs_tau2 = pytest.mark.skipif(not (TAU2 / "retail" / "db.json").is_file(), reason="../shared/data/tau2 absent")
TIMING_KEYS = {"wall_s", "wall_s_invocation", "env", "policy"}


@pytest.fixture(autouse=True)
def _forget_servers():
    """A URL's facts are cached per process; a later test's server may get a port an earlier one had."""
    from turnforge.integrations.openenv.remote import remote_env_spec, server_facts

    server_facts.cache_clear(), remote_env_spec.cache_clear()


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


def client(url: str):
    return GenericEnvClient(base_url=url).sync()


def expert_run(env: str, options: dict, tasks: int, out: Path) -> tuple[dict, list[Trajectory]]:
    summary = run_eval(env, options, "expert", "test", tasks, 1, 0, out)
    return summary, [Trajectory.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def replies(traj: Trajectory) -> list[str]:
    return [traj.messages[i].content for i in traj.reply_indices()]


def play(session, traj: Trajectory, as_messages: bool = False, options: dict | None = None):
    """Replay an episode's replies through a GenericEnvClient session, as raw text or as the parsed messages (the
    env's format parses them here); the last step's result and the state."""
    first = session.reset(task_id=traj.task_id, sample=traj.sample)
    assert first.observation["messages"] == [m.to_dict() for m in traj.between_replies()[0]]
    assert first.observation["tools"] == traj.tools
    env = make_env(traj.env, **(options or {})) if as_messages else None
    for text in replies(traj):
        parsed = env.format.parse(text) if env is not None else None
        action = {"message": parsed.to_dict()} if parsed is not None and not hasattr(parsed, "reason") else {"text": text}
        result = session.step(action)
    return result, session.state()


# ---- turnforge env serve, driven by openenv's GenericEnvClient ----------------------------------------------------

@pytest.mark.parametrize(("env", "options", "fmt"), [
    ("household", {}, "act_line"), ("sql", {"format": "tool_call"}, "tool_call")])
def test_reset_then_steps_as_text_and_as_messages_reach_the_experts_reward(env, options, fmt, tmp_path):
    _, episodes = expert_run(env, options, 4, tmp_path / "direct")
    with running_server(env, options, "test") as url, client(url) as session:
        for traj, as_messages in zip(episodes, (False, True, False, True), strict=True):
            result, state = play(session, traj, as_messages, options)
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
        with pytest.raises(RuntimeError, match="Server error: .*" + _escaped(says)):
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
            result, state = play(session, traj, i % 2 == 1, RETAIL)
            assert (result.done, result.reward, state["score"]["reward"]) == (True, traj.score.reward, traj.score.reward)
        run_eval("service", RETAIL, "random", "test", 10, 1, 0, tmp_path / "random")  # failures too
        lines = (tmp_path / "random" / "episodes.jsonl").read_text().splitlines()
        for traj in map(Trajectory.from_json, lines):
            _, state = play(session, traj)
            assert (state["score"]["success"], state["score"]["reward"]) == (traj.score.success, traj.score.reward)
        assert {Trajectory.from_json(line).score.reward for line in lines} >= {0.0}


@needs_tau2
def test_concurrent_retail_sessions_on_one_task_keep_their_own_database(retail_url, tmp_path):
    """Two sessions play the same task's writes turn by turn, interleaved: with one shared DB the second's writes
    would fail (the order already changed) and its verdict differ."""
    _, episodes = expert_run("service", RETAIL, 5, tmp_path / "direct")
    traj = max(episodes, key=lambda t: len(t.turns))
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


# ---- --env openenv:URL -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["replay", "expert"])
@pytest.mark.parametrize(("env", "options"), [
    ("household", {"thoughts": "goal"}), pytest.param("service", RETAIL, marks=needs_tau2)])
def test_eval_through_openenv_url_gives_the_direct_envs_summary_and_episodes(env, options, policy, tmp_path):
    """The round trip: `--env openenv:URL` against `turnforge env serve` gives the direct env's summary and episodes,
    with the direct run's replies replayed and with the expert asked through the server ({"type": "expert"})."""
    direct, episodes = expert_run(env, options, 8, tmp_path / "direct")
    spec = f"replay:{tmp_path / 'direct' / 'episodes.jsonl'}" if policy == "replay" else "expert"
    with running_server(env, options, "test") as url:
        remote = run_eval(f"openenv:{url}", {}, spec, "test", 8, 1, 0, tmp_path / "remote")
    ignored = TIMING_KEYS if policy == "replay" else TIMING_KEYS - {"policy"}
    assert {k: v for k, v in remote.items() if k not in ignored} == {k: v for k, v in direct.items() if k not in ignored}
    lines = (tmp_path / "remote" / "episodes.jsonl").read_text().splitlines()
    mine_sorted = sorted(map(Trajectory.from_json, lines), key=lambda t: t.key)  # the file is in finishing order
    for mine, theirs in zip(mine_sorted, sorted(episodes, key=lambda t: t.key), strict=True):
        assert (mine.task_id, mine.messages, mine.score, mine.stop_reason, mine.tools) == \
               (theirs.task_id, theirs.messages, theirs.score, theirs.stop_reason, theirs.tools)
        assert [t.parse_ok for t in mine.turns] == [t.parse_ok for t in theirs.turns]


def test_openenv_url_plays_the_asked_split_not_the_servers_default(tmp_path):
    """A server dealing `train` by default: an eval of `test` through it resets test tasks (the split travels with
    the task id)."""
    with running_server("household", {}, "train") as url:
        summary = run_eval(f"openenv:{url}", {}, "expert", "test", 2, 1, 0, tmp_path / "out")
    assert summary["success"] == 1.0
    lines = (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()
    assert sorted(Trajectory.from_json(line).task_id for line in lines) == ["test-00000", "test-00001"]


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnvironment(Environment):
    """Not turnforge's: guess a number 0..4 (the seed's remainder) in three tries; no Task API."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self.target, self.tries = 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target, self.tries = (seed or 0) % 5, 0
        return GuessObservation(feedback="Guess a number from 0 to 4.")

    def step(self, action, timeout_s=None, **kwargs):
        self.tries += 1
        if action.guess.strip() == str(self.target):
            return GuessObservation(feedback="Right!", done=True, reward=1.0)
        return GuessObservation(feedback="Wrong.", done=self.tries >= 3, reward=0.0)

    @property
    def state(self):
        return State(step_count=self.tries)


@contextlib.contextmanager
def serving(app):
    """An OpenEnv app (openenv's own server classes) on a free loopback port, in a thread."""
    import threading

    import uvicorn

    from turnforge.policies.serve import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def guess_url():
    with serving(create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=8)) as url:
        yield url


@pytest.mark.parametrize(("options", "reply"), [
    ({}, "ACTION: {}"),
    ({"format": "tool_call"}, '<tool_call>{{"name": "GuessAction", "arguments": {{"guess": "{}"}}}}</tool_call>'),
])
def test_eval_on_a_foreign_openenv_server(guess_url, tmp_path, options, reply):
    """A server built with openenv's own classes: tasks by seed, a text action (act_line) or the action's schema as
    one tool (tool_call); reward summed, success at 1."""
    plays = {"seed-0": ["0"], "seed-1": ["4", "1"], "seed-2": ["0", "1", "3"]}
    replay = tmp_path / "replies.jsonl"
    replay.write_text("".join(json.dumps({"task_id": k, "replies": [reply.format(g) for g in v]}) + "\n"
                              for k, v in plays.items()))
    summary = run_eval(f"openenv:{guess_url}", {"seeds": 3, **options}, f"replay:{replay}", "test", None, 1, 0,
                       tmp_path / "out")
    assert summary["n_episodes"] == 3 and summary["success"] == pytest.approx(2 / 3)
    episodes = [Trajectory.from_json(line) for line in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert episodes[0].messages[1].content == "Guess a number from 0 to 4."
    assert episodes[1].messages[-1].content == "Right!" and episodes[2].score.success is False
    assert [len(e.turns) for e in episodes] == [1, 2, 3]
    if options:
        assert episodes[0].tools[0]["function"]["parameters"]["properties"]["guess"]["type"] == "string"
        assert episodes[0].messages[-1].role == "tool"


class Move(Action):
    x: int
    y: int


class Board(Environment):
    """Not turnforge's: one structured move ends the game."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation(done=True, reward=float(action.x == action.y))

    @property
    def state(self):
        return State()


def test_a_structured_foreign_action_is_one_tool_and_not_a_text_action(tmp_path):
    with serving(create_app(Board, Move, Observation, env_name="board")) as url:
        env = make_env(f"openenv:{url}")
        assert env.format.name == "tool_call"
        replay = tmp_path / "moves.jsonl"
        call = '<tool_call>{"name": "Move", "arguments": {"x": 2, "y": 2}}</tool_call>'
        replay.write_text(json.dumps({"task_id": "seed-0", "replies": [call]}) + "\n")
        summary = run_eval(f"openenv:{url}", {"seeds": 1}, f"replay:{replay}", "test", None, 1, 0, tmp_path / "out")
        assert summary["success"] == 1.0
        with pytest.raises(ValueError, match=r"action has string fields \[\]: name the one a text action fills"):
            make_env(f"openenv:{url}", format="act_line")


class CounterEnvironment(MCPEnvironment):
    """Not turnforge's: an MCP env (openenv's MCPEnvironment over FastMCP, action CallToolAction); adding up to
    exactly 3 wins."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        from fastmcp import FastMCP

        mcp = FastMCP("counter")
        self.count = 0

        @mcp.tool
        def add(n: int) -> int:
            """Add n to the counter."""
            self.count += n
            return self.count

        super().__init__(mcp)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.count = 0
        return Observation(metadata={"goal": "make the counter 3"})

    async def step_async(self, action, timeout_s=None, **kwargs):
        return self._judged(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def step(self, action, timeout_s=None, **kwargs):
        return self._judged(action, super().step(action, timeout_s=timeout_s, **kwargs))

    def _judged(self, action, observation):
        if isinstance(action, CallToolAction):
            observation.done, observation.reward = self.count >= 3, float(self.count == 3)
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self):
        return State(step_count=self.count)


def test_eval_on_a_foreign_mcp_server_calls_its_tools(tmp_path):
    call = '<tool_call>{{"name": "add", "arguments": {{"n": {}}}}}</tool_call>'.format
    replay = tmp_path / "calls.jsonl"
    replay.write_text(json.dumps({"task_id": "seed-0", "replies": [call(1), call(2)]}) + "\n"
                      + json.dumps({"task_id": "seed-1", "replies": [call('"x"'), call(5)]}) + "\n")
    app = create_app(CounterEnvironment, CallToolAction, CallToolObservation, env_name="counter", max_concurrent_envs=4)
    with serving(app) as url:
        summary = run_eval(f"openenv:{url}", {"seeds": 2}, f"replay:{replay}", "test", None, 1, 0, tmp_path / "out")
    assert summary["success"] == 0.5
    won, lost = sorted((Trajectory.from_json(line) for line in (tmp_path / "out" / "episodes.jsonl").read_text()
                        .splitlines()), key=lambda t: t.task_id)
    assert won.tools[0]["function"]["name"] == "add" and won.tools[0]["function"]["parameters"]["required"] == ["n"]
    assert [m.content for m in won.messages[1:] if m.role != "assistant"] == ['{"goal": "make the counter 3"}', "1", "3"]
    assert lost.messages[3].content.startswith("Error: 1 validation error") and lost.messages[-1].content == "5"
    assert not lost.score.success


def test_openenv_url_that_does_not_answer_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot reach the OpenEnv server at http://127.0.0.1:9"):
        run_eval("openenv:http://127.0.0.1:9", {}, "random", "test", 1, 1, 0, tmp_path / "x")
    with pytest.raises(ValueError, match="give the server's URL"):
        run_eval("openenv:localhost:8001", {}, "random", "test", 1, 1, 0, tmp_path / "y")


def test_collect_on_an_openenv_url_writes_training_data(household_url, tiny_model_dir, tmp_path):
    """A training-data path end to end on a remote env: a recipe's collect stage (the tiny hf model) on openenv:URL."""
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    recipe = tmp_path / "remote.toml"
    recipe.write_text(f'[model]\nname = "{tiny_model_dir}"\n\n[env]\nname = "openenv:{household_url}"\n\n'
                      '[[stages]]\nkind = "collect"\npolicy = "hf"\nsplit = "test"\ntasks = 2\nmax_turns = 2\n'
                      'max_new_tokens = 8\n')
    summary = run_recipe(load_recipe(recipe), tmp_path / "run", console=Console(quiet=True))
    assert summary["stages"]["collect"]["status"] == "ran"
    lines = (tmp_path / "run" / "stages" / "01-collect" / "trajectories.jsonl").read_text().splitlines()
    episodes = [Trajectory.from_json(line) for line in lines]
    assert len(episodes) == 2 and all(e.env == f"openenv:{household_url}" and e.turns for e in episodes)
    assert all(e.turns[0].generated_ids for e in episodes)  # token ids kept for training


def _escaped(text: str) -> str:
    import re

    return re.escape(text)
