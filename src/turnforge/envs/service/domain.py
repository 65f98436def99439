"""A domain = policy text + a toolkit over a pydantic DB + tasks in tau2's schema (+ in a dual-control domain,
the user's own DB and toolkit, and the sync between the two sides: `UserSide`).

Loaded from a data folder in tau2-bench's layout (`db.json` or `db.toml`, `policy.md`, `tasks.json`, optional
`split_tasks.json`; telecom: `main_policy.md` + `tech_support_manual.md`, `user_db.toml`) or built in (`desk`).
A loaded domain is cached per process (the airline DB is parsed once, 7 MB), and so is each task's gold state (its initial state, then the gold actions of both sides applied
to a fresh episode), which every episode of that task is compared with. A task whose `initial_state` carries
`initialization_data.agent_data` gets its own parsed base, built once.
"""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from turnforge.envs.service.data_checks import DomainDataError, db_problems, task_problems
from turnforge.envs.service.episode_db import EpisodeDB, SharedDB
from turnforge.envs.service.state import EpisodeState, merged
from turnforge.envs.service.toolkit import ToolKind, Toolkit
from turnforge.types import Task

ENV_NAME = "service"


@dataclass
class UserSide:
    """The user's half of a dual-control domain: their DB (`db_file` in the data folder; "" = the user works on the
    agent's DB, as in banking_knowledge), their tools, and `sync(agent_tools, user_tools)`, which tau2 runs after
    every step to carry each side's state to the other (None: nothing to carry)."""

    db_model: type[BaseModel]
    toolkit: type[Toolkit]
    db_file: str
    sync: Callable[[Toolkit, Toolkit], None] | None


@dataclass
class DomainKind:
    """What a domain is made of, whatever folder its data comes from."""

    name: str
    db_model: type[BaseModel]
    toolkit: type[Toolkit]
    policy_files: tuple[str, ...] = ("policy.md",)
    compose_policy: Callable[[Path], str] | None = None
    """Domains whose policy is several files: data folder -> the policy text."""
    user: UserSide | None = None
    builtin: Callable[[], tuple[dict, str, list[dict], dict[str, list[str]] | None]] | None = None
    """Built-in domains: () -> (db dict, policy text, tasks, splits)."""
    retrieval: Callable[[Path, str], DomainKind] | None = None
    """Domains with retrieval variants (banking_knowledge): (data folder, variant name) -> the kind that serves it."""
    task_policy: Callable[[dict], str] | None = None
    """A policy that depends on the task (banking_knowledge's golden_retrieval): task -> policy text."""


@dataclass
class Gold:
    """A task's gold state, and for each gold write action the records it changed (partial score): every write of the
    agent, and each write of the user that changed records of the agent's DB (banking's user shares it)."""

    state: EpisodeState
    write_records: list[dict[str, set[str]]]
    errors: list[str]

    @property
    def db(self) -> EpisodeDB:
        return self.state.db


