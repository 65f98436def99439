"""`--env openenv:URL` (issue 42, requirement 2): against servers written here with openenv's own server classes
(a text action, a structured action, an MCP env) and against `turnforge env serve` (a round trip gives the direct
env's episodes and scores). Loopback only; tau2 retail tests skip when ../shared/data/tau2 is absent."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from openenv_servers import RETAIL, expert_run, forget_servers, needs_tau2, serving  # noqa: E402, F401
from turnforge.envs.base import make_env  # noqa: E402
from turnforge.integrations.openenv.server import running_server  # noqa: E402
from turnforge.rollouts_file import run_eval  # noqa: E402
from turnforge.types import Trajectory  # noqa: E402

# tool_calls: the direct env names its format in its options, an OpenEnv URL env learns it from the server at reset,
# so only the direct run's summary can say how the calls were written (eval/metrics.py, tool_call_quality).
TIMING_KEYS = {"wall_s", "wall_s_invocation", "env", "env_options", "policy", "tool_calls"}


@pytest.mark.parametrize("policy", ["replay", "expert"])
@pytest.mark.parametrize(("env", "options"), [
    ("household", {"thoughts": "goal"}), pytest.param("service", RETAIL, marks=needs_tau2)])
def test_eval_through_openenv_url_gives_the_direct_envs_summary_and_episodes(env, options, policy, tmp_path):
    """The round trip: `--env openenv:URL` against `turnforge env serve` gives the direct env's summary (pass@k and
    pass^k of 2 samples) and episodes, with the direct run's replies replayed and with the expert asked through the
    server ({"type": "expert"}); a run killed half way resumes to the same summary."""
    direct, episodes = expert_run(env, options, 5, tmp_path / "direct", samples=2)
    spec = f"replay:{tmp_path / 'direct' / 'episodes.jsonl'}" if policy == "replay" else "expert"
    with running_server(env, options, "test") as url:
        run_eval(f"openenv:{url}", {}, spec, "test", 5, 2, 0, tmp_path / "remote")
        episodes_file = tmp_path / "remote" / "episodes.jsonl"
        episodes_file.write_text("".join(line + "\n" for line in episodes_file.read_text().splitlines()[:4]))
        (tmp_path / "remote" / "summary.json").unlink()
        remote = run_eval(f"openenv:{url}", {}, spec, "test", 5, 2, 0, tmp_path / "remote")  # resumes
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


def test_a_server_at_capacity_says_to_lower_limit_open(tmp_path):
    """Issue 53: more episodes open than the server's --max-sessions failed them with openenv's "Server at capacity",
    which did not say what to change; a run at --limit-open within it is fine."""
    from turnforge.rollout import RolloutLimits
    from turnforge.rollouts_file import EnvErrors

    with running_server("household", {}, "test", max_sessions=1) as url:
        with pytest.raises(EnvErrors, match=r"Server at capacity: 1/1 sessions active.*lower --limit-open.*--max-sessions"):
            run_eval(f"openenv:{url}", {}, "expert", "test", 4, 1, 0, tmp_path / "wide", limits=RolloutLimits(max_open=4))
        assert run_eval(f"openenv:{url}", {}, "expert", "test", 4, 1, 0, tmp_path / "narrow",
                        limits=RolloutLimits(max_open=1))["success"] == 1.0


def test_collect_on_an_openenv_url_writes_training_data(tiny_model_dir, tmp_path):
    """A training-data path end to end on a remote env: a recipe's collect stage (the tiny hf model) on openenv:URL."""
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    recipe = tmp_path / "remote.toml"
    with running_server("household", {}, "test") as url:
        recipe.write_text(f'[model]\nname = "{tiny_model_dir}"\n\n[env]\nname = "openenv:{url}"\n\n'
                          '[[stages]]\nkind = "collect"\npolicy = "hf"\nsplit = "test"\ntasks = 2\nmax_turns = 2\n'
                          'max_new_tokens = 8\n')
        summary = run_recipe(load_recipe(recipe), tmp_path / "run", console=Console(quiet=True))
    assert summary["stages"]["collect"]["status"] == "ran"
    lines = (tmp_path / "run" / "stages" / "01-collect" / "trajectories.jsonl").read_text().splitlines()
    episodes = [Trajectory.from_json(line) for line in lines]
    assert len(episodes) == 2 and all(e.env == f"openenv:{url}" and e.turns for e in episodes)
    assert all(e.turns[0].generated_ids for e in episodes)  # token ids kept for training


def test_openenv_url_without_the_openenv_package_names_the_extra(monkeypatch):
    import sys

    from turnforge.envs.base import get_env_spec

    monkeypatch.setitem(sys.modules, "openenv", None)  # as if not installed: importing it raises ImportError
    monkeypatch.delitem(sys.modules, "turnforge.envs.openenv_url")
    with pytest.raises(ValueError, match=r"needs the openenv package .*pip install 'turnforge\[openenv\]'"):
        get_env_spec("openenv:http://127.0.0.1:9")


def test_dpo_mining_on_an_openenv_url_finds_the_direct_envs_pairs(tmp_path):
    """DPO mining replays episodes in the env and reads each step's defects, progress and the expert: through
    `turnforge env serve` it mines the pairs it mines in-process (random episodes: invalid actions, loops, ...)."""
    from functools import partial

    from turnforge.data.dpo_pairs.mining import mine_dpo_pairs
    from turnforge.envs.base import tasks_of

    def mined(trajectories, env_name):
        pairs = mine_dpo_pairs(trajectories, partial(make_env, env_name), tasks_of(trajectories, env_name))
        return sorted((p.task_id, p.turn, p.reason, p.chosen_from, p.chosen, p.rejected, str(p.messages)) for p in pairs)

    run_eval("household", {}, "random", "test", 4, 2, 0, tmp_path / "direct")
    direct = [Trajectory.from_json(line) for line in (tmp_path / "direct" / "episodes.jsonl").read_text().splitlines()]
    with running_server("household", {}, "test") as url:
        name = f"openenv:{url}"
        run_eval(name, {}, f"replay:{tmp_path / 'direct' / 'episodes.jsonl'}", "test", 4, 2, 0, tmp_path / "remote")
        remote = [Trajectory.from_json(line) for line in (tmp_path / "remote" / "episodes.jsonl").read_text().splitlines()]
        assert mined(remote, name) == mined(direct, "household") != []
