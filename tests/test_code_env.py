"""The code env: the expert solves every generated problem, wrong answers and failing programs score as such,
tool errors come back as observations, problem files are checked line by line."""

from __future__ import annotations

import json

import pytest

from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.code.checking import check_math, last_boxed, strict_match
from turnforge.envs.code.sandbox import isolation_mode
from turnforge.envs.code.tool import code_to_run
from turnforge.formats.base import FormatError
from turnforge.types import Message, StopReason, ToolCall


@pytest.fixture(scope="module")
def env():
    return make_env("code", generate=10, timeout=3.0)


def _call(code: str, name: str = "code_interpreter", **extra) -> Message:
    return Message("assistant", "", tool_calls=[ToolCall(name, {"code": code, **extra} if code is not None else {})])


def _episode(env, task, replies):
    env.reset(task)
    results = [env.step(r) for r in replies]
    return results, env.score()


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_generated_problem(env, split):
    tasks = load_tasks("code", split, generate=30)
    assert {t.category for t in tasks} == {"math", "code"}
    for task in tasks:
        env.reset(task)
        for _ in range(4):
            result = env.step(env.expert_reply())
            if result.done:
                break
        score = env.score()
        assert score.success and score.details["tool_calls"] == 1, (task.id, score, env.last_output)


def test_splits_are_disjoint_and_stable():
    train, test = load_tasks("code", "train", generate=20), load_tasks("code", "test", generate=20)
    assert {t.data["problem"] for t in train}.isdisjoint({t.data["problem"] for t in test if t.category == "math"})
    assert [t.data for t in train] == [t.data for t in load_tasks("code", "train", generate=20)]


def test_a_wrong_math_answer_fails(env):
    task = next(t for t in load_tasks("code", "test", generate=10) if t.category == "math")
    results, score = _episode(env, task, [Message("assistant", "I think it is \\boxed{12345678987654321}.")])
    assert results[-1].done and results[-1].stop is StopReason.failure and not score.success
    _, score = _episode(env, task, [Message("assistant", "No box at all: 3.")])
    assert not score.success and "boxed" in score.details["reason"]


def test_a_failing_program_scores_its_fraction(env):
    task = next(t for t in load_tasks("code", "test", generate=10) if t.data.get("kind") == "stdin")
    wrong = "```python\nprint(0)\n```"
    _, score = _episode(env, task, [Message("assistant", wrong)])
    assert not score.success and score.progress < 1.0
    _, score = _episode(env, task, [Message("assistant", "```python\nwhile True: pass\n```")])
    assert not score.success and score.details["test_timeouts"] >= 1


def test_tool_errors_are_observations(env):
    task = load_tasks("code", "test", generate=2)[0]
    env.reset(task)
    crash = env.step(_call("1/0"))
    assert not crash.done and "ZeroDivisionError" in crash.messages[0].content and crash.messages[0].role == "tool"
    unknown = env.step(_call("print(1)", name="python"))
    assert "no tool named 'python'" in unknown.messages[0].content
    missing = env.step(Message("assistant", "", tool_calls=[ToolCall("code_interpreter", {})]))
    assert "needs a non-empty string argument 'code'" in missing.messages[0].content
    bad = env.step(FormatError(reason="invalid JSON", text="<tool_call>{"))
    assert "Invalid tool call" in bad.messages[0].content and not bad.done
    loop = env.step(_call("while True: pass"))
    assert "TimeoutError" in loop.messages[0].content
    details = env.score().details
    assert (details["tool_errors"], details["sandbox_timeouts"], details["format_errors"]) == (4, 1, 1)


def test_episode_ends_after_max_turns():
    env = make_env("code", generate=2, max_turns=2, math_verify="strict")
    env.reset(load_tasks("code", "test", generate=2)[0])
    assert not env.step(_call("print(1)")).done
    last = env.step(_call("print(2)"))
    assert last.done and last.stop is StopReason.max_turns and not env.score().success


def test_last_expression_is_printed_and_the_first_fence_used(env):
    assert code_to_run("x = 3\nx * 2") == "x = 3\nprint(x * 2)"
    assert code_to_run("text\n```python\n2 + 2\n```\n```python\n9\n```") == "print(2 + 2)\n"
    env.reset(load_tasks("code", "test", generate=2)[0])
    assert env.step(_call("import math\nmath.factorial(5)")).messages[0].content == "120\n"


def test_boxed_checks():
    assert last_boxed("\\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert strict_match("so \\boxed{42}", "42") and not strict_match("so \\boxed{42.0}", "42")
    assert check_math("The answer is \\boxed{0.5}", "\\frac{1}{2}", "math_verify")[0]
    assert not check_math("The answer is \\boxed{3}", "2", "math_verify")[0]


def test_math_verify_works_off_the_main_thread():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(lambda a: check_math(f"\\boxed{{{a}}}", "10\\%", "math_verify")[0], ["0.1", "0.2"]))
    assert verdicts == [True, False]


