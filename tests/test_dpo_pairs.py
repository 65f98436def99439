"""DPO pair mining on real household rollouts, the household's per-step defects, and pair import/export.

The rollouts are the expert's episodes with one defect injected per episode, played by the replay policy
through the real rollout loop. Every mined pair is then checked independently: a fresh env is stepped through
the pair's history and then the rejected reply, and the defect its reason names must really be there.
"""

from __future__ import annotations

import json
from functools import partial

import pytest

from turnforge.data.dpo_pairs import (
    REASONS,
    Judged,
    MiningCounts,
    MiningSettings,
    Pair,
    claims_success,
    is_loop,
    load_pairs,
    mine_dpo_pairs,
    pair_from_record,
    pairs_dataset,
    reason_counts,
    save_pairs,
)
from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.household.catalog import TRANSFORM_APPLIANCE, is_plausible
from turnforge.envs.household.engine import NOTHING, World
from turnforge.formats.base import FormatError
from turnforge.policies import ExpertPolicy, ReplayPolicy
from turnforge.rollout import run_episodes
from turnforge.types import Message, Trajectory

FILLER = (
    "Certainly! I would be very happy to help you with this task. Let me think carefully about every step, "
    "consider all the options in the room, and make sure that I do exactly the right thing here.\n"
)
N_TASKS = 12


def _implausible_receptacle(task) -> str | None:
    """A receptacle of the task's room where the goal object never occurs (and that serves no goal step)."""
    w, g = World(task.data, "0.3"), task.data["goal"]
    for rec in w.receptacles.values():
        if rec.type in (g["receptacle"], TRANSFORM_APPLIANCE.get(g["transform"] or "")):
            continue
        if not is_plausible(g["object"], rec.type) and not (g["toggle"] and is_plausible(g["toggle"], rec.type)):
            return rec.name
    return None


def _inject(kind: str, replies: list[str], task) -> list[str]:
    """The expert's replies with one defect of `kind` put in (the episode still reaches the goal)."""
    first = replies[0]
    if kind == "format":
        return ["I should look for it first."] + replies
    if kind == "invalid_action":
        return replies[:1] + ["ACTION: fly to the moon"] + replies[1:]
    if kind == "loop":
        return replies[:1] + [first] + replies[1:]  # the same "go to X" twice in a row
    if kind == "task_succeeded_negative":
        return replies[:1] + ["ACTION: task succeeded"] + replies[1:]
    if kind == "verbose":
        return [FILLER + first] + replies[1:]
    if kind == "implausible_location":
        return [f"ACTION: go to {_implausible_receptacle(task)}"] + replies
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=N_TASKS)


@pytest.fixture(scope="module")
def expert_trajectories(tasks):
    return run_episodes(ExpertPolicy(), partial(make_env, "household"), tasks, 1)


@pytest.fixture(scope="module")
def defective_trajectories(tasks, expert_trajectories, tmp_path_factory):
    """One household rollout per task, each with one injected defect, run by the replay policy."""
    kinds = list(REASONS)
    lines = []
    for i, (task, traj) in enumerate(zip(tasks, expert_trajectories, strict=True)):
        replies = [m.content for m in traj.messages if m.role == "assistant"]
        kind = kinds[i % len(kinds)]
        if kind == "implausible_location" and _implausible_receptacle(task) is None:
            kind = "invalid_action"
        lines.append({"task_id": task.id, "replies": _inject(kind, replies, task)})
    path = tmp_path_factory.mktemp("replay") / "replies.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_episodes(ReplayPolicy(path), partial(make_env, "household"), tasks, 1)


def _step_history(pair: Pair, task):
    """A fresh env stepped through the pair's history; (env, [(action, observation, progress)])."""
    env = make_env("household")
    env.reset(task)
    steps = []
    for m in pair.messages:
        if m["role"] == "assistant":
            result = env.step(env.format.parse(m["content"]))
            parsed = env.format.parse(m["content"])
            steps.append((parsed, result.messages[0].content, result.info["progress"]))
    return env, steps


def _assert_has_defect(pair: Pair, task) -> None:
    """Step the rejected reply after the pair's history in a real env and check the defect `reason` names."""
    env, steps = _step_history(pair, task)
    before = steps[-1][2] if steps else 0.0
    parsed = env.format.parse(pair.rejected)
    result = env.step(parsed)
    observation = result.messages[0].content
    if pair.reason == "format":
        assert isinstance(parsed, FormatError)
        return
    assert isinstance(parsed, Message)
    if pair.reason == "invalid_action":
        assert observation == NOTHING
    elif pair.reason == "task_succeeded_negative":
        assert "succeeded" in parsed.content and not result.info["won"] and observation == NOTHING
    elif pair.reason == "loop":
        assert steps and steps[-1][0] == parsed and result.info["progress"] == before
    elif pair.reason == "implausible_location":
        goal = task.data["goal"]
        rtype = env.world.receptacles[env.world.at].type
        assert parsed.content.startswith("go to ") and observation != NOTHING and env.world.held is None
        assert not is_plausible(goal["object"], rtype)
    elif pair.reason == "verbose":
        assert env.format.parse(pair.chosen) == parsed and len(pair.rejected) > len(pair.chosen) + 160
    else:
        raise AssertionError(pair.reason)


