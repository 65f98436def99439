"""What one service episode acts on: the agent's DB and toolkit and, in a dual-control domain (telecom), the
user's DB and the user's own toolkit, kept in step by the domain's `sync` (tau2's `Environment`).

As tau2's `Environment`: a tool call from either side is run on its side's toolkit and followed by a sync
(`get_response`; a failure of either is the call's "Error: ..." observation); the task's `initial_state` is
applied before the conversation (`set_state`: `initialization_data` merged into the agent / user DB, each
`initialization_actions` function run, then a sync); `run_function` calls any public method of either side
(setup functions and `env_assertions` checks, which are not tools); gold actions are applied without syncs
between them (`make_tool_call`). Assertions read the state as it is: the env syncs after every step, so it is
already what tau2's replay ends with.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from turnforge.envs.service.episode_db import EpisodeDB, canonical_json
from turnforge.envs.service.toolkit import Toolkit, ToolResult, to_json_str

if TYPE_CHECKING:
    from turnforge.envs.service.domain import Domain

SIDES = ("assistant", "user")  # tau2's requestor / env_type values


class EpisodeState:
    """One episode's DBs and toolkits, built for `task` (its `initialization_data` included, not yet its actions)."""

    def __init__(self, domain: Domain, task: dict):
        self.domain = domain
        self.db: EpisodeDB = domain.new_db(task)
        self.tools: Toolkit = domain.toolkit(self.db, task)
        self.user_db: BaseModel | None = domain.new_user_db(task)
        user = domain.kind.user
        self.user_tools: Toolkit | None = None
        if user is not None and not user.db_file:  # the user works on the agent's DB (banking_knowledge)
            self.user_tools = user.toolkit(self.db)
        elif user is not None and self.user_db is not None:
            self.user_tools = user.toolkit(self.user_db)
        self.sync()  # tau2 syncs when an environment is built

    def toolkit(self, side: str) -> Toolkit:
        if side not in SIDES:
            raise ValueError(f"unknown side {side!r}: tau2's requestor / env_type is 'assistant' or 'user'")
        if side == "user":
            if self.user_tools is None:
                raise ValueError(f"service domain {self.domain.name!r} has no user tools (not a dual-control domain)")
            return self.user_tools
        return self.tools

    def sync(self) -> None:
        user = self.domain.kind.user
        if user is not None and user.sync is not None and self.user_tools is not None:
            user.sync(self.tools, self.user_tools)

    def call(self, name: str, arguments: dict[str, Any], side: str = "assistant", sync: bool = True) -> ToolResult:
        """A tool call from `side`, then the sync (tau2 `get_response`; `sync=False`: `make_tool_call`). A user's call
        in a domain whose user has no tools is tau2's error observation, not an exception."""
        if side == "user" and self.user_tools is None:
            return ToolResult(to_json_str("Error: User tools not available"), True)
        result = self.toolkit(side).call(name, arguments)
        if sync and not result.error:
            try:
                self.sync()
            except Exception as e:  # tau2 runs the sync inside the call's try: its failure is the call's error
                return ToolResult(to_json_str(f"Error: {e}"), True)
        return result

    def run_function(self, side: str, name: str, arguments: dict[str, Any]) -> Any:
        """Any public method of `side`'s toolkit (setup functions, assertions), then the sync; raises on failure."""
        toolkit = self.toolkit(side)
        function = getattr(toolkit, name, None) if not name.startswith("_") else None
        if not callable(function):
            raise ValueError(f"{type(toolkit).__name__} has no function {name!r} (tau2 env_type {side!r})")
        out = function(**(arguments or {}))
        self.sync()
        return out

    def apply_initial_state(self, task: dict) -> None:
        """The task's `initialization_actions`, in order (its `initialization_data` is in the DBs already)."""
        initial = task.get("initial_state") or {}
        if initial.get("message_history"):
            raise ValueError(f"task {task.get('id')!r}: initial_state.message_history (a conversation to resume) is "
                             "not supported by the service env")
        for action in initial.get("initialization_actions") or []:
            try:
                self.run_function(action.get("env_type", "assistant"), action["func_name"], action.get("arguments"))
            except Exception as e:
                raise ValueError(f"task {task.get('id')!r}: initialization action {action.get('func_name')!r} "
                                 f"failed: {e}") from e
        self.sync()

    def assertion_met(self, assertion: dict) -> bool:
        """tau2's `run_env_assertion`: the function's bool result equals `assert_value` (default True).
        Departure: a function that raises or returns a non-bool counts as not met (tau2 raises)."""
        side, name = assertion.get("env_type", "assistant"), assertion["func_name"]
        toolkit = self.toolkit(side)
        function = getattr(toolkit, name, None) if not name.startswith("_") else None
        if not callable(function):
            return False
        try:
            out = function(**(assertion.get("arguments") or {}))
        except Exception:  # a failing check is a failed check, never a crashed grading
            return False
        return isinstance(out, bool) and out == assertion.get("assert_value", True)

    def same_state(self, other: EpisodeState) -> bool:
        """tau2's DB check: the agent DBs hash alike and so do the user DBs."""
        if not self.db.same_state(other.db):
            return False
        return self.user_db is None or canonical_json(self.user_db) == canonical_json(other.user_db)


def merged(model: BaseModel, update: dict) -> BaseModel:
    """tau2's `update_pydantic_model_with_dict`: the model's dump deep-merged with `update` (dicts merge key by
    key, anything else is replaced, as addict's `Dict.update`), validated again."""
    return type(model).model_validate(_merge(model.model_dump(), update))


def _merge(base: Any, update: Any) -> Any:
    if isinstance(base, dict) and isinstance(update, dict):
        out = dict(base)
        for key, value in update.items():
            out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(update)