def test_problem_file_and_its_errors(tmp_path, env):
    good = tmp_path / "p.jsonl"
    rows = [{"id": "m1", "problem": "1+1?", "answer": "2"},
            {"id": "c1", "problem": "echo", "tests": {"inputs": ["a\n"], "outputs": ["a\n"]}, "category": "io"}]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = load_tasks("code", "test", data=str(good))
    assert [(t.id, t.category) for t in tasks] == [("m1", "math"), ("c1", "io")]
    _, score = _episode(env, tasks[1], [Message("assistant", "```python\nprint(input())\n```")])
    assert score.success
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"id": "x", "problem": "p"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: a line needs exactly one of 'answer'"):
        load_tasks("code", "test", data=str(bad))
    bad.write_text('{"id": 1, "problem": "p", "tests": {"inputs": [1], "outputs": ["1"]}}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: stdin/stdout tests need string inputs"):
        load_tasks("code", "test", data=str(bad))


def test_function_tests_top_level_or_in_solution_class(env, tmp_path):
    file = tmp_path / "f.jsonl"
    file.write_text(json.dumps({"id": "f", "problem": "add", "tests": {"fn_name": "add", "inputs": [[1, 2], [3, 4]],
                                                                       "outputs": [3, 7]}}) + "\n")
    task = load_tasks("code", "test", data=str(file))[0]
    for program in ["def add(a, b):\n    return a + b\n", "class Solution:\n    def add(self, a, b):\n        return a + b\n"]:
        assert _episode(env, task, [Message("assistant", f"```python\n{program}```")])[1].success
    _, half = _episode(env, task, [Message("assistant", "```python\ndef add(a, b):\n    return 3\n```")])
    assert (half.success, half.progress) == (False, 0.5)


def _hermes(code: str) -> str:
    return "Let me compute.\n<tool_call>\n" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "\n</tool_call>"


def test_replay_file_gives_the_expected_verdicts_and_metrics(tmp_path):
    from turnforge.rollouts_file import run_eval

    tasks = load_tasks("code", "test", generate=4)
    math0, code1, math2, code3 = tasks
    lines = [
        {"task_id": math0.id, "replies": [_hermes(math0.data["expert_code"]), f"\\boxed{{{math0.data['answer']}}}"]},
        {"task_id": code1.id, "replies": ["```python\nprint('nope')\n```"]},
        {"task_id": math2.id, "replies": [_hermes("1/0"), "\\boxed{-1}"]},
        {"task_id": code3.id, "replies": [_hermes(code3.data["expert_code"]),
                                          f"```python\n{code3.data['expert_code']}```"]},
    ]
    replay = tmp_path / "replies.jsonl"
    replay.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    summary = run_eval("code", {"generate": 4}, f"replay:{replay}", "test", None, 1, 0, tmp_path / "out")
    episodes = [json.loads(x) for x in (tmp_path / "out/episodes.jsonl").read_text().splitlines()]
    verdicts = {e["task_id"]: e["score"]["success"] for e in episodes}
    assert verdicts == {math0.id: True, code1.id: False, math2.id: False, code3.id: True}
    metrics = summary["env_metrics"]
    assert metrics["all"]["avg@k"] == 0.5 and metrics["math"]["tool_calls_per_episode"] == 1.0
    assert metrics["math"]["tool_errors_per_episode"] == 0.5 and metrics["code"]["pass@k"] == {"1": 0.5}
    # which sandbox isolation ran (docs/security.md): namespaces, or the weaker rlimits where the host allows no more
    assert {e["score"]["details"]["sandbox_isolation"] for e in episodes} == {isolation_mode()}
    assert metrics["all"]["sandbox_isolation"] == isolation_mode()


def test_math_verdicts_do_not_depend_on_a_busy_machine():
    """Issue 40: each check started its own math-verify child under a 10 s wall clock; with many checks at once
    on busy cores, correct answers were graded wrong ("math-verify ran past 10 s"). Now the checks share warm
    children and are bounded by CPU time only: 2 cores kept busy change no verdict."""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    burners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        with ThreadPoolExecutor(24) as pool:
            verdicts = list(pool.map(lambda k: check_math(f"so \\boxed{{\\frac{{{k}}}{{2}}}}", f"{k / 2:g}", "math_verify"),
                                     range(1, 25)))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert verdicts == [(True, None)] * 24


def test_a_math_check_that_gives_no_verdict_is_an_env_error_redone_on_resume(tmp_path, monkeypatch):
    """Issue 40: a grader that hung, starved or crashed used to grade the answer wrong. Now the episode ends
    as an env error: the command fails naming it, and the same command redoes only those episodes."""
    from turnforge.envs.code import checking
    from turnforge.envs.isolation import CheckerUnavailable
    from turnforge.rollouts_file import EnvErrors, run_eval

    def no_answer(*_args, **_kwargs):
        raise CheckerUnavailable("the MathVerifier.verify checker gave no answer within 120 s: no verdict")

    monkeypatch.setattr(checking, "call_isolated", no_answer)
    options = {"generate": 4}
    with pytest.raises(EnvErrors, match="2 of 4 episodes ended in an env error.*gave no answer within 120 s"):
        run_eval("code", options, "expert", "test", None, 1, 0, tmp_path)
    episodes = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert sorted(e["stop_reason"] for e in episodes) == ["env_error", "env_error", "success", "success"]
    monkeypatch.undo()
    summary = run_eval("code", options, "expert", "test", None, 1, 0, tmp_path)
    assert summary["success"] == 1.0 and summary["stop_reasons"] == {"success": 4}


def test_a_math_check_past_its_cpu_budget_is_a_wrong_answer(monkeypatch):
    """Too expensive to check is a property of the reply (the same on any machine), so it stays a verdict."""
    from turnforge.envs.code import checking
    from turnforge.envs.isolation import IsolatedResult

    monkeypatch.setattr(checking, "call_isolated", lambda *a, **k: IsolatedResult(over_budget="cpu"))
    assert check_math("\\boxed{9^{9^{9^{9}}}}", "2", "math_verify") == (
        False, "math-verify needed more than 10 CPU s for this answer (too expensive to check)")
