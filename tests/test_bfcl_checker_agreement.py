"""turnforge's BFCL verdict equals bfcl-eval's real `multi_turn_checker` on model-like results.

The results are the ground truth perturbed the ways models get it wrong: calls dropped, reordered,
duplicated, arguments changed, turns emptied, calls done a turn early, split into several steps,
unknown functions, wrong parameter names, calls made in a turn that expects none. Each result is
(a) stepped through the env (one message per step, then a reply without calls ends the turn) and
(b) given to `multi_turn_checker` as BFCL's decoded `list[turn][step][call string]`.
"""

from __future__ import annotations

import copy
import random

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2025.6.8)")

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils  # noqa: E402
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker  # noqa: E402

from turnforge.envs.base import load_tasks, make_env  # noqa: E402
from turnforge.envs.bfcl.data import CATEGORIES  # noqa: E402
from turnforge.envs.bfcl.execution import build_instances, method_table, parse_call_string  # noqa: E402
from turnforge.formats.bfcl_python import call_string  # noqa: E402
from turnforge.types import Message, ToolCall  # noqa: E402

Result = list[list[list[ToolCall]]]  # turn -> step -> calls


def _changed_value(value, rng: random.Random):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + rng.choice([1, -1, 10])
    if isinstance(value, str):
        return rng.choice([value + "x", value.upper() if value != value.upper() else value.lower(), ""])
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    return None


def _perturb(gt: list[list[ToolCall]], rng: random.Random, kind: str) -> Result:
    """One model-like result: every turn's calls in one step, then `kind` applied to a random turn."""
    turns = [[list(calls)] if calls else [] for calls in copy.deepcopy(gt)]
    full = [i for i, t in enumerate(turns) if t]
    if not full:
        return turns
    t = rng.choice(full)
    step = turns[t][0]
    i = rng.randrange(len(step))
    if kind == "drop":
        step.pop(i)
        if not step:
            turns[t] = []
    elif kind == "reorder":
        rng.shuffle(step)
    elif kind == "duplicate":
        step.insert(i, copy.deepcopy(step[i]))
    elif kind == "change_argument" and step[i].arguments:
        key = rng.choice(sorted(step[i].arguments))
        step[i].arguments[key] = _changed_value(step[i].arguments[key], rng)
    elif kind == "empty_turn":
        turns[t] = []
    elif kind == "split_steps":
        turns[t] = [[c] for c in step]
    elif kind == "early" and t + 1 < len(turns) and turns[t + 1]:
        turns[t].append(turns[t + 1][0][:1])
        turns[t + 1][0] = turns[t + 1][0][1:]
        if not turns[t + 1][0]:
            turns[t + 1] = []
    elif kind == "unknown_function":
        step.insert(i, ToolCall("delete_everything", {"really": True}))
    elif kind == "wrong_parameter" and step[i].arguments:
        key = rng.choice(sorted(step[i].arguments))
        step[i].arguments[key + "_name"] = step[i].arguments.pop(key)
    elif kind == "calls_in_empty_turn":
        empty = [k for k, calls in enumerate(gt) if not calls]
        if empty:
            k = empty[0]
            donor = gt[k + 1] if k + 1 < len(gt) and gt[k + 1] else gt[full[0]]
            turns[k] = [copy.deepcopy(donor)]
    return turns


KINDS = (
    "identity", "drop", "reorder", "duplicate", "change_argument", "empty_turn", "split_steps",
    "early", "unknown_function", "wrong_parameter", "calls_in_empty_turn",
)  # fmt: skip


def _env_verdict(task, result: Result):
    env = make_env("bfcl")
    env.reset(task)
    done = False
    for steps in result:
        assert not done
        for calls in steps:
            out = env.step(Message("assistant", "", tool_calls=calls))
            assert not out.done
        done = env.step(Message("assistant", "")).done
    assert done
    return env.score()


def _checker_verdict(task, result: Result, model_name: str) -> dict:
    decoded = [[[call_string(c) for c in calls] for calls in steps] for steps in result]
    try:
        return multi_turn_checker(decoded, task.data["ground_truth"], copy.deepcopy(task.data), task.category, model_name)
    finally:  # the checker caches instances in its module globals; drop ours (benchmarks.md §1)
        for key in [k for k in vars(multi_turn_utils) if k.startswith(model_name)]:
            del vars(multi_turn_utils)[key]


def _cases(per_category: int, seed: int):
    rng = random.Random(seed)
    for category in CATEGORIES:
        tasks = load_tasks("bfcl", "test", category=category)
        for task in rng.sample(tasks, per_category):
            methods = method_table(build_instances(task.data))
            gt = [[parse_call_string(c, methods) for c in turn] for turn in task.data["ground_truth"]]
            kind = KINDS[rng.randrange(len(KINDS))]
            yield task, kind, _perturb(gt, rng, kind)


def _agreement(per_category: int, seed: int) -> None:
    disagreements, verdicts = [], {True: 0, False: 0}
    for n, (task, kind, result) in enumerate(_cases(per_category, seed)):
        ours = _env_verdict(task, result)
        theirs = _checker_verdict(task, result, f"turnforge_agreement_{seed}_{n}")
        verdicts[theirs["valid"]] += 1
        same_type = theirs["valid"] or theirs["error_type"] == ours.details["error_type"]
        if ours.success != theirs["valid"] or not same_type:
            disagreements.append((task.id, kind, ours.success, ours.details["error_type"], theirs.get("error_type")))
    assert not disagreements, disagreements[:10]
    print(f"agreement on {sum(verdicts.values())} results: {verdicts}")
    # The cases must exercise both verdicts, or the agreement says little.
    assert verdicts[True] >= per_category and verdicts[False] >= per_category, verdicts


def test_verdict_equals_multi_turn_checker_on_300_model_like_results():
    _agreement(per_category=75, seed=0)


def test_verdict_equals_multi_turn_checker_on_every_entry():
    _agreement(per_category=200, seed=1)
