"""Issue 46: parity with tau2-bench's own orchestrator and evaluator where they had differed: re-grading a run
reproduces its verdicts (telecom included: the user's device calls are recorded and replayed), a tool call whose
arguments are not JSON ends the conversation (tau2's agent raises there), a user without tools who sends a tool
call is answered "Error: User tools not available", and a saved call with non-JSON arguments is replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service_calls import ScriptedUserModel
from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.service.env import GREETING, ServiceEnv
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.types import Message, ToolCall

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
needs_data = pytest.mark.skipif(not (DATA / "telecom" / "user_db.toml").is_file(), reason="../shared/data/tau2 absent")
render = get_format("tool_call").render


def _eval(tmp_path: Path, name: str, options: dict, policy: str, tasks: int) -> list[dict]:
    from turnforge.rollouts_file import run_eval

    run_eval("service", options, policy, "test", tasks, 1, 0, tmp_path / name)
    return [json.loads(line) for line in (tmp_path / name / "episodes.jsonl").read_text().splitlines()]


def _verdict(episode: dict) -> tuple:
    details = episode["score"]["details"]
    return (episode["task_id"], episode["score"]["reward"], episode["score"]["success"], details["termination"],
            details["reward_breakdown"], episode["stop_reason"])


@needs_data
@pytest.mark.parametrize("domain", ["retail", "airline", "telecom"])
@pytest.mark.parametrize("policy", ["expert", "random"])
def test_regrading_a_run_reproduces_its_verdicts(tmp_path, domain, policy):
    """`--env-opt user=replay --policy replay:RUN/episodes.jsonl` on turnforge's own run gives every episode its
    recorded verdict (before: telecom's user replayed without its device calls, so few tasks re-graded alike)."""
    options = {"domain": domain, "data_dir": str(DATA / domain)}
    run = _eval(tmp_path, "run", options, policy, 6)
    regraded = _eval(tmp_path, "regrade", {**options, "user": "replay"},
                     f"replay:{tmp_path / 'run' / 'episodes.jsonl'}", 6)
    assert sorted(map(_verdict, regraded)) == sorted(map(_verdict, run))
    if domain == "telecom" and policy == "expert":
        assert any(m.get("tool_calls") for e in run for m in e["score"]["details"]["user_side"])


@needs_data
def test_a_telecom_episode_saved_without_the_users_device_calls_is_refused(tmp_path):
    """A dual-control episode whose record lacks the user's side (an older run) would replay a user who never
    touched its phone: refused, one line naming the file, line, task and what to do."""
    from typer.testing import CliRunner

    from turnforge.cli import app

    options = {"domain": "telecom", "data_dir": str(DATA / "telecom")}
    (episode,) = _eval(tmp_path, "run", options, "expert", 1)
    del episode["score"]["details"]["user_side"]
    saved = tmp_path / "old.jsonl"
    saved.write_text(json.dumps(episode) + "\n")
    result = CliRunner().invoke(app, ["eval", "--env", "service", "--env-opt", "domain=telecom", "--env-opt",
                                      f"data_dir={DATA / 'telecom'}", "--env-opt", "user=replay", "--policy",
                                      f"replay:{saved}", "--out", str(tmp_path / "regrade")])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and line.startswith(f"error: {saved}:1: task {episode['task_id']!r} sample 0")
    assert "user_side" in line and "Traceback" not in result.output


def _desk_env(**options) -> tuple[ServiceEnv, object]:
    from turnforge.envs.service.domain import load_domain

    env = make_env("service", domain="desk", **options)
    task = load_domain("desk").to_task(next(iter(load_domain("desk").tasks)), "test")
    env.reset(task)
    return env, task


def _a_read_call(env: ServiceEnv) -> str:
    gold = env.spec["evaluation_criteria"]["actions"]
    read = next(a for a in gold if env.domain.tool_kinds().get(a["name"]) != "write")
    return json.dumps({"name": read["name"], "arguments": "{'broken"})


def test_a_call_whose_arguments_are_not_json_ends_the_conversation():
    """tau2's `generate` runs `json.loads` on each call's arguments (utils/llm_utils.py): it raises there and the
    conversation ends with no verdict but 0. Default here: the episode ends, termination agent_error, reward 0."""
    env, _ = _desk_env()
    bad = env.format.parse(f"<tool_call>\n{_a_read_call(env)}\n</tool_call>")
    assert isinstance(bad, FormatError)
    out = env.step(bad)
    assert out.done and out.messages == [] and out.stop.value == "failure"
    score = env.score()
    assert score.details["termination"] == "agent_error" and score.reward == 0.0 and not score.success


def test_the_forgiving_option_answers_an_unreadable_call_and_goes_on():
    """`on_bad_call=observe` (training): the format's error comes back as a tool observation, a tool error."""
    env, _ = _desk_env(on_bad_call="observe")
    out = env.step(env.format.parse(f"<tool_call>\n{_a_read_call(env)}\n</tool_call>"))
    assert not out.done and out.messages[0].content.startswith("Invalid tool call: ")
    assert env.errors == 1


def test_a_user_without_tools_who_calls_one_is_told_so_and_goes_on():
    """tau2: a user's tool call goes to the environment, whose `make_tool_call(requestor="user")` raises "User
    tools not available" for a domain without user tools: the user gets "Error: User tools not available" (a tool
    error) and the conversation goes on. Before: the markup reached the agent as the user's text."""
    call = render(Message("assistant", "", tool_calls=[ToolCall("check_status_bar", {})]))
    env = make_env("service", domain="desk", user="hf:unused")
    env.use_roles({"user": ScriptedUserModel(["I need help.", call, "My order is late."])})
    from turnforge.envs.service.domain import load_domain

    env.reset(load_domain("desk").to_task(next(iter(load_domain("desk").tasks)), "test"))
    out = env.step(Message("assistant", "What is the problem?"))
    assert [m.content for m in out.messages] == ["My order is late."] and not out.done
    answer = next(m for m in env.history if m.role == "tool")
    assert answer.content == "Error: User tools not available" and env.errors == 1
    assert env.score().details["user_errors"] == 0


@needs_data
def test_a_replayed_retail_user_tool_call_is_answered_and_the_replay_stays_in_step(tmp_path):
    """The same in a re-grading: the saved user tool call is replayed as a call (answered with the error), so the
    next saved user message answers the next agent message and the episode ends as saved (USER_STOP)."""
    options = {"domain": "retail", "data_dir": str(DATA / "retail")}
    (episode,) = _eval(tmp_path, "run", options, "expert", 1)
    messages = [m for m in episode["messages"] if m["role"] != "system"]
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    stray = {"role": "user", "content": "", "tool_calls": [
        {"id": "u1", "type": "function", "function": {"name": "get_user_details", "arguments": "{}"}}]}
    messages[first_user + 1:first_user + 1] = [stray, {"role": "tool", "content": "Error: User tools not available",
                                                      "tool_call_id": "u1"}]
    saved = tmp_path / "stray.jsonl"
    saved.write_text(json.dumps({"task_id": episode["task_id"], "messages": messages}) + "\n")
    (regraded,) = _eval(tmp_path, "regrade", {**options, "user": "replay"}, f"replay:{saved}", 1)
    details = regraded["score"]["details"]
    assert details["termination"] == "user_stop" and regraded["score"]["reward"] == episode["score"]["reward"] == 1.0
    assert details["tool_errors"] == 1


def test_a_saved_call_with_non_json_arguments_is_replayed_not_the_file_refused(tmp_path):
    """One call with non-JSON arguments used to refuse the whole file ("messages must be a list of ..."); it is
    replayed as written, and graded as tau2 grades it live (the conversation ends there, reward 0)."""

    task_id = load_tasks("service", "test", domain="desk")[0].id
    bad = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": "{'order_id': 1"}}]}
    line = {"task_id": task_id, "messages": [{"role": "assistant", "content": GREETING},
                                             {"role": "user", "content": "Hi."}, bad,
                                             {"role": "user", "content": "###STOP###"}]}
    saved = tmp_path / "bad_args.jsonl"
    saved.write_text(json.dumps(line) + "\n")
    (regraded,) = _eval(tmp_path, "regrade", {"domain": "desk", "user": "replay"}, f"replay:{saved}", None)
    assert regraded["score"]["details"]["termination"] == "agent_error" and regraded["score"]["reward"] == 0.0


def test_a_reply_that_cannot_be_replayed_is_named_in_the_files_error(tmp_path):
    """The file-level error names the line, the reply and what is wrong with it (before: "messages must be a list
    of {role, content} objects ...: 'name'", whatever the fault)."""
    from turnforge.policies.scripted import load_replies

    nameless = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}
    saved = tmp_path / "nameless.jsonl"
    saved.write_text(json.dumps({"task_id": "t", "messages": [{"role": "user", "content": "Hi."},
                                                              {"role": "assistant", "content": "Sure."}, nameless]}))
    with pytest.raises(ValueError) as caught:
        load_replies(saved)
    assert str(caught.value) == (f"{saved}:1: task 't' reply 2 cannot be replayed (tool call 1 has no function name); "
                                 "a reply is a message with content a string or text parts, and tool calls each "
                                 "with a name and arguments")


def test_a_user_tool_call_without_a_name_is_one_line_naming_the_conversation(tmp_path):
    from turnforge.envs.service.users import ReplayUserPolicy

    saved = tmp_path / "nameless_user.jsonl"
    saved.write_text(json.dumps({"task_id": "t", "messages": [
        {"role": "user", "content": "", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]}) + "\n")
    with pytest.raises(ValueError, match=rf"^{saved}:1: task 't' sample 0: a user message cannot be replayed"):
        ReplayUserPolicy(saved)
