"""What the OpenEnv tests share: the tau2 retail options, openenv clients, expert episodes, an app on a port.

Imported by tests/test_openenv_serve.py and tests/test_openenv_url.py after `pytest.importorskip("openenv")`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from openenv import GenericEnvClient

from turnforge.envs.base import make_env
from turnforge.rollouts_file import run_eval
from turnforge.types import Trajectory

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
RETAIL = {"domain": "retail", "data_dir": str(TAU2 / "retail")}
needs_tau2 = pytest.mark.skipif(not (TAU2 / "retail" / "db.json").is_file(), reason="../shared/data/tau2 absent")


@pytest.fixture(autouse=True)
def forget_servers():
    """A URL's facts are cached per process; a later test's server may get a port an earlier one had."""
    from turnforge.envs.openenv_url import remote_env_spec, server_facts

    server_facts.cache_clear(), remote_env_spec.cache_clear()


def client(url: str):
    return GenericEnvClient(base_url=url).sync()


def expert_run(env: str, options: dict, tasks: int, out: Path, samples: int = 1) -> tuple[dict, list[Trajectory]]:
    summary = run_eval(env, options, "expert", "test", tasks, samples, 0, out)
    return summary, [Trajectory.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def replies(traj: Trajectory) -> list[str]:
    return [traj.messages[i].content for i in traj.reply_indices()]


def play(session, traj: Trajectory, how: str = "text", options: dict | None = None):
    """Replay an episode's replies through a GenericEnvClient session; the last step's result and the state. `how`:
    "text" (`{"text": reply}`), "stored" (`{"message": m}` with the assistant message as episodes.jsonl stores it: the
    model's text, tool calls included, in `content`) or "parsed" (as turnforge's own client sends them: the env's
    format parses here, a reply with calls goes as that message, any other as its text)."""
    first = session.reset(task_id=traj.task_id, sample=traj.sample)
    assert first.observation["messages"] == [m.to_dict() for m in traj.between_replies()[0]]
    assert first.observation["tools"] == traj.tools
    env = make_env(traj.env, **(options or {})) if how == "parsed" else None
    for i in traj.reply_indices():
        message = traj.messages[i]
        action = {"text": message.content}
        if how == "stored":
            action = {"message": message.to_dict()}
        elif env is not None:
            parsed = env.format.parse(message.content)
            if getattr(parsed, "tool_calls", None):
                action = {"message": parsed.to_dict()}
        result = session.step(action)
    return result, session.state()


@contextlib.contextmanager
def serving(app):
    """An OpenEnv app (openenv's own server classes) on a free loopback port, in a thread."""
    from turnforge.policies.serve import app_in_thread

    with app_in_thread(app) as url:
        yield url