def test_expert_steps_have_no_defects(expert_trajectories, tasks):
    assert all(t.score.success for t in expert_trajectories)
    counts = MiningCounts()
    pairs = mine_dpo_pairs(expert_trajectories, partial(make_env, "household"), {t.id: t for t in tasks}, counts=counts)
    assert pairs == [] and counts.defective_turns == 0 and counts.turns > 50


def test_household_reports_defects_in_info(tasks):
    env = make_env("household")
    env.reset(tasks[0])
    assert env.step(Message("assistant", "fly to the moon")).info["defects"] == ["invalid_action"]
    assert env.step(env.format.parse("no action here")).info["defects"] == []  # format is the miner's reason
    target = _implausible_receptacle(tasks[4])
    env.reset(tasks[4])
    assert env.step(Message("assistant", f"go to {target}")).info["defects"] == ["implausible_location"]


def test_mining_finds_every_reason_and_each_rejected_reply_has_its_defect(defective_trajectories, tasks):
    by_id = {t.id: t for t in tasks}
    counts = MiningCounts()
    pairs = mine_dpo_pairs(defective_trajectories, partial(make_env, "household"), by_id, counts=counts)
    assert set(reason_counts(pairs)) == set(REASONS)
    assert counts.by_reason == reason_counts(pairs) and counts.not_replayable == 0
    for pair in pairs:
        _assert_has_defect(pair, by_id[pair.task_id])
        # The chosen reply is a valid step at the same state, and differs from the rejected one.
        env, _ = _step_history(pair, by_id[pair.task_id])
        assert env.step(env.format.parse(pair.chosen)).messages[0].content != NOTHING
        assert pair.chosen != pair.rejected
        assert pair.messages[-1]["role"] == "user" and pair.messages[0]["role"] == "system"


def test_mining_closes_every_env_it_builds(defective_trajectories, tasks):
    """Each replay builds an env; each is closed once (an env may hold a database, a sandbox, an OpenEnv session:
    unclosed, an `openenv:URL` server refused new sessions once mining had opened its 64)."""
    made, closed = [], []

    def factory():
        env = make_env("household")
        close = env.close
        env.close = lambda: (closed.append(env), close())
        made.append(env)
        return env

    mine_dpo_pairs(defective_trajectories, factory, {t.id: t for t in tasks})
    assert made and sorted(map(id, closed)) == sorted(map(id, made))


def test_chosen_comes_from_a_successful_sibling_at_the_same_history(tasks, expert_trajectories, tmp_path):
    task, traj = tasks[0], expert_trajectories[0]
    replies = [m.content for m in traj.messages if m.role == "assistant"]
    path = tmp_path / "replies.jsonl"
    lines = [{"task_id": task.id, "sample": 0, "replies": replies},
             {"task_id": task.id, "sample": 1, "replies": replies[:2] + ["ACTION: fly to the moon"]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rollouts = run_episodes(ReplayPolicy(path), partial(make_env, "household"), [task], 2)
    pairs = mine_dpo_pairs(rollouts, partial(make_env, "household"), {task.id: task})
    assert [(p.reason, p.chosen_from, p.turn, p.chosen) for p in pairs] == [("invalid_action", "sibling", 2, replies[2])]


def test_success_claims_and_loops_hand_cases():
    assert claims_success(Message("assistant", "Task completed"))
    assert claims_success(Message("assistant", "done."))
    assert not claims_success(Message("assistant", "go to desk 1"))
    look, desk = Message("assistant", "look"), Message("assistant", "go to desk 1")
    past = [Judged("", look, "room", 0.0, 0.0, False), Judged("", desk, "desk", 0.0, 0.5, False)]
    assert is_loop(desk, "Nothing happens.", past, progressed=False)  # the previous action again
    assert not is_loop(look, "room", past, progressed=False)  # the same observation, but progress rose since
    assert not is_loop(desk, "desk", past, progressed=True)
    past[1].progress = 0.0
    assert is_loop(look, "room", past, progressed=False)


def test_reason_filter_keeps_only_the_asked_reasons(defective_trajectories, tasks):
    settings = MiningSettings(reasons=("loop",))
    pairs = mine_dpo_pairs(defective_trajectories, partial(make_env, "household"), {t.id: t for t in tasks}, settings)
    assert pairs and {p.reason for p in pairs} == {"loop"}


# ---- import / export -------------------------------------------------------------------------------------------


def _pairs() -> list[Pair]:
    history = [{"role": "system", "content": "act"}, {"role": "user", "content": "You see a desk 1."}]
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}]
    return [
        Pair(history, "ACTION: go to desk 1", "ACTION: go to desk 1 please", "verbose", None, "t-1", 0, "concise"),
        Pair(history, "ACTION: look", "ACTION: task succeeded", "task_succeeded_negative", tools, "t-2", 3, "expert"),
    ]


