"""turnforge's tool envs under TRL's own `GRPOTrainer(environment_factory=...)` (TRL >= 1.16, transformers >= 5.2).

    from trl import GRPOConfig, GRPOTrainer
    from turnforge.integrations.trl import env_reward, environment_factory, task_dataset

    trainer = GRPOTrainer(model=MODEL, reward_funcs=env_reward, args=GRPOConfig(...),
                          train_dataset=task_dataset("code", "train", generate=200),
                          environment_factory=environment_factory("code", generate=200))

TRL's contract (its `grpo_trainer.py` and docs/source/openenv.md): one environment object per rollout, built
with no arguments and reused (`reset(**row)` receives every dataset column); its public methods are the tools
(schemas from their type hints and docstrings); the multi-turn loop runs tool calls until the model answers
without one; reward functions receive the rollouts' `environments`. Here:

- `task_dataset` rows: `prompt` (the env's opening messages: system, first user message; tau2's greeting too),
  `task_id`, `split`, and, for BFCL, `environment` (TRL's name of the tool set: each entry shows the docs of its
  own classes, so `environment_factory("bfcl")` is TRL's dict form, one class per tool set);
- each env tool is a method of the same name, docstring and argument schema (`tool_methods.py`); calling it
  applies that one call through the env (`Env.step`) and returns the env's own observation text. After the
  episode ended, a call raises, which TRL feeds back as the tool's error (its documented convention);
- `env_reward` is the env's own score (`Env.score().reward`: tau2's verdict, BFCL's checker, the code env's
  verification, DBBench's answer check). The model's last reply without a tool call is first applied as the
  env's next step (the final answer, a message to the user, the end of a BFCL turn). An episode that the env has
  not finished then (tau2's user answered; a BFCL entry has more user turns) gets the env's own verdict of an
  unfinished episode: tau2 0 ("terminated prematurely"), BFCL 0 (force-terminated). TRL's loop has one
  user turn; docs/decisions.md says what that means for tau2 and BFCL. `env_progress` (the env's progress,
  0..1) is the second reward function where that one turn cannot finish an episode (BFCL's multi-turn entries).

Envs in a text-action format (household's act_line, sql's react_sql, bfcl_python, ...) have no tools: a clear error
(household and sql in format=tool_call are tool envs: household's one tool is `act(action)`).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import datasets

from turnforge.envs.base import Env, get_env_spec, load_tasks, make_env
from turnforge.integrations.tool_methods import tool_method
from turnforge.types import Message, Score, Task, ToolCall

# BFCL shows each entry the docs of its own classes (minus miss_func holdouts): tools differ per task, and the
# env knows them only after `reset`. The other tool envs have one tool list.
TOOLS_PER_TASK = ("bfcl",)


class TurnforgeEnvironment:
    """One turnforge env episode per TRL rollout; subclasses (`environment_factory`) add one method per tool."""

    env_name: str = ""
    env_options: dict[str, Any] = {}
    _score: Score | None

    def __init__(self) -> None:
        self._env: Env = make_env(self.env_name, **self.env_options)
        self._done, self._score, self._calls = True, None, 0  # until `reset`

    def reset(self, task_id: str, split: str, **_columns: Any) -> None:
        """Start task `task_id` of `split`; the prompt is the dataset row's (TRL renders it), so None."""
        tasks = _tasks_by_id(self.env_name, split, _frozen(self.env_options))
        if task_id not in tasks:
            raise ValueError(f"task {task_id!r} is not in env {self.env_name!r} split {split!r} with options "
                             f"{self.env_options}: build the dataset with task_dataset() and the factory's options")
        self._env.reset(tasks[task_id])
        self._done, self._score, self._calls = False, None, 0

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._done:
            raise ValueError(f"the {self.env_name} episode has ended; answer without calling a tool")
        self._calls += 1
        result = self._env.step(Message("assistant", "", tool_calls=[ToolCall(name, arguments, f"call_{self._calls}")]))
        self._done = result.done
        return "\n".join(m.content for m in result.messages)

    def _final_score(self, completion: list[dict[str, Any]]) -> Score:
        """The env's score once the model's last reply, when it called no tool, has been applied (once)."""
        if self._score is None:
            last = completion[-1] if completion else {}
            if not self._done and last.get("role") == "assistant" and not last.get("tool_calls"):
                self._done = self._env.step(Message("assistant", last.get("content") or "")).done
            self._score = self._env.score()
        return self._score


def env_reward(completions: list[list[dict[str, Any]]], environments: list[TurnforgeEnvironment],
               **_kwargs: Any) -> list[float]:
    """TRL reward function: each rollout's env reward (see the module docstring for unfinished episodes)."""
    return [env._final_score(c).reward for env, c in zip(environments, completions, strict=True)]


