"""User-fault attribution (envs/service/user_faults.py): each rule on a hand-made conversation, the env recording
the faults in its details, and summary.json's per-domain counts over the failed episodes."""

from __future__ import annotations

from service_calls import ScriptedUserModel
from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.service.metrics import service_metrics
from turnforge.envs.service.user_faults import stated_facts, user_faults
from turnforge.types import Message, Score, StopReason, ToolCall, Trajectory

SCENARIO = {"instructions": {"reason_for_call": "You want to return order #W2378156.",
                             "known_info": "You are Yusuf Rossi in zip code 19122.",
                             "unknown_info": "You do not remember your email address."}}
HELLO = Message("assistant", "Hi! How can I help you today?")
TOGGLE = {"action_id": "t0", "requestor": "user", "name": "toggle_data", "arguments": {}}
REFUEL = {"action_id": "r0", "requestor": "assistant", "name": "refuel_data", "arguments": {}}


def _faults(conversation, termination="user_stop", goal_pending=False, user_tool_errors=0, gold=(), history=None):
    return user_faults(SCENARIO, conversation, history or conversation, termination, goal_pending, user_tool_errors,
                       list(gold))


def test_a_faithful_user_has_no_fault():
    conversation = [HELLO, Message("user", "I'd like to return order #W2378156; zip 19122."),
                    Message("assistant", "Found you: user yusuf_rossi_9620. Done."), Message("user", "###STOP###")]
    assert _faults(conversation) == []


def test_an_email_or_id_the_scenario_never_gave_is_unfounded():
    made_up = [HELLO, Message("user", "My email is yusuf.rossi@example.com and my order is #W9999999.")]
    assert _faults(made_up) == ["unfounded_fact"]
    # an id the agent said first is no invention
    echoed = [HELLO, Message("assistant", "Is it user yusuf_rossi_9620?"), Message("user", "Yes, yusuf_rossi_9620.")]
    assert _faults(echoed) == []
    assert stated_facts("Order #W2378156, phone 555-123-2002, 2.0 GB, 3 items.") == ["#W2378156", "555-123-2002"]


def test_stopping_with_the_goal_unmet_is_an_early_stop_unless_the_agent_transferred():
    stopped = [HELLO, Message("user", "Return #W2378156 please."), Message("assistant", "One moment."),
               Message("user", "Never mind. ###STOP###")]
    assert _faults(stopped, goal_pending=True) == ["early_stop"]
    assert _faults(stopped, goal_pending=False) == []
    out_of_scope = [*stopped[:-1], Message("user", "###OUT-OF-SCOPE###")]
    assert _faults(out_of_scope, goal_pending=True) == ["early_stop"]
    transfer = [*stopped[:-1], Message("user", "###TRANSFER###")]
    assert _faults(transfer, goal_pending=True) == ["early_stop"]  # the agent never transferred
    agent_transferred = [*stopped[:-1], Message("assistant", "", tool_calls=[ToolCall("transfer_to_human_agents", {})]),
                         Message("user", "###TRANSFER###")]
    assert _faults(transfer, goal_pending=True, history=agent_transferred) == []


def test_a_device_action_never_performed_and_a_user_tool_error():
    asked = [HELLO, Message("user", "No data on my phone."), Message("assistant", "Please toggle data on."),
             Message("user", "Done! ###STOP###")]
    assert _faults(asked, gold=[TOGGLE, REFUEL]) == ["missed_device_action"]  # said it, never called the tool
    # never asked in the rule's words (`users.asks_for`: the tool named): the agent's failure, or the judge's to say
    in_other_words = [*asked[:2], Message("assistant", "Please turn mobile data on."), asked[3]]
    assert _faults(in_other_words, gold=[TOGGLE, REFUEL]) == []
    assert _faults([*asked[:2], Message("assistant", "Sorry, I can't help with that."), asked[3]],
                   gold=[TOGGLE, REFUEL]) == []
    # the agent gave up (or ran out of errors) without the user ending anything: not the user's fault
    assert _faults(asked[:3], termination="agent_stop", gold=[TOGGLE, REFUEL]) == []
    assert _faults(asked[:3], termination="too_many_errors", gold=[TOGGLE, REFUEL]) == []
    toggled = [*asked[:3], Message("user", "", tool_calls=[ToolCall("toggle_data", {}, "u0")]),
               Message("tool", "Error: no such setting", tool_call_id="u0"), Message("user", "Done.")]
    assert _faults(toggled, gold=[TOGGLE, REFUEL], user_tool_errors=1) == ["user_tool_error"]