@pytest.mark.parametrize("name", ["pairs.jsonl", "pairs.parquet", "pairs_folder"])
@pytest.mark.parametrize("schema", ["seed", "trl"])
def test_pairs_round_trip_through_files(tmp_path, name, schema):
    pairs = _pairs()
    loaded = load_pairs(str(save_pairs(pairs, tmp_path / name, schema)))
    if schema == "trl":  # TRL rows carry no provenance
        for p in pairs:
            p.task_id, p.turn, p.chosen_from = "", -1, "dataset"
    assert loaded == pairs


def test_trl_dataset_has_conversational_preference_columns():
    ds = pairs_dataset(_pairs(), "trl")
    assert set(ds.column_names) == {"prompt", "chosen", "rejected", "tools", "reason"}
    assert ds[0]["chosen"] == [{"role": "assistant", "content": "ACTION: go to desk 1"}]
    assert json.loads(ds[1]["tools"])[0]["function"]["name"] == "act" and ds[0]["tools"] is None


def test_seed_records_with_plain_text_replies_are_read():
    record = {"messages": [{"role": "user", "content": "hi"}], "chosen": "ACTION: look", "rejected": "ACTION: look look",
              "reason": "loop"}
    pair = pair_from_record("x:1", record)
    assert (pair.chosen, pair.rejected, pair.reason, pair.chosen_from) == ("ACTION: look", "ACTION: look look", "loop", "dataset")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"messages": [], "chosen": "a"}, "missing ['rejected']"),
        ({"prompt": "p", "chosen": 3, "rejected": "b"}, "chosen must be a string"),
        ({"messages": ["hi"], "chosen": "a", "rejected": "b"}, "list of {role, content}"),
    ],
)
def test_bad_pair_records_are_clear_errors(record, message):
    with pytest.raises(ValueError, match="where:3") as e:
        pair_from_record("where:3", record)
    assert message in str(e.value)


def test_missing_pair_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="dpo pair data"):
        load_pairs(str(tmp_path / "nope.jsonl"))


def test_trajectory_that_does_not_replay_is_skipped(expert_trajectories, tasks):
    traj = Trajectory.from_json(expert_trajectories[0].to_json())
    traj.messages[2].content = "You are somewhere else."  # the first observation as another env would say it
    counts = MiningCounts()
    assert mine_dpo_pairs([traj], partial(make_env, "household"), {tasks[0].id: tasks[0]}, counts=counts) == []
    assert counts.not_replayable == 1


def test_a_teacher_writes_chosen_replies_and_only_defect_free_ones_are_kept(tasks, defective_trajectories):
    """The teacher is asked once for every decision point; a reply that replays without a defect becomes `chosen`
    ("teacher"), one that does not (here: the teacher repeats the rejected reply, or writes garbage on odd points)
    falls back to the sibling / expert reply and is counted."""
    by_id = {t.id: t for t in tasks}
    asked: list[int] = []

    def teacher(points):
        asked.append(len(points))
        replies = []
        for k, (task, history, _tools) in enumerate(points):
            env = make_env("household")
            env.reset(task)
            for m in history:
                if m.role == "assistant":
                    env.step(env.format.parse(m.content))
            replies.append(env.format.render(env.expert_reply()) if k % 2 == 0 else "I am not sure what to do.")
        return replies

    counts = MiningCounts()
    pairs = mine_dpo_pairs(defective_trajectories, partial(make_env, "household"), by_id, counts=counts, teacher=teacher)
    assert asked == [counts.defective_turns]  # one batch, every decision point
    sources = {p.chosen_from for p in pairs}
    assert "teacher" in sources and counts.teacher_rejected > 0
    for pair in pairs:
        env, _ = _step_history(pair, by_id[pair.task_id])
        assert pair.chosen != pair.rejected and not isinstance(env.format.parse(pair.chosen), FormatError)
    plain = mine_dpo_pairs(defective_trajectories, partial(make_env, "household"), by_id)
    assert len(pairs) == len(plain)  # a failed teacher reply never loses a pair the other sources give


def test_expert_chosen_replies_carry_the_thought_the_expert_policy_writes(tasks, tmp_path):
    """With `thoughts = "goal"` the expert writes a THOUGHT line before each action; a mined pair's expert
    `chosen` reply is that same text (a chosen reply without it would teach DPO to drop the format's thought)."""
    env_factory = partial(make_env, "household", thoughts="goal")
    task = tasks[0]
    expert = run_episodes(ExpertPolicy(), env_factory, [task], 1)[0]
    replies = [m.content for m in expert.messages if m.role == "assistant"]
    assert replies[0].startswith("THOUGHT: ")
    path = tmp_path / "replies.jsonl"
    path.write_text(json.dumps({"task_id": task.id, "replies": _inject("invalid_action", replies, task)}) + "\n")
    defective = run_episodes(ReplayPolicy(path), env_factory, [task], 1)
    counts = MiningCounts()
    pairs = mine_dpo_pairs(defective, env_factory, {task.id: task}, counts=counts)
    invalid = [p for p in pairs if p.reason == "invalid_action"]
    assert len(invalid) == 1 and invalid[0].chosen_from == "expert"
    # after "fly to the moon" (nothing happened) the expert's next reply is the one it wrote at that state
    assert invalid[0].chosen == replies[1]
