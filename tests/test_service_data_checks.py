"""Service data mistakes are found at load, one line each (file, task id, field), never scored or dumped.

Issue 40 defect 7: a task without user_scenario or with a gold call to a tool the domain lacks was scored as a
success; a data_dir of another domain printed pydantic's dump (17,659 lines for airline data read as retail).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.envs.base import load_tasks
from turnforge.envs.service.data_checks import SHOWN, DomainDataError
from turnforge.envs.service.domain import load_domain


def _desk_tasks(tmp_path, edit) -> str:
    """The built-in desk tasks, edited by `edit(tasks)`, saved as a tasks file."""
    tasks = [dict(t) for t in load_domain("desk").tasks.values()]
    edit(tasks)
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(tasks))
    return str(path)


def test_a_task_without_user_scenario_and_a_gold_call_to_no_tool_are_named(tmp_path):
    def edit(tasks):
        del tasks[0]["user_scenario"]
        criteria = json.loads(json.dumps(tasks[1]["evaluation_criteria"]))
        criteria["actions"][0]["name"] = "teleport_patient"
        tasks[1]["evaluation_criteria"] = criteria

    path = _desk_tasks(tmp_path, edit)
    with pytest.raises(DomainDataError) as caught:
        load_tasks("service", "test", domain="desk", tasks=path)
    first, second = (load_domain("desk").tasks[i] for i in list(load_domain("desk").tasks)[:2])
    assert caught.value.problems == [
        f"{path} task {first['id']!r}: no user_scenario (the simulated user's instructions; tau2 requires it)",
        f"{path} task {second['id']!r}: evaluation_criteria.actions[0].name 'teleport_patient' is not a tool of "
        "this domain's assistant",
    ]


def test_many_problems_are_listed_once_each_and_capped(tmp_path):
    def edit(tasks):
        for t in tasks:
            t.pop("user_scenario")

    path = _desk_tasks(tmp_path, edit)
    with pytest.raises(DomainDataError) as caught:
        load_domain("desk", tasks_file=path)
    n = len(load_domain("desk").tasks)
    assert n > SHOWN and len(caught.value.problems) == n
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 + SHOWN + 1 and lines[-1] == f"... and {n - SHOWN} more"


def test_another_domains_data_dir_is_one_line_and_a_clean_exit(tmp_path):
    """Airline-shaped tables read as retail: one line naming the file and the tables, exit 2, no pydantic dump."""
    (tmp_path / "db.json").write_text(json.dumps({"flights": {}, "users": {}, "reservations": {}}))
    (tmp_path / "policy.md").write_text("policy")
    (tmp_path / "tasks.json").write_text("[]")
    result = CliRunner().invoke(app, ["eval", "--env", "service", "--env-opt", "domain=retail", "--env-opt",
                                      f"data_dir={tmp_path}", "--policy", "expert", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("error: service domain 'retail': 1 problem(s) in its data")
    assert lines[1].strip().startswith(f"{tmp_path / 'db.json'}: tables ['flights', 'reservations', 'users'], but "
                                       "this domain's DB has ['orders', 'products', 'users']")
    assert len(lines) == 2 and "Traceback" not in result.output and "validation error" not in result.output
