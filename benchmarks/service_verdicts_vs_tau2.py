"""Our service-env verdicts vs tau2-bench's own evaluator code, on the same conversations (one run).

Plays every train task of a domain with the expert and with perturbed experts (a gold write action dropped,
one argument of it changed, the communicate message left out, the gold calls shuffled and cut), then grades
each conversation twice: by turnforge (`ServiceEnv.score()`) and by tau2-bench's evaluator classes
(`EnvironmentEvaluator` replaying the conversation's tool calls on a fresh tau2 environment and comparing DB
hashes and running the env assertions, `ActionEvaluator`, `CommunicateEvaluator`), combined over the task's
reward basis as `evaluate_simulation` combines them. In telecom (dual control) the variants change the gold
actions of both sides, which the expert and the scripted user then play (the user's device-tool calls and their
results are in the conversation, marked as the user's, as tau2 records them). NL_ASSERTION needs an LLM in both and is left out. tau2's code is imported
from a checkout given by --tau2-src (its `src/` folder, with `data/tau2/domains/<domain>/` under TAU2_DATA_DIR);
nothing of it is copied here. tau2 needs pydantic, loguru, docstring_parser, deepdiff, addict, toml, pyyaml,
python-dotenv and pandas, and its `tau2/__init__.py` (which imports the LLM runner) emptied.

    TAU2_DATA_DIR=/tmp/tau2/data PYTHONPATH=src python benchmarks/service_verdicts_vs_tau2.py \
        --tau2-src /tmp/tau2/src --domain airline --data-dir ../shared/data/tau2/airline
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import json
import random
import sys
from functools import partial

from turnforge.envs.base import load_tasks, make_env
from turnforge.types import Message, ToolCall

VARIANTS = ("expert", "drop_write", "change_arg", "no_communicate", "shuffle_cut")


def play(env, task, variant: str, rng: random.Random):
    """One conversation: the variant's tool calls, a closing message, and the scripted user's stop."""
    spec = task.data
    actions = variant_actions(env, spec, variant, rng)
    if env.domain.kind.user is not None:  # dual control: the expert and the scripted user play the variant's actions
        env.reset(dataclasses.replace(task, data={**spec, "evaluation_criteria": {**spec["evaluation_criteria"],
                                                                                  "actions": actions}}))
        while env.termination is None:
            env.step(env.expert_reply())
        env.spec, env._score = spec, None  # graded on the task's own criteria
        return env.history, env.score()
    env.reset(task)
    for a in actions:
        if env.termination is not None:
            break
        env.step(Message("assistant", "", tool_calls=[ToolCall(a["name"], a["arguments"])]))
    if env.termination is None:
        info = spec["evaluation_criteria"].get("communicate_info") or []
        text = "Done." if variant == "no_communicate" or not info else "; ".join(info)
        env.step(Message("assistant", text))
    if env.termination is None:
        env.step(Message("assistant", "###STOP###"))
    return env.history, env.score()


def variant_actions(env, spec: dict, variant: str, rng: random.Random) -> list[dict]:
    """The gold actions as the variant changes them (a write of either side dropped, an argument changed, ...)."""
    actions = [copy.deepcopy(a) for a in spec["evaluation_criteria"].get("actions") or []]
    user_side = env.domain.kind.user
    kinds = {**(user_side.toolkit.tool_kinds() if user_side else {}), **env.domain.tool_kinds()}
    writes = [i for i, a in enumerate(actions) if kinds.get(a["name"]) == "write"]
    if variant == "drop_write" and writes:
        del actions[writes[-1]]
    if variant == "change_arg" and writes:
        args = actions[writes[0]]["arguments"]
        key = sorted(k for k, v in args.items() if isinstance(v, str))[:1]
        if key:
            args[key[0]] += "X"
    if variant == "shuffle_cut":
        rng.shuffle(actions)
        actions = actions[: rng.randint(0, len(actions))]
    return actions


def tau2_env_kwargs(domain: str, spec: dict, retrieval: str) -> dict:
    """tau2's per-task environment arguments: banking_knowledge's retrieval variant and read-log allowlist (the tools
    its gold actions call through call_discoverable_agent_tool: tau2's runner `_derive_read_log_allowlist`)."""
    if domain != "banking_knowledge":
        return {}
    actions = (spec.get("evaluation_criteria") or {}).get("actions") or []
    allow = {(a.get("arguments") or {}).get("agent_tool_name") for a in actions
             if a["name"] == "call_discoverable_agent_tool"} - {None}
    return {"retrieval_variant": retrieval, "read_log_allowlist": allow}


def tau2_verdict(domain: str, spec: dict, history: list[Message], termination: str, strict: bool = False,
                 retrieval: str = "bm25") -> dict:
    msg = importlib.import_module("tau2.data_model.message")
    tasks = importlib.import_module("tau2.data_model.tasks")
    env_eval = importlib.import_module("tau2.evaluator.evaluator_env").EnvironmentEvaluator
    act_eval = importlib.import_module("tau2.evaluator.evaluator_action").ActionEvaluator
    com_eval = importlib.import_module("tau2.evaluator.evaluator_communicate").CommunicateEvaluator
    get_env = importlib.import_module(f"tau2.domains.{domain}.environment").get_environment
    trajectory, caller = [], "assistant"
    for m in history:
        calls = [msg.ToolCall(id=c.id or "", name=c.name, arguments=c.arguments, requestor=m.role)
                 for c in m.tool_calls or []] or None
        if calls:
            caller = m.role
        if m.role == "assistant":
            trajectory.append(msg.AssistantMessage(role="assistant", content=m.content or None, tool_calls=calls))
        elif m.role == "user":
            trajectory.append(msg.UserMessage(role="user", content=m.content or None, tool_calls=calls))
        elif m.role == "tool":
            trajectory.append(msg.ToolMessage(id=m.tool_call_id or "", role="tool", content=m.content,
                                              requestor=caller))
    task = tasks.Task.model_validate(spec)
    if termination not in ("agent_stop", "user_stop"):
        return {"reward": 0.0, "breakdown": {}}
    basis = [str(getattr(b, "value", b)) for b in task.evaluation_criteria.reward_basis]
    env_info = env_eval.calculate_reward(environment_constructor=partial(get_env), task=task,
                                         full_trajectory=trajectory, strict_replay=strict,
                                         env_kwargs=tau2_env_kwargs(domain, spec, retrieval))
    act_info = act_eval.calculate_reward(task=task, full_trajectory=trajectory)
    com_info = com_eval.calculate_reward(task=task, full_trajectory=trajectory)
    breakdown = {}
    for info in (env_info, act_info, com_info):
        for k, v in (info.reward_breakdown or {}).items():
            key = str(getattr(k, "value", k))
            if key in basis:
                breakdown[key] = v
    reward = 1.0
    for v in breakdown.values():
        reward *= v
    db_match = env_info.db_check.db_match if env_info.db_check is not None else None
    return {"reward": reward, "breakdown": breakdown, "db_match": db_match}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tau2-src", required=True)
    parser.add_argument("--domain", default="airline")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--retrieval", default="bm25", help="banking_knowledge's retrieval variant, both sides")
    parser.add_argument("--strict-replay", action="store_true",
                        help="tau2 replays strictly: a mutating call whose output differs from ours raises")
    args = parser.parse_args()
    sys.path.insert(0, args.tau2_src)
    import logging

    from loguru import logger

    logger.remove()
    logging.disable(logging.WARNING)
    opts = {"domain": args.domain, "data_dir": args.data_dir,
            **({"retrieval": args.retrieval} if args.domain == "banking_knowledge" else {})}
    env = make_env("service", **opts)
    rng = random.Random(0)
    compared = disagreements = db_agree = 0
    by_variant: dict[str, list[int]] = {}
    for task in load_tasks("service", "train", **opts):
        for variant in VARIANTS:
            history, score = play(env, task, variant, rng)
            ours = {k: v for k, v in score.details["reward_breakdown"].items() if k != "NL_ASSERTION"}
            theirs = tau2_verdict(args.domain, task.data, history, score.details["termination"], args.strict_replay,
                                  args.retrieval)
            compared += 1
            db_agree += score.details.get("db_match") == theirs.get("db_match")
            agree = ours == theirs["breakdown"] or (score.details["termination"] not in ("agent_stop", "user_stop")
                                                    and score.reward == 0.0)
            counts = by_variant.setdefault(variant, [0, 0, 0])
            counts[0] += 1
            counts[1] += int(agree)
            counts[2] += int(all(v == 1.0 for v in ours.values()))
            if not agree:
                disagreements += 1
                print(json.dumps({"task": task.id, "variant": variant, "ours": ours, "tau2": theirs["breakdown"]}))
    print(f"{args.domain}: {compared} conversations, {compared - disagreements} verdicts agree, {disagreements} differ; "
          f"db_match (agent + user DB hashes, in the basis or not) agrees on {db_agree}")
    for variant, (n, agree, passed) in by_variant.items():
        print(f"  {variant:15s} n={n:3d} agree={agree:3d} passed(ours)={passed:3d}")


if __name__ == "__main__":
    main()
