"""Issue 60: the scripted user does the user's gold actions only when the agent asks for them; a solved episode has
progress 1.0; banking's scripted user opens with the customer's words. On every shipped domain of
../shared/data/tau2 (skipped where it is absent)."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from turnforge.envs.base import make_env
from turnforge.envs.service import users
from turnforge.envs.service.domain import Domain, load_domain
from turnforge.envs.service.users import ScriptedUser, asks_for, is_user_stop
from turnforge.types import Message, Score

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
DOMAINS = ("telecom", "banking_knowledge", "retail", "airline")


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

