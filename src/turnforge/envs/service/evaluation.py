"""tau2-bench's verdict (`src/tau2/evaluator/`): the product of the components in the task's `reward_basis`.

- Ending: only AGENT_STOP and USER_STOP are graded; any other termination scores 0 (evaluator.py).
- DB: the episode's DB (the agent's tool calls were run on it live, which is what tau2's replay recomputes)
  against the gold DB (the gold actions applied to a fresh DB, errors ignored); agent and user DB alike.
  Compared record by record (`EpisodeDB.same_state`), which agrees with tau2's whole-DB sha256.
- ENV_ASSERTION: each assertion function, run on the episode's DB, returns `assert_value`.
- ACTION: every gold action has a call with its name and equal arguments, on `compare_args` when given.
- COMMUNICATE: every `communicate_info` string is a case-insensitive substring of some assistant message's
  text with its commas removed.
- NL_ASSERTION: a judge model (the `judge` role) with tau2's prompt; without one the component is `None`
  ("not evaluated"), the reward is computed over the other components and `nl_assertion_evaluated` says so.
No evaluation criteria, or no actions and no env assertions (for DB): 1, as in tau2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from turnforge.envs.service.episode_db import EpisodeDB
from turnforge.types import Message, ToolCall

DB, ENV_ASSERTION, ACTION, COMMUNICATE, NL_ASSERTION = "DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE", "NL_ASSERTION"
DEFAULT_BASIS = [DB, COMMUNICATE]  # tau2's EvaluationCriteria.reward_basis default
GRADED_ENDINGS = ("agent_stop", "user_stop")

_I = " " * 8  # tau2 writes its judge prompts as indented triple-quoted strings; kept byte for byte
NL_JUDGE_SYSTEM = "\n".join([
    "", f"{_I}TASK",
    f"{_I}- You will be given a list of expected outcomes and a conversation that was collected during a test case run.",
    f"{_I}- The conversation is between an agent and a customer.",
    f"{_I}- Your job is to evaluate whether the agent satisfies each of the expected outcomes.",
    f"{_I}- Grade each expected outcome individually.", "",
    f"{_I}FORMAT",
    f"{_I}- Your response should be a JSON object with the following fields:",
    f"{_I}- `reasoning`: a short explanation for your classification",
    f"{_I}- `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise",
    f"{_I}- `expectedOutcome`: repeat the expectation from the input that you are grading",
    _I,
    f"{_I}Example response structure:",
    f"{_I}{{",
    f'{_I}    "results": [',
    f"{_I}        {{",
    f'{_I}            "expectedOutcome": "<one of the expected outcomes from the input>",',
    f'{_I}            "reasoning": "<reasoning trace>",',
    f'{_I}            "metExpectation": <false or true>,',
    f"{_I}        }}",
    f"{_I}    ]",
    f"{_I}}}",
    _I,
])


def action_matches(action: dict, call: ToolCall) -> bool:
    """tau2's `Action.compare_with_tool_call`: same name, equal arguments on `compare_args` (None = all the call's).

    >>> action_matches({"name": "f", "arguments": {"a": 1, "b": 2}, "compare_args": ["a"]}, ToolCall("f", {"a": 1}))
    True
    >>> action_matches({"name": "f", "arguments": {"a": 1}}, ToolCall("f", {"a": 1, "b": 2}))
    False
    """
    if action["name"] != call.name:
        return False
    keys = action.get("compare_args")
    keys = call.arguments.keys() if keys is None else keys
    if len(keys) == 0:
        return True
    return {k: v for k, v in call.arguments.items() if k in keys} == {
        k: v for k, v in (action.get("arguments") or {}).items() if k in keys
    }


def actions_done_in_order(actions: list[dict], calls: list[ToolCall]) -> int:
    """How many of the gold `actions`, from the first, the `calls` performed in that order (each call matches at
    most one action). The scripted user and the expert use it to know whose gold action is next.

    >>> actions_done_in_order([{"name": "a"}, {"name": "b"}], [ToolCall("b", {}), ToolCall("a", {})])
    1
    """
    done = 0
    for call in calls:
        if done < len(actions) and action_matches(actions[done], call):
            done += 1
    return done


def communicated(info: str, messages: list[Message]) -> bool:
    """tau2's COMMUNICATE check for one string: in an assistant message's text, commas removed, any case."""
    return any(
        m.role == "assistant" and m.content and info.lower() in m.content.lower().replace(",", "") for m in messages
    )


def evaluate(
    task: dict,
    history: list[Message],
    termination: str,
    db: EpisodeDB,
    gold_db: EpisodeDB | None,
    assertion: Callable[[dict], bool] | None = None,
    judge: Callable[[list[Message], list[str]], list[bool]] | None = None,
) -> dict[str, Any]:
    """{"reward", "reward_basis", "reward_breakdown", "note"?, "nl_assertion_evaluated"?, checks...}.

    `history` is the conversation as tau2 records it (greeting, user / assistant messages with their
    `tool_calls`, tool results); `assertion(env_assertion) -> met`; `judge(history, assertions)` -> per
    assertion verdicts (a judge that could not answer raises `CheckerUnavailable`; no judge: not evaluated).
    """
    criteria = task.get("evaluation_criteria")
    if termination not in GRADED_ENDINGS:
        return {"reward": 0.0, "reward_basis": None, "reward_breakdown": {},
                "note": f"Simulation terminated prematurely. Termination reason: {termination}"}
    if criteria is None:
        return {"reward": 1.0, "reward_basis": None, "reward_breakdown": {}, "note": "No evaluation criteria"}
    basis = criteria.get("reward_basis") or DEFAULT_BASIS
    breakdown: dict[str, float | None] = {}
    out: dict[str, Any] = {"reward_basis": list(basis)}
    if DB in basis or ENV_ASSERTION in basis:
        breakdown.update(_env_components(criteria, basis, db, gold_db, assertion, out))
    if ACTION in basis:
        calls = [c for m in history if m.role in ("assistant", "user") for c in m.tool_calls or []]
        checks = [any(action_matches(a, c) for c in calls) for a in criteria.get("actions") or []]
        out["action_checks"] = checks
        breakdown[ACTION] = float(all(checks))
    if COMMUNICATE in basis:
        checks = [communicated(info, history) for info in criteria.get("communicate_info") or []]
        out["communicate_checks"] = checks
        breakdown[COMMUNICATE] = float(all(checks))
    if NL_ASSERTION in basis:
        assertions = criteria.get("nl_assertions") or []
        verdicts = judge(history, assertions) if judge is not None and assertions else None
        if not assertions:
            breakdown[NL_ASSERTION] = 1.0
        elif verdicts is None:
            breakdown[NL_ASSERTION] = None  # not evaluated: never silently passed
        else:
            out["nl_assertion_checks"] = verdicts
            breakdown[NL_ASSERTION] = float(all(verdicts))
        out["nl_assertion_evaluated"] = breakdown[NL_ASSERTION] is not None
    reward = 1.0
    for value in breakdown.values():
        if value is not None:
            reward *= value
    out["reward"] = reward
    out["reward_breakdown"] = breakdown
    return out


def _env_components(criteria, basis, db, gold_db, assertion, out) -> dict[str, float]:
    """tau2's EnvironmentEvaluator: DB match and env assertions (1 when there is nothing to check)."""
    parts: dict[str, float] = {}
    if criteria.get("actions") is None and criteria.get("env_assertions") is None:
        out["note"] = "No expected actions or env assertions"
        return {k: 1.0 for k in (DB, ENV_ASSERTION) if k in basis}
    db_match = gold_db is not None and db.same_state(gold_db)
    out["db_match"] = db_match
    if DB in basis:
        parts[DB] = float(db_match)
    if ENV_ASSERTION in basis:
        met = [bool(assertion(a)) if assertion is not None else False for a in criteria.get("env_assertions") or []]
        out["env_assertion_checks"] = met
        parts[ENV_ASSERTION] = float(all(met))
    return parts


def judge_messages(history: list[Message], assertions: list[str]) -> list[Message]:
    """tau2's NL-assertion prompt: the conversation as `role: content` lines, then the expected outcomes."""
    # tau2 writes a tool-call message's missing content as "None"
    conversation = "\n".join(f"{m.role}: {m.content if m.content or not m.tool_calls else None}" for m in history)
    user = f"\n{_I}conversation:\n{_I}{conversation}\n{_I}\n{_I}expectedOutcomes:\n{_I}{assertions}\n{_I}"
    return [Message("system", NL_JUDGE_SYSTEM), Message("user", user)]


def read_judge_reply(text: str, n: int) -> list[bool] | None:
    """The judge's `metExpectation` per assertion, or None when its reply is not the JSON asked for."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        results = json.loads(match.group(0))["results"] if match else None
        verdicts = [bool(r["metExpectation"]) for r in results]
    except (ValueError, KeyError, TypeError):
        return None
    return verdicts if len(verdicts) == n else None