@dataclass
class Domain:
    kind: DomainKind
    shared: SharedDB
    policy: str
    tasks: dict[str, dict]
    splits: dict[str, list[str]]
    source: str
    user_db: BaseModel | None = None
    _gold: dict[str, Gold] = field(default_factory=dict)
    _bases: dict[str, SharedDB] = field(default_factory=dict)
    _do_nothing: dict[str, bool] = field(default_factory=dict)  # env.do_nothing_wins, once per task
    _lock: threading.RLock = field(default_factory=threading.RLock)  # re-entered: a gold state builds a task's base

    @property
    def name(self) -> str:
        return self.kind.name

    def new_db(self, task: dict | None = None) -> EpisodeDB:
        """A fresh episode DB (with the task's `initialization_data.agent_data` merged in, if any)."""
        update = _init_data(task, "agent_data")
        if not update:
            return EpisodeDB(self.shared)
        with self._lock:
            if task["id"] not in self._bases:
                self._bases[task["id"]] = SharedDB(merged(self.shared.model, update))
        return EpisodeDB(self._bases[task["id"]])

    def new_user_db(self, task: dict | None = None) -> BaseModel | None:
        """A fresh copy of the user's DB (dual-control domains; `initialization_data.user_data` merged in)."""
        if self.user_db is None:
            return None
        update = _init_data(task, "user_data")
        return merged(self.user_db, update) if update else self.user_db.model_copy(deep=True)

    def new_state(self, task: dict) -> EpisodeState:
        """An episode's state with the task's initial state applied."""
        state = EpisodeState(self, task)
        state.apply_initial_state(task)
        return state

    def toolkit(self, db: EpisodeDB, task: dict | None = None) -> Toolkit:
        """The agent's toolkit over `db`, set up for `task` (`Toolkit.start_task`)."""
        tools = self.kind.toolkit(db)
        if task is not None:
            tools.start_task(task)
        return tools

    def policy_for(self, task: dict) -> str:
        """The agent's policy in an episode of `task` (the domain's, unless it depends on the task)."""
        return self.kind.task_policy(task) if self.kind.task_policy is not None else self.policy

    def tool_kinds(self) -> dict[str, ToolKind]:
        return self.kind.toolkit.tool_kinds()

    def gold(self, task_id: str) -> Gold:
        """The gold DB of `task_id`: tau2 applies the gold actions to a fresh env, ignoring their errors."""
        with self._lock:
            if task_id not in self._gold:
                self._gold[task_id] = self._make_gold(self.tasks[task_id])
            return self._gold[task_id]

    def _make_gold(self, task: dict) -> Gold:
        state = self.new_state(task)
        db = state.db
        kinds = {"assistant": self.tool_kinds(), "user": self.kind.user.toolkit.tool_kinds() if self.kind.user else {}}
        records, errors = [], []
        for action in (task.get("evaluation_criteria") or {}).get("actions") or []:
            side = action.get("requestor", "assistant")
            before = {n: {k: db.record_json(n, k) for k in keys} for n, keys in db.touched().items()}
            try:  # tau2 make_tool_call: no sync between gold actions
                result = state.call(action["name"], dict(action.get("arguments") or {}), side, sync=False)
            except ValueError as e:  # a user action in a domain without user tools
                errors.append(f"{action['name']}: {e}")
                continue
            if result.error:
                errors.append(f"{action['name']}: {result.content}")
            if kinds.get(side, {}).get(action["name"]) == ToolKind.WRITE:
                changed = {
                    n: {k for k in keys if db.record_json(n, k) != before.get(n, {}).get(k, db.shared.record_json(n, k))}
                    for n, keys in db.touched().items()
                }
                changed = {n: ks for n, ks in changed.items() if ks}
                if side == "assistant" or changed:  # a user's write on its own device (telecom) changes no record here
                    records.append(changed)
        return Gold(state=state, write_records=records, errors=errors)

    def split_ids(self, split: str) -> list[str]:
        if split not in self.splits:
            raise ValueError(f"domain {self.name!r} ({self.source}) has no split {split!r}; it has {sorted(self.splits)}")
        return self.splits[split]

    def to_task(self, task_id: str, split: str) -> Task:
        # The task travels whole in Task.data (stages may rename Task.id, e.g. GRPO's "id#k" group copies).
        return Task(id=task_id, env=ENV_NAME, split=split, category=self.name, data=self.tasks[task_id])


_KINDS: dict[str, DomainKind] = {}
_LOADED: dict[tuple[str, str, str], Domain] = {}
_LOAD_LOCK = threading.Lock()


def register_domain(kind: DomainKind) -> DomainKind:
    _KINDS[kind.name] = kind
    return kind


def domain_names() -> tuple[str, ...]:
    """The domains `--env-opt domain=` accepts."""
    _register_builtin()
    return tuple(sorted(_KINDS))


def load_domain(name: str, data_dir: str = "", tasks_file: str = "", retrieval: str = "") -> Domain:
    """The domain `name`, from `data_dir` (tau2's layout) or built in; `tasks_file` replaces its tasks; `retrieval`
    names the retrieval variant of a domain that has them (banking_knowledge; "" = its default)."""
    _register_builtin()
    if name not in _KINDS:
        raise ValueError(f"unknown service domain {name!r}; choose one of {', '.join(sorted(_KINDS))}")
    if retrieval and _KINDS[name].retrieval is None:
        raise ValueError(f"retrieval={retrieval!r} applies to banking_knowledge only; service domain {name!r} has no "
                         "knowledge base")
    key = (name, str(Path(data_dir).resolve()) if data_dir else "", str(Path(tasks_file).resolve()) if tasks_file else "",
           retrieval)
    with _LOAD_LOCK:
        if key not in _LOADED:
            _LOADED[key] = _load(_KINDS[name], data_dir, tasks_file, retrieval)
        return _LOADED[key]