def env_progress(completions: list[list[dict[str, Any]]], environments: list[TurnforgeEnvironment],
                 **_kwargs: Any) -> list[float]:
    """TRL reward function: each rollout's env progress (0..1; BFCL: turns correct / turns; tau2: gold writes
    done), Environment Tuning's progress reward. Where TRL's single user turn cannot finish an episode (BFCL's
    later turns), the env reward is 0 for every rollout and only this one tells them apart."""
    return [env._final_score(c).progress for env, c in zip(environments, completions, strict=True)]


def environment_factory(env_name: str, **options: Any) -> type[TurnforgeEnvironment] | dict[str, type]:
    """What `GRPOTrainer(environment_factory=...)` takes for env `env_name`: the environment class, or (BFCL,
    whose tools differ per entry) TRL's dict of classes, one per tool set, named as `task_dataset` rows name them."""
    options = _tool_env_options(env_name, options)
    if env_name not in TOOLS_PER_TASK:
        return _environment_class(env_name, options, make_env(env_name, **options).tools() or [])
    return {name: _environment_class(env_name, options, tools) for name, tools in _tool_sets(env_name, options).items()}


def task_dataset(env_name: str, split: str, limit: int | None = None, **options: Any) -> datasets.Dataset:
    """The tasks of `split` (the first `limit`) as TRL's dataset: `prompt`, `task_id`, `split` (and `environment`)."""
    options = _tool_env_options(env_name, options)
    env = make_env(env_name, **options)
    rows = []
    for task in load_tasks(env_name, split, limit=limit, **options):
        prompt = [{"role": m.role, "content": m.content} for m in env.reset(task)]
        row = {"prompt": prompt, "task_id": task.id, "split": split}
        if env_name in TOOLS_PER_TASK:
            row["environment"] = _tool_set_name(env_name, env.tools() or [])
        rows.append(row)
    return datasets.Dataset.from_list(rows)


def _tool_env_options(env_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The validated options of a tool env that TRL can run alone; otherwise a clear error."""
    spec = get_env_spec(env_name)
    options = spec.coerce_options(options)
    env = make_env(env_name, **options)
    if not env.format.uses_tools:
        fmt = spec.resolve(options).get("format", "")
        raise ValueError(f"env {env_name!r} (format {fmt}) acts by text, not tool calls, and TRL's environment_factory "
                         "offers tools only (the env's methods); use a tool format (format=tool_call where the env "
                         "has one) or turnforge's own GRPO stage (docs/decisions.md)")
    roles = spec.roles(options)
    if roles:
        raise ValueError(f"env {env_name!r} options ask for model roles ({', '.join(roles)}), which TRL's "
                         "environment_factory cannot give an env (it builds it with no arguments); use the scripted "
                         "ones (service: user=scripted, no judge)")
    return options


def _environment_class(env_name: str, options: dict[str, Any], tools: list[dict]) -> type[TurnforgeEnvironment]:
    methods = {t["function"]["name"]: tool_method(t, TurnforgeEnvironment._call) for t in tools}
    taken = sorted(set(methods) & ({"get_reward"} | set(dir(TurnforgeEnvironment))))
    if taken:  # TRL gives reset and get_reward their own meaning; the others are the class's own
        raise ValueError(f"env {env_name!r} has a tool named {taken[0]!r}, a name the environment class needs itself")
    title = "".join(part.capitalize() for part in env_name.split("_"))
    return type(f"{title}Environment", (TurnforgeEnvironment,),
                {"env_name": env_name, "env_options": dict(options), **methods})


def _tool_sets(env_name: str, options: dict[str, Any]) -> dict[str, list[dict]]:
    """Every tool list the env's tasks show, over all its splits, by name."""
    env, sets = make_env(env_name, **options), {}
    for split in get_env_spec(env_name).splits:
        for task in _tasks_by_id(env_name, split, _frozen(options)).values():
            env.reset(task)
            tools = env.tools() or []
            sets[_tool_set_name(env_name, tools)] = tools
    return sets


def _tool_set_name(env_name: str, tools: list[dict]) -> str:
    names = ",".join(t["function"]["name"] for t in tools)
    return f"{env_name}-{zlib.crc32(names.encode()):08x}"


def _frozen(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(options.items()))


@functools.cache
def _tasks_by_id(env_name: str, split: str, options: tuple[tuple[str, Any], ...]) -> dict[str, Task]:
    """The split's tasks by id, loaded once per process (every rollout's `reset` looks its task up here)."""
    return {t.id: t for t in load_tasks(env_name, split, **dict(options))}
