"""The service env: tau2-bench-compatible customer-service episodes (retail, airline, telecom, built-in desk).

    turnforge eval --env service --env-opt domain=retail --env-opt data_dir=../shared/data/tau2/retail --policy expert --out runs/retail-gold
    turnforge eval --env service --env-opt domain=airline --env-opt data_dir=PATH --policy hf --model M \
        --env-opt user=hf:U --samples 4 --temperature 0.8 --out runs/airline
    turnforge eval --env service --env-opt domain=desk --policy random --out runs/desk
    turnforge eval --env service --env-opt domain=telecom --env-opt data_dir=../shared/data/tau2/telecom --policy expert \
        --out runs/telecom-gold
    turnforge eval --env service --env-opt domain=banking_knowledge --env-opt data_dir=../shared/data/tau2/banking_knowledge \
        --env-opt retrieval=bm25 --policy expert --out runs/banking-gold

Tasks: one per tau2 task of the split (`split_tasks.json`, else every task in every split); `Task.id` is
tau2's id, `Task.category` the domain. The user is `scripted` (tests, gold runs), `replay` (re-grade saved
conversations with `--policy replay:FILE`) or a policy spec (`hf:PATH`, `openai:URL#model`, ...) that the eval
runner builds and passes as the `user` role; `judge=SPEC` does the same for NL_ASSERTION. Telecom is dual control:
the user role also gets the customer's device tools (envs/service/telecom/); in banking_knowledge the user has tools
over the bank's own DB and the agent searches a knowledge base (envs/service/banking/, `retrieval=`).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from turnforge.envs.base import EnvOption, EnvSpec, register_env
from turnforge.envs.service.domain import ENV_NAME, domain_names, load_domain
from turnforge.envs.service.env import BAD_CALL_ENDINGS, SCRIPTED_USERS, ServiceEnv
from turnforge.envs.service.metrics import service_metrics
from turnforge.envs.service.users import ReplayUserPolicy
from turnforge.types import Task

__all__ = ["ServiceEnv", "load_service_tasks", "service_metrics"]

SPLITS = ("train", "test", "base")


def load_service_tasks(split: str, limit: int | None = None, *, domain: str, data_dir: str, tasks: str,
                       **_episode_options: Any) -> list[Task]:
    """The tasks of `split` in the domain's order."""
    loaded = load_domain(domain, data_dir, tasks, _episode_options.get("retrieval", ""))
    ids = loaded.split_ids(split)
    return [loaded.to_task(i, split) for i in ids[:limit]]


def model_roles(options: dict[str, Any], agent_spec: str = "") -> dict[str, tuple[Any, dict[str, Any]]]:
    """The model roles these options ask for: role -> (policy spec or replayed user, sampling overrides).

    `user=replay` replays the user messages of the agent's own replay file (`--policy replay:FILE`).
    """
    roles: dict[str, tuple[Any, dict[str, Any]]] = {}
    user = options["user"]
    if user == "replay":
        kind, _, path = agent_spec.partition(":")
        if kind != "replay" or not path:
            raise ValueError("--env-opt user=replay replays the conversations of --policy replay:FILE; give that policy")
        domain = load_domain(options["domain"], options["data_dir"], options["tasks"])
        roles["user"] = (ReplayUserPolicy(path, dual_control=domain.kind.user is not None), {})
    elif user == "base":  # a recipe's stages resolve it (stages/context.py `RunContext.stage_env`)
        raise ValueError("user=base names a recipe's base model and works in a recipe's stages only; "
                         "here give the user's model as hf:PATH, vllm:PATH or openai:URL#MODEL")
    elif user not in SCRIPTED_USERS:  # (a bad spec fails in `policies.roles.env_roles`, before any episode)
        roles["user"] = (user, {"temperature": options["user_temperature"]})
    if options["judge"]:
        roles["judge"] = (options["judge"], {"temperature": 0.0})
    return roles


def vocabulary(options: dict[str, Any]) -> list[str]:
    """The domain's tool names and its DB's field names (`get_order_details`, `payment_method_id`): the words
    of every tool schema and tool result, whole tokens in a tokenizer trained on the domain (the tiny model's)."""
    domain = load_domain(options["domain"], options["data_dir"], options["tasks"])
    return sorted({*domain.tool_kinds(), *field_names(domain.kind.db_model)})


def field_names(model: type[BaseModel]) -> set[str]:
    """The field names of a pydantic model and of the models its fields hold (in dicts, lists, unions)."""
    names: set[str] = set()
    todo, seen = [model], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, info in current.model_fields.items():
            names.add(info.alias or name)
            todo += _models_in(info.annotation)
    return names


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


SERVICE_SPEC = register_env(
    EnvSpec(
        name=ENV_NAME,
        description="tau2-bench customer service (retail, airline, telecom, banking_knowledge from tau2's data; "
                    "built-in desk): tools "
                    "over a DB, a simulated user (with device tools in telecom), tau2's DB/ENV_ASSERTION/ACTION/"
                    "COMMUNICATE/NL verdict",
        factory=ServiceEnv,
        load_tasks=load_service_tasks,
        categories=domain_names(),
        splits=SPLITS,
        env_metrics=service_metrics,
        model_roles=model_roles,
        role_options=("user", "judge"),
        vocabulary=vocabulary,
        corpus_options=("domain", "data_dir", "tasks"),
        options=[
            EnvOption("domain", str, "desk", "retail, airline, telecom, banking_knowledge (need data_dir) or desk (built "
                      "in)", domain_names()),
            EnvOption("data_dir", str, "", "a tau2 domain folder: db.json or db.toml, policy.md (telecom: "
                      "main_policy.md, tech_support_manual.md, user_db.toml), tasks.json, optional split_tasks.json"),
            EnvOption("tasks", str, "", "another tasks JSON in tau2's schema (all its tasks form every split)"),
            EnvOption("retrieval", str, "", "banking_knowledge's retrieval variant (tau2's names): bm25 (default), "
                      "bm25_grep, grep_only, full_kb, golden_retrieval, no_knowledge; those needing an embedding "
                      "model, a reranker or a shell are refused"),
            EnvOption("user", str, "scripted", "scripted | replay (with --policy replay:FILE) | a policy spec for an "
                      "LLM user simulator: hf:PATH, openai:URL#model, vllm:PATH | base (in a recipe: its base model, "
                      "frozen)"),
            EnvOption("user_temperature", float, 0.7, "the user simulator's sampling temperature (tau2: 0.7)"),
            EnvOption("judge", str, "", "policy spec of the NL_ASSERTION judge (empty: NL assertions not evaluated)"),
            EnvOption("max_steps", int, 100, "orchestrator steps per episode (tau2: 100)"),
            EnvOption("max_errors", int, 10, "tool errors per episode (tau2: 10)"),
            EnvOption("format", str, "tool_call", "how the agent writes tool calls", ("tool_call",)),
            EnvOption("on_bad_call", str, "end", "a tool call that cannot be read (arguments not JSON): end = the "
                      "episode ends, agent_error, reward 0 (tau2); observe = its error as a tool observation, a tool "
                      "error, the episode goes on (training)", BAD_CALL_ENDINGS),
        ],
    )
)
