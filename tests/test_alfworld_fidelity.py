"""Fidelity: exported household tasks played through the native engine and the real ALFWorld engine.

The same command sequence (the expert plan, interleaved with look / inventory / help / examine /
an invalid command / going where we already are) must give the same observations after ALFWorld's
normalisation, the same admissible commands at every step, and the same success.
"""

from __future__ import annotations

import pytest

pytest.importorskip("alfworld", reason="the real ALFWorld engine is the alfworld extra")
pytest.importorskip("textworld")

from turnforge.envs.base import load_tasks, make_env  # noqa: E402
from turnforge.envs.household.alfworld_engine import normalize_observation  # noqa: E402
from turnforge.envs.household.catalog import TASK_TYPES  # noqa: E402
from turnforge.envs.household.export import export_games  # noqa: E402
from turnforge.types import Message  # noqa: E402

pytestmark = pytest.mark.integration
N_TASKS = 12  # two of each of the six task types (types cycle in every split)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tasks = load_tasks("household", "test", limit=N_TASKS)
    out = tmp_path_factory.mktemp("alfworld_games")
    export_games(tasks, out)
    return tasks, {t.id: t for t in load_tasks("alfworld", "test", data_dir=str(out))}


def _probe_commands(native) -> list[str]:
    w = native.world
    return ["look", "inventory", "help", f"examine {w.held or 'apple 1'}", "fly to the moon",
            f"go to {w.at or 'nowhere'}", "Go To " + next(iter(w.receptacles))]


def test_export_covers_every_task_type_with_folders_named_by_task_id(exported):
    tasks, games = exported
    assert sorted(games) == sorted(t.id for t in tasks)
    assert {t.category for t in tasks} == set(TASK_TYPES)
    assert all(games[t.id].category == t.category for t in tasks)


def test_same_transcripts_admissible_sets_and_success(exported):
    tasks, games = exported
    native = make_env("household", grammar="0.4")
    real = make_env("alfworld", planner=False)
    for task in tasks:
        intro_n, intro_r = native.reset(task)[1].content, real.reset(games[task.id])[1].content
        assert intro_n == normalize_observation(intro_r), task.id
        done = False
        while not done:
            probes = _probe_commands(native) if native.steps < 14 else []
            for command in probes + [native.expert_reply().content]:
                step_n = native.step(Message("assistant", command))
                step_r = real.step(Message("assistant", command))
                seen_n, seen_r = step_n.messages[0].content, normalize_observation(step_r.messages[0].content)
                assert seen_n == seen_r, (task.id, command)
                assert step_n.info["won"] == step_r.info["won"], (task.id, command)
                if step_n.done or step_r.done:
                    done = True
                    break
                assert native.admissible_actions() == real.admissible_actions(), (task.id, command)
        assert native.score().success and real.score().success, task.id


@pytest.mark.slow  # ~18 s: the expert's plan lengths, not a verdict (the verdicts: the test above)
def test_native_expert_plans_are_no_longer_than_alfworld_planner(exported):
    """ALFWorld's own PDDL planner (Fast Downward, `policy_commands`) on the same games."""
    tasks, games = exported
    native = make_env("household", grammar="0.4")
    real = make_env("alfworld", planner=True)
    for task in tasks:
        native.reset(task)
        real.reset(games[task.id])
        for env in (native, real):
            result = None
            while result is None or not result.done:
                result = env.step(env.expert_reply())
            assert result.info["won"], (task.id, env.name)
        assert native.steps <= real.steps, (task.id, native.steps, real.steps)
