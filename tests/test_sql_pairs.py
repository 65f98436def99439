"""DPO pair mining on SQL-env rollouts: the SQL reasons (sql_error, wrong_table, answer_without_query) and
verbose appear, and each rejected reply really has its defect when stepped in a fresh env."""

from __future__ import annotations

import json
from functools import partial

import pytest

from turnforge.data.dpo_pairs import mine_dpo_pairs
from turnforge.envs.base import load_tasks, make_env
from turnforge.formats.base import FormatError
from turnforge.policies import ExpertPolicy, ReplayPolicy
from turnforge.rollout import run_episodes

FILLER = "Sure! Let me think about this very carefully and consider every possibility before I act. " * 3 + "\n"
N_TASKS = 8


def _inject(kind: str, replies: list[str], table: str) -> list[str]:
    """The expert's replies (after the prompt's own "Ok.") with one defect put in front."""
    if kind == "sql_error":
        return [f"Action: Operation\n```sql\nSELECT FROM `{table}` WHERE;\n```", *replies]
    if kind == "wrong_table":
        return ["Action: Operation\n```sql\nSELECT 1;\n```", *replies]
    if kind == "answer_without_query":
        return ['Action: Answer\nFinal Answer: ["42"]']  # ends the episode, as in AgentBench
    if kind == "verbose":
        return [FILLER + replies[0], *replies[1:]]
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def sql_tasks():
    return [t for t in load_tasks("sql", "train", limit=40) if t.data["type"][0] not in ("INSERT", "UPDATE", "DELETE")][
        :N_TASKS
    ]


@pytest.fixture(scope="module")
def defective(sql_tasks, tmp_path_factory):
    expert = run_episodes(ExpertPolicy(), partial(make_env, "sql"), sql_tasks, 1)
    assert all(t.score.success for t in expert)
    kinds = ["sql_error", "wrong_table", "answer_without_query", "verbose"]
    lines = []
    for i, (task, traj) in enumerate(zip(sql_tasks, expert, strict=True)):
        replies = [traj.messages[k].content for k in traj.reply_indices()]
        lines.append({"task_id": task.id, "replies": _inject(kinds[i % 4], replies, task.data["table"]["name"])})
    path = tmp_path_factory.mktemp("sql_replay") / "replies.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_episodes(ReplayPolicy(path), partial(make_env, "sql"), sql_tasks, 1)


def test_sql_reasons_are_mined_and_real(sql_tasks, defective):
    tasks = {t.id: t for t in sql_tasks}
    pairs = mine_dpo_pairs(defective, partial(make_env, "sql"), tasks)
    assert {p.reason for p in pairs} == {"sql_error", "wrong_table", "answer_without_query", "verbose"}
    for pair in pairs:
        env = make_env("sql")
        env.reset(tasks[pair.task_id])
        generated = [m for m in pair.messages[len(env.reset(tasks[pair.task_id])) :] if m["role"] == "assistant"]
        for m in generated:
            env.step(env.format.parse(m["content"]))
        parsed = env.format.parse(pair.rejected)
        assert not isinstance(parsed, FormatError)
        result = env.step(parsed)
        if pair.reason == "verbose":
            assert len(pair.rejected) > len(pair.chosen) + 160 and env.format.parse(pair.chosen) == parsed
        else:
            assert pair.reason in result.info["defects"], (pair.reason, result.info)
        # the chosen reply at the same state is clean
        fresh = make_env("sql")
        fresh.reset(tasks[pair.task_id])
        for m in generated:
            fresh.step(fresh.format.parse(m["content"]))
        assert fresh.step(fresh.format.parse(pair.chosen)).info.get("defects", []) == []


def test_prompt_assistant_turns_are_not_mined(sql_tasks):
    """DBBench's prompt holds an assistant "Ok."; it is the env's, not the policy's, so it yields no pair."""
    expert = run_episodes(ExpertPolicy(), partial(make_env, "sql"), sql_tasks[:2], 1)
    assert any(m.role == "assistant" and m.content == "Ok." for m in expert[0].messages)
    assert mine_dpo_pairs(expert, partial(make_env, "sql"), {t.id: t for t in sql_tasks}) == []
