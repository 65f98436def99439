"""The bfcl env on bfcl-eval's real data and classes: tasks, splits, turn protocol, expert, eval, replay."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("bfcl_eval", reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2025.6.8)")

from turnforge.envs.base import load_tasks, make_env  # noqa: E402
from turnforge.envs.bfcl.data import CATEGORIES, BfclUnavailable, installed_version, locate  # noqa: E402
from turnforge.envs.bfcl.env import ADDED_FUNCTIONS_MESSAGE  # noqa: E402
from turnforge.formats.base import FormatError  # noqa: E402
from turnforge.policies import make_policy  # noqa: E402
from turnforge.rollout import run_episodes  # noqa: E402
from turnforge.rollouts_file import run_eval  # noqa: E402
from turnforge.types import Message, StopReason, ToolCall  # noqa: E402


def _task(task_id: str):
    category = task_id.rsplit("_", 1)[0]
    return next(t for t in load_tasks("bfcl", "test", category=category) if t.id == task_id)


def _calls(*calls: tuple[str, dict]) -> Message:
    return Message("assistant", "", tool_calls=[ToolCall(n, a, id=f"c{i}") for i, (n, a) in enumerate(calls)])


END = Message("assistant", "Done.")


# ---- data --------------------------------------------------------------------------------------------


def test_every_category_has_200_entries_with_bfcl_ids_difficulty_and_ground_truth():
    tasks = load_tasks("bfcl", "test")
    assert len(tasks) == 800
    for category in CATEGORIES:
        mine = [t for t in tasks if t.category == category]
        assert [t.id for t in mine] == [f"{category}_{i}" for i in range(200)]
        assert all(t.data["difficulty"] == len(t.data["question"]) == len(t.data["ground_truth"]) for t in mine)
    turns = {c: [t.data["difficulty"] for t in tasks if t.category == c] for c in CATEGORIES}
    # Counted in the 2025.6.8 wheel (benchmarks.md §1 gives 2026.3.23's, which differ slightly);
    # miss_func and miss_param have one more turn: the holdout turn / the clarification turn.
    base = {1: 3, 2: 38, 3: 48, 4: 51, 5: 44, 6: 14, 7: 2}
    for category, extra in (("multi_turn_base", 0), ("multi_turn_long_context", 0), ("multi_turn_miss_func", 1)):
        assert {k: turns[category].count(k) for k in sorted(set(turns[category]))} == {
            k + extra: n for k, n in base.items()
        }


def test_train_and_heldout_are_seeded_disjoint_halves_of_each_category():
    train = load_tasks("bfcl", "train", category="multi_turn_base")
    held = load_tasks("bfcl", "heldout", category="multi_turn_base")
    assert len(train) == len(held) == 100
    assert not {t.id for t in train} & {t.id for t in held}
    assert [t.id for t in train] == [t.id for t in load_tasks("bfcl", "train", category="multi_turn_base")]
    other = load_tasks("bfcl", "train", category="multi_turn_base", split_seed=1)
    assert {t.id for t in other} != {t.id for t in train}
    both = load_tasks("bfcl", "train", category="all")
    assert len(both) == 400 and {t.category for t in both} == set(CATEGORIES)


def test_asking_for_another_bfcl_eval_version_is_a_clear_error():
    assert locate("installed").version == installed_version()
    other = "2026.3.23" if installed_version() != "2026.3.23" else "2025.6.8"
    with pytest.raises(BfclUnavailable, match=rf"version='{other}'.*pip install --no-deps bfcl-eval=={other}"):
        load_tasks("bfcl", "test", category="multi_turn_base", version=other)


# ---- turn protocol -----------------------------------------------------------------------------------


def test_calls_run_on_the_real_classes_and_a_reply_without_calls_ends_the_turn():
    env = make_env("bfcl")
    with pytest.raises(RuntimeError, match=r"call reset\(task\) before tools\(\)"):  # tools are per entry
        env.tools()
    first = env.reset(_task("multi_turn_base_0"))
    assert [m.role for m in first] == ["system", "user"]
    assert {t["function"]["name"] for t in env.tools()} >= {"cd", "mkdir", "mv", "post_tweet"}
    out = env.step(_calls(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"})))
    assert [m.role for m in out.messages] == ["tool", "tool"]
    assert json.loads(out.messages[0].content) == {"current_working_directory": "document"}
    assert out.messages[0].tool_call_id == "c0" and out.messages[1].content == "None"
    assert not out.done and out.info["progress"] == 0
    out = env.step(_calls(("mv", {"source": "final_report.pdf", "destination": "temp"})))
    out = env.step(END)  # turn 0 done and correct: turn 1's user message comes
    assert [m.role for m in out.messages] == ["user"] and "grep" in out.messages[0].content
    assert out.info["turn_valid"] and out.info["progress"] == pytest.approx(1 / 4)


def test_a_wrong_turn_fails_the_entry_with_bfcls_error_type_and_partial_progress():
    env = make_env("bfcl")
    env.reset(_task("multi_turn_base_0"))
    env.step(_calls(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"})))
    out = env.step(END)  # forgot the mv
    assert out.info["turn_valid"] is False
    score = env.score()
    assert not score.success and score.details["error_type"] == "multi_turn:force_terminated"  # not finished
    for _ in range(3):
        out = env.step(END)
    assert out.done and out.stop == StopReason.failure
    details = env.score().details
    assert details["failed_turn"] == 0 and details["error_type"] == "multi_turn:instance_state_mismatch"


def test_miss_func_removes_the_function_then_adds_it_back_with_bfcls_message():
    task = _task("multi_turn_miss_func_0")  # missed_function {"3": ["sort"]}
    env = make_env("bfcl")
    env.reset(task)
    assert "sort" not in {t["function"]["name"] for t in env.tools()}
    for turn in range(3):
        out = env.step(env.expert_reply())
        if task.data["ground_truth"][turn]:
            out = env.step(END)
    assert out.messages[-1].content.endswith(ADDED_FUNCTIONS_MESSAGE)
    assert "'name': 'sort'" in out.messages[-1].content
    assert "sort" in {t["function"]["name"] for t in env.tools()}


def test_more_than_20_steps_in_a_turn_force_quits_the_entry():
    env = make_env("bfcl")
    env.reset(_task("multi_turn_base_0"))
    for _ in range(20):
        assert not env.step(_calls(("pwd", {}))).done
    out = env.step(_calls(("pwd", {})))  # the 21st step with calls: BFCL's count > MAXIMUM_STEP_LIMIT
    assert out.done and out.stop == StopReason.failure
    assert env.score().details["error_type"] == "multi_turn:force_terminated"


def test_unparsable_reply_ends_the_turn_or_with_hints_asks_again():
    bad = FormatError(reason="tool call 1: invalid JSON", text="<tool_call>{oops</tool_call>")
    plain = make_env("bfcl")
    plain.reset(_task("multi_turn_base_0"))
    assert "grep" in plain.step(bad).messages[0].content  # BFCL: a decode failure ends the turn
    hinted = make_env("bfcl", hints=True)
    hinted.reset(_task("multi_turn_base_0"))
    out = hinted.step(bad)
    assert out.messages[0].content.startswith("Invalid tool call") and hinted.turn == 0


def test_episodes_of_one_entry_never_share_state():
    task = _task("multi_turn_long_context_0")
    first, second = make_env("bfcl"), make_env("bfcl")
    first.reset(task)
    second.reset(task)
    first.step(_calls(("cd", {"folder": "document"}), ("mkdir", {"dir_name": "temp"})))
    assert json.loads(second.step(_calls(("pwd", {}))).messages[0].content)["current_working_directory"] == "/workspace"
    for a, b in zip(first.model_instances.values(), second.model_instances.values(), strict=True):
        assert a is not b


# ---- expert, formats, eval, replay -----------------------------------------------------------------


@pytest.mark.parametrize("format_name", ["tool_call", "bfcl_python"])
def test_expert_solves_a_sample_of_every_category_through_run_episodes(format_name):
    tasks = [t for c in CATEGORIES for t in load_tasks("bfcl", "test", category=c)[::8]]
    trajs = run_episodes(make_policy("expert"), lambda: make_env("bfcl", format=format_name), tasks, 1)
    assert [t.task_id for t in trajs if not t.score.success] == []
    assert all(t.score.progress == 1.0 and all(turn.parse_ok for turn in t.turns) for t in trajs)


@pytest.mark.slow
@pytest.mark.parametrize("format_name", ["tool_call", "bfcl_python"])
def test_expert_solves_all_800_entries(format_name):
    tasks = load_tasks("bfcl", "test")
    trajs = run_episodes(make_policy("expert"), lambda: make_env("bfcl", format=format_name), tasks, 1)
    assert sum(t.score.success for t in trajs) == 800


def test_eval_summary_uses_bfcl_category_names_and_ids(tmp_path):
    summary = run_eval("bfcl", {"category": "multi_turn_miss_param"}, "expert", "test", 12, 1, 0, tmp_path)
    assert summary["by_category"] == {"multi_turn_miss_param": {"n": 12, "success": 1.0}}
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    assert {json.loads(line)["task_id"] for line in lines} == {f"multi_turn_miss_param_{i}" for i in range(12)}


def test_replay_of_saved_tool_call_messages_rescores_them(tmp_path):
    """BFCL outputs as assistant messages with tool_calls, one per step; no calls = end of the turn."""
    gt = _task("multi_turn_base_0").data["ground_truth"]
    right = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "cd", "arguments": {"folder": "document"}}},
            {"type": "function", "function": {"name": "mkdir", "arguments": '{"dir_name": "temp"}'}},
        ]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "mv", "arguments": {"source": "final_report.pdf", "destination": "temp"}}}]},
        {"role": "assistant", "content": "Moved."},
    ]  # fmt: skip
    wrong = right[:1] + right[2:]  # no mv
    lines = [{"task_id": "multi_turn_base_0", "sample": s, "messages": m} for s, m in ((0, right), (1, wrong))]
    replay = tmp_path / "bfcl_outputs.jsonl"
    replay.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for format_name in ("tool_call", "bfcl_python"):
        trajs = run_episodes(
            make_policy(f"replay:{replay}"),
            lambda f=format_name: make_env("bfcl", format=f),
            [_task("multi_turn_base_0")],
            2,
        )
        assert [t.turns[0].parse_ok for t in trajs] == [True, True]
        assert [t.score.details["turns_correct"] for t in trajs] == [1, 0]
        assert all(t.stop_reason == StopReason.gave_up for t in trajs)  # replies ran out after turn 0
    assert len(gt) == 4


def test_a_runaway_math_call_ends_its_episode_with_timeout_and_not_the_run():
    """Issue 17: `power(10, 10**12)` / `square_root(2, precision=10**9)` hung a whole eval. MathAPI calls now run
    in a child process with a time and memory cap: past the time the episode ends (timeout); the next episode,
    and its calls, work."""
    task = next(t for t in load_tasks("bfcl", "test", category="all") if "MathAPI" in t.data["involved_classes"])
    env = make_env("bfcl", call_timeout=1.0)
    env.reset(task)
    out = env.step(_calls(("power", {"base": 10, "exponent": 10**12})))
    assert out.done and out.stop is StopReason.timeout and "past its 1 s limit" in out.messages[0].content
    score = env.score()
    assert not score.success and score.details["timed_out"]
    env.reset(task)
    out = env.step(_calls(("add", {"a": 2, "b": 3})))
    assert json.loads(out.messages[0].content) == {"result": 5} and not out.done


def test_a_math_call_whose_checker_gives_no_answer_is_an_env_error_not_a_timeout(monkeypatch):
    """Issue 40: the MathAPI child's limit was wall-clock time, so a loaded machine ended episodes with
    StopReason.timeout, a score. The budget is now CPU time (the model's runaway, as above); a child that gave no
    answer within the pool's wall clock raises CheckerUnavailable out of step, which the rollout records as the
    episode's env error."""
    from turnforge.envs.bfcl import execution
    from turnforge.envs.isolation import CheckerUnavailable

    def no_answer(*_args, **_kwargs):
        raise CheckerUnavailable("the MathAPI.add checker gave no answer within 120 s: no verdict")

    task = next(t for t in load_tasks("bfcl", "test", category="all") if "MathAPI" in t.data["involved_classes"])
    env = make_env("bfcl")
    env.reset(task)
    monkeypatch.setattr(execution, "call_isolated", no_answer)
    with pytest.raises(CheckerUnavailable, match="no verdict"):
        env.step(_calls(("add", {"a": 2, "b": 3})))
