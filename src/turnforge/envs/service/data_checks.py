"""Checks of a service domain's data at load: every problem found, one line each (file, task id, field).

A tau2 task without `user_scenario` or with a gold action naming a tool the domain lacks used to load and be
scored (a gold call that fails changes nothing, so doing nothing matched it); a data folder of another domain
gave pydantic's dump of thousands of lines. tau2 itself refuses both (`Task.user_scenario` is required;
`ToolKitBase.use_tool` raises on an unknown tool name), so these are data mistakes, found before any episode.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from turnforge.envs.service.toolkit import Toolkit

SHOWN = 20  # problems listed in full; the rest are counted


class DomainDataError(ValueError):
    """The problems in a domain's data, one line each."""

    def __init__(self, domain: str, problems: list[str]):
        self.problems = problems
        shown = problems[:SHOWN]
        more = [f"... and {len(problems) - SHOWN} more"] if len(problems) > SHOWN else []
        super().__init__("\n".join([
            f"service domain {domain!r}: {len(problems)} problem(s) in its data; fix them or point data_dir / "
            f"tasks at tau2's data/tau2/domains/{domain}:", *(f"  {p}" for p in shown), *more]))


def task_problems(tasks: Any, where: str, agent_tools: type[Toolkit], user_tools: type[Toolkit] | None) -> list[str]:
    """What keeps each task of `tasks` (tau2's tasks.json, read from `where`) from being played and graded."""
    if not isinstance(tasks, list):
        return [f"{where}: a list of tasks expected, got {type(tasks).__name__}"]
    tools = {"assistant": set(agent_tools.tool_kinds()), "user": set(user_tools.tool_kinds()) if user_tools else set()}
    problems: list[str] = []
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or task.get("id") is None:
            problems.append(f"{where} task #{i}: no id (each task is an object with an \"id\")")
            continue
        label = f"{where} task {str(task['id'])!r}"
        if str(task["id"]) in seen:
            problems.append(f"{label}: id given twice (the second copy would replace the first)")
        seen.add(str(task["id"]))
        problems += [f"{label}: {p}" for p in _scenario_problems(task.get("user_scenario"))]
        problems += [f"{label}: {p}" for p in _action_problems(task.get("evaluation_criteria"), tools)]
    return problems


def _scenario_problems(scenario: Any) -> list[str]:
    if not isinstance(scenario, dict):
        return ["no user_scenario (the simulated user's instructions; tau2 requires it)"]
    if not scenario.get("instructions"):
        return ["user_scenario.instructions is empty (the simulated user would not know why it calls)"]
    return []


def _action_problems(criteria: Any, tools: dict[str, set[str]]) -> list[str]:
    if criteria is None:
        return []
    if not isinstance(criteria, dict):
        return ["evaluation_criteria is not an object"]
    actions = criteria.get("actions") or []
    if not isinstance(actions, list):
        return ["evaluation_criteria.actions is not a list"]
    problems = []
    for j, action in enumerate(actions):
        field = f"evaluation_criteria.actions[{j}]"
        if not isinstance(action, dict):
            problems.append(f"{field} is not an object")
            continue
        side = action.get("requestor", "assistant")
        if side not in tools:
            problems.append(f"{field}.requestor is {side!r}; it is 'assistant' or 'user'")
        elif action.get("name") not in tools[side]:
            problems.append(f"{field}.name {action.get('name')!r} is not a tool of this domain's {side}")
        if not isinstance(action.get("arguments") or {}, dict):
            problems.append(f"{field}.arguments is not an object")
    return problems


def db_problems(raw_db: Any, where: str, model: type[BaseModel], error: ValidationError) -> list[str]:
    """Why `raw_db` (read from `where`) failed `model`'s validation (`error`): its top-level tables when they
    differ (another domain's data does), else pydantic's errors one line each (never its dump)."""
    if not isinstance(raw_db, dict):
        return [f"{where}: an object of tables expected, got {type(raw_db).__name__}"]
    expected = set(model.model_fields)
    missing, extra = sorted(expected - set(raw_db)), sorted(set(raw_db) - expected)
    if missing or extra:
        return [f"{where}: tables {sorted(raw_db)}, but this domain's DB has {sorted(expected)} "
                f"(missing {missing}, unknown {extra}): is data_dir another domain's folder?"]
    return [f"{where} at {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in error.errors()]