def _load(kind: DomainKind, data_dir: str, tasks_file: str, retrieval: str = "") -> Domain:
    if data_dir:
        folder = Path(data_dir)
        if not folder.is_dir():
            raise ValueError(f"service domain {kind.name!r}: data_dir {folder} is not a folder (tau2's "
                             "data/tau2/domains/<domain>/ layout: db.json or db.toml, policy.md, tasks.json)")
        if kind.retrieval is not None:
            kind = kind.retrieval(folder, retrieval)
        db_path, raw_db, policy, tasks, splits = _read_folder(kind, folder)
        db_source, tasks_source, source = str(db_path), str(folder / "tasks.json"), str(folder)
    elif kind.builtin is not None:
        raw_db, policy, tasks, splits = kind.builtin()
        db_source = tasks_source = source = "built in"
    else:
        raise ValueError(f"service domain {kind.name!r} needs its data: --env-opt data_dir=PATH/tau2-bench/data/tau2/"
                         f"domains/{kind.name}")
    if tasks_file:
        tasks, splits, tasks_source = _read_json(Path(tasks_file)), None, tasks_file
        source += f" + tasks {tasks_file}"
    db, problems = _validated(kind.db_model, raw_db, db_source)
    problems += task_problems(tasks, tasks_source, kind.toolkit, kind.user.toolkit if kind.user else None)
    user_db = None
    if data_dir and kind.user is not None and kind.user.db_file:
        user_path, raw_user_db = _read_user_db(kind, folder)
        user_db, user_problems = _validated(kind.user.db_model, raw_user_db, str(user_path))
        problems += user_problems
    if problems:
        raise DomainDataError(kind.name, problems)
    by_id = {str(t["id"]): {**t, "id": str(t["id"])} for t in tasks}
    if splits is None:  # no split file: every task is in every split
        splits = {s: list(by_id) for s in ("train", "test", "base")}
    splits = {s: [i for i in ids if i in by_id] for s, ids in splits.items()}
    return Domain(kind=kind, shared=SharedDB(db), policy=policy, tasks=by_id, splits=splits, source=source,
                  user_db=user_db)


def _validated(model: type[BaseModel], raw: Any, where: str) -> tuple[BaseModel | None, list[str]]:
    """(the parsed DB, []) or (None, its problems)."""
    try:
        return model.model_validate(raw), []
    except ValidationError as e:
        return None, db_problems(raw, where, model, e)


def _read_folder(kind: DomainKind, folder: Path) -> tuple[Path, dict, str, list[dict], dict | None]:
    db_path = next((folder / f for f in ("db.json", "db.toml") if (folder / f).is_file()), None)
    if db_path is None:
        raise ValueError(f"{folder} holds no db.json or db.toml")
    raw_db = _read_json(db_path) if db_path.suffix == ".json" else tomllib.loads(db_path.read_text(encoding="utf-8"))
    if kind.compose_policy is not None:
        policy = kind.compose_policy(folder)
    else:
        policy_path = next((folder / p for p in kind.policy_files if (folder / p).is_file()), None)
        if policy_path is None:
            raise ValueError(f"{folder} holds none of {', '.join(kind.policy_files)}")
        policy = policy_path.read_text(encoding="utf-8")
    tasks = _read_json(folder / "tasks.json")
    split_file = folder / "split_tasks.json"
    splits = _read_json(split_file) if split_file.is_file() else None
    return db_path, raw_db, policy, tasks, splits


def _read_user_db(kind: DomainKind, folder: Path) -> tuple[Path, Any]:
    """The path and raw content of the user's DB of a dual-control domain."""
    path = folder / kind.user.db_file
    if not path.is_file():
        raise ValueError(f"service domain {kind.name!r}: {path} does not exist (the user's device DB of tau2's "
                         f"data/tau2/domains/{kind.name}/)")
    return path, tomllib.loads(path.read_text(encoding="utf-8")) if path.suffix == ".toml" else _read_json(path)


def _init_data(task: dict | None, side: str) -> dict | None:
    """The task's `initial_state.initialization_data.<side>` (agent_data / user_data), if any."""
    data = ((task or {}).get("initial_state") or {}).get("initialization_data") or {}
    return data.get(side)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def _register_builtin() -> None:
    if _KINDS:
        return
    from turnforge.envs.service.airline.db import FlightDB
    from turnforge.envs.service.airline.tools import AirlineTools
    from turnforge.envs.service.banking import BANKING
    from turnforge.envs.service.desk import DESK
    from turnforge.envs.service.retail.db import RetailDB
    from turnforge.envs.service.retail.tools import RetailTools
    from turnforge.envs.service.telecom import TELECOM

    register_domain(DomainKind("retail", RetailDB, RetailTools))
    register_domain(DomainKind("airline", FlightDB, AirlineTools))
    register_domain(TELECOM)
    register_domain(BANKING)
    if DESK is not None:
        register_domain(DESK)
