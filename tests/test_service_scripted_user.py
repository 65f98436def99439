"""Issue 60: the scripted user does the user's gold actions only when the agent asks for them, so an agent that does
nothing earns exactly the tasks that need nothing (the do-nothing floor the eval tables show); a solved episode has
progress 1.0; banking's scripted user opens with the customer's words. On every shipped domain of
../shared/data/tau2 (skipped where it is absent)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from turnforge.envs.base import make_env
from turnforge.envs.service import users
from turnforge.envs.service.domain import Domain, load_domain
from turnforge.envs.service.env import do_nothing_wins
from turnforge.envs.service.users import ScriptedUser, asks_for, is_user_stop
from turnforge.eval import table
from turnforge.types import Message, Score

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
DOMAINS = ("telecom", "banking_knowledge", "retail", "airline")
SORRY = "Sorry, I can't help with that."


def _domain(name: str) -> Domain:
    if not (TAU2 / name / "tasks.json").is_file():
        pytest.skip(f"../shared/data/tau2/{name} absent")
    return load_domain(name, str(TAU2 / name))


def _play(env, domain: Domain, task_id: str, agent) -> Score:
    env.reset(domain.to_task(task_id, "train"))
    for _ in range(300):
        if env.step(agent(env)).done:
            break
    return env.score()


def _needs_nothing(domain: Domain, task: dict) -> bool:
    """From the task's gold alone: neither side has anything to change (the gold state, both sides' gold actions
    applied, is the initial state, and every env assertion holds at the start), and the verdict asks the agent for no
    call (ACTION with gold actions) and no words (COMMUNICATE with `communicate_info`)."""
    criteria = task.get("evaluation_criteria") or {}
    basis = criteria.get("reward_basis") or ["DB", "COMMUNICATE"]
    start = domain.new_state(task)
    unchanged = start.same_state(domain.gold(task["id"]).state)
    holds = all(start.assertion_met(a) for a in criteria.get("env_assertions") or [])
    calls = "ACTION" in basis and criteria.get("actions")
    words = "COMMUNICATE" in basis and criteria.get("communicate_info")
    return unchanged and holds and not calls and not words


# Tasks a do-nothing agent wins, per domain, with the user acting only when asked (before: telecom 14, banking 4:
# task_001 / 003 / 007 / 024, whose users applied for the gold card unasked; retail 7, airline 16 then as now).
FLOOR = {"telecom": 0, "banking_knowledge": 0, "retail": 7, "airline": 16}


@pytest.mark.parametrize("name", DOMAINS)
def test_a_do_nothing_agent_wins_exactly_the_tasks_that_need_nothing(name):
    domain = _domain(name)
    env = make_env("service", domain=name, data_dir=str(TAU2 / name))
    scores = {i: _play(env, domain, i, lambda env: Message("assistant", SORRY)) for i in domain.tasks}
    won = {i for i, s in scores.items() if s.success}
    assert won == {i for i, task in domain.tasks.items() if _needs_nothing(domain, task)}
    assert len(won) == FLOOR[name], sorted(won)
    # the floor's one home says the same, and every episode records it for the eval tables
    assert won == {i for i, task in domain.tasks.items() if do_nothing_wins(domain, task)}
    assert all(s.details["do_nothing_wins"] == (i in won) for i, s in scores.items())
    assert not any(m.get("tool_calls") for s in scores.values() for m in s.details["user_side"])  # nobody asked


@pytest.mark.parametrize("name", DOMAINS)
def test_every_expert_episode_is_solved_with_progress_one(name):
    """Before: banking 5 / 49, retail 6 / 74 and airline 17 / 30 solved episodes had progress 0.0 (their only gold
    write the user's, or none at all)."""
    domain = _domain(name)
    env = make_env("service", domain=name, data_dir=str(TAU2 / name))
    scores = {i: _play(env, domain, i, lambda env: env.expert_reply()) for i in domain.tasks}
    assert [i for i, s in scores.items() if not s.success] == []
    assert {i: s.progress for i, s in scores.items() if s.progress != 1.0} == {}


def test_the_user_acts_on_its_phone_when_asked_and_only_then():
    domain = _domain("telecom")
    task_id = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"  # toggle_data (user), refuel (agent)
    env = make_env("service", domain="telecom", data_dir=str(TAU2 / "telecom"))
    env.reset(domain.to_task(task_id, "train"))

    def device_calls():
        return [c.name for m in env.conversation if m.role == "user" for c in m.tool_calls or []]

    assert env.step(Message("assistant", "Could you check your phone's settings?")).messages[0].content == \
        "Yes, I confirm. Please go ahead."
    assert device_calls() == []
    out = env.step(Message("assistant", "Please toggle data on your phone."))
    assert device_calls() == ["toggle_data"] and out.messages[0].content == "Done."
    assert env.step(Message("assistant", "Please toggle data on your phone.")).messages[0].content != "Done."
    assert device_calls() == ["toggle_data"]  # the next gold action is the agent's: asking again does nothing


def test_the_rule_for_asks():
    action = {"name": "apply_for_credit_card", "requestor": "user",
              "arguments": {"card_type": "Gold Rewards Card", "customer_name": "Sarah Bosch", "annual_income": 100000,
                            "rho_bank_subscription": True}}
    assert asks_for('Please do this on your phone: apply_for_credit_card {"card_type": "Gold Rewards Card", '
                    '"customer_name": "Sarah Bosch", "annual_income": 100000, "rho_bank_subscription": true}', action)
    assert asks_for("Please Apply For Credit Card: gold rewards card, Sarah Bosch, income 100,000, subscription true",
                    action)
    assert not asks_for("I recommend the Gold Rewards Card, Sarah Bosch.", action)  # the tool is not named
    assert not asks_for("Please apply for credit card: the Gold Rewards Card.", action)  # nor every argument
    given = {"name": "call_discoverable_user_tool", "arguments": {
        "discoverable_tool_name": "get_card_last_4_digits", "arguments": '{"credit_card_account_id": "cc_01f2_gold"}'}}
    assert asks_for("Please use call_discoverable_user_tool with get_card_last_4_digits for cc_01f2_gold.", given)
    assert not asks_for("Please use call_discoverable_user_tool with get_card_last_4_digits.", given)


def test_banking_scripted_user_opens_with_the_customers_words():
    domain = _domain("banking_knowledge")
    openings = {i: ScriptedUser(task).opening for i, task in domain.tasks.items()}
    # before: the role-play prompt itself, "You are playing the role of a customer contacting a customer service..."
    assert openings["task_001"] == "I'm looking for a credit card to use for my everyday purchases."
    assert openings["task_005"] == "I want to check my account balance for my gold rewards card."
    assert openings["task_007"] == ("I'm looking for a credit card with the best promotional offer that gives me "
                                    "points or cash back as a sign-up bonus.")
    assert openings["task_016"] == ("Hi, I referred a friend to sign up for one of your credit cards and they've been "
                                    "using it, but I still haven't received my referral bonus. Can you help me figure "
                                    "out what's going on?")
    for task_id, opening in openings.items():
        assert opening and not is_user_stop(opening), task_id
        assert not any(w in opening.lower() for w in ("playing the role", "your character", "**", "\n")), task_id
    env = make_env("service", domain="banking_knowledge", data_dir=str(TAU2 / "banking_knowledge"))
    assert env.reset(domain.to_task("task_001", "test"))[-1].content == openings["task_001"]


def test_the_rules_examples_hold():
    assert doctest.testmod(users).failed == 0 and doctest.testmod(users).attempted >= 5
    assert doctest.testmod(table).failed == 0


def test_the_eval_tables_show_the_floor_computed_from_the_evaluated_tasks(tmp_path):
    from rich.console import Console

    from turnforge.pipeline import print_comparison
    from turnforge.rollouts_file import run_eval

    domain = _domain("airline")
    summary = run_eval("service", {"domain": "airline", "data_dir": str(TAU2 / "airline")}, "expert", "train", 6, 1, 0,
                       tmp_path / "eval")
    tasks = list(domain.split_ids("train"))[:6]
    floor = sum(do_nothing_wins(domain, domain.tasks[i]) for i in tasks) / len(tasks)
    assert 0.0 < floor < 1.0 and summary["env_metrics"]["airline"]["do_nothing_floor"] == floor
    console = Console(record=True, width=150)
    console.print(table.summary_tables(summary))
    print_comparison({"recipe": "r", "eval": {"expert": summary}}, console)
    text = console.export_text()
    assert text.count("do-nothing floor") == 2 and f"{100 * floor:.1f}%" in text