def test_a_protocol_break_is_the_users():
    assert _faults([HELLO], termination="user_error") == ["protocol_break"]


def test_the_env_records_the_faults_and_the_summary_counts_failed_episodes():
    task = load_tasks("service", "train", domain="desk")[0]
    env = make_env("service", domain="desk", user="hf:unused")
    env.use_roles({"user": ScriptedUserModel(["Hello, my email is nobody@nowhere.org. ###STOP###"])})
    env.reset(task)
    env.step(Message("assistant", "How can I help?"))
    score = env.score()
    assert not score.success and score.details["user_faults"] == ["unfounded_fact", "early_stop"]

    def episode(success, faults, stop=StopReason.user_stop):
        details = {"termination": "user_stop", "user_faults": faults}
        return Trajectory(task_id="t", env="service", category="desk", messages=[], turns=[], stop_reason=stop,
                          score=Score(success=success, reward=float(success), progress=0.0, details=details))

    figures = service_metrics([episode(True, []), episode(False, ["early_stop"]), episode(False, []),
                               episode(False, [], StopReason.env_error)])["desk"]["user_faults"]
    assert figures["failed"] == 2 and figures["attributed"] == 1 and figures["share"] == 0.5
    assert figures["by_fault"]["early_stop"] == 1 and figures["by_fault"]["unfounded_fact"] == 0


def test_the_report_gives_the_share_of_failures_attributed_to_the_user(tmp_path):
    from turnforge.report import Column, user_fault_table

    faults = {"failed": 4, "attributed": 1, "share": 0.25, "by_fault": {"early_stop": 1, "unfounded_fact": 0}}
    summary = {"env_metrics": {"retail": {"user_faults": faults}}}
    lines = user_fault_table([Column("grpo", summary, None, tmp_path)])
    assert "| retail | grpo | 4 | 1 (25%) | early stop 1 |" in lines
    assert user_fault_table([Column("sql", {"env_metrics": {"overall_cat_accuracy": 0.5}}, None, tmp_path)]) == []


def test_a_model_user_env_without_its_role_says_so_in_one_line():
    """Before: KeyError 'user' from deep in reset (e.g. an env made to replay episodes, outside a rollout)."""
    import pytest

    env = make_env("service", domain="desk", user="hf:somewhere")
    with pytest.raises(ValueError, match="user='hf:somewhere' plays the user with a model, but no `user` role"):
        env.reset(load_tasks("service", "train", domain="desk")[0])


def test_with_a_judge_a_failure_no_rule_explains_is_reviewed():
    task = load_tasks("service", "train", domain="desk")[0]

    def failed_episode(judge_says):
        env = make_env("service", domain="desk", user="hf:unused", judge="hf:unused-too")
        judge = ScriptedUserModel([judge_says])
        env.use_roles({"user": ScriptedUserModel(["Hello, I need some help with my appointment."]), "judge": judge})
        env.reset(task)
        env.step(Message("assistant", "###STOP###"))  # the agent gives up: no rule puts this on the user
        return env.score(), judge

    score, judge = failed_episode('{"user_fault": true, "reason": "it never said which appointment"}')
    assert not score.success and score.details["user_faults"] == ["judged_user_fault"] and not judge.texts
    score, _ = failed_episode('{"user_fault": false, "reason": "the agent quit"}')
    assert score.details["user_faults"] == [] and "user_review" not in score.details
    score, _ = failed_episode("I think the customer was fine.")  # not the JSON asked for: no verdict, not a fault
    assert score.details["user_faults"] == [] and score.details["user_review"] == "no_verdict"
