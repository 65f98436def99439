"""Telecom (tau2-bench dual control) on tau2's telecom data: agent and device tools with tau2's strings, the
initial state, env assertions, the user calling its own tools mid-conversation, and the expert's gold runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from service_calls import ScriptedUserModel, err, ok
from turnforge.envs.base import make_env
from turnforge.envs.service.domain import load_domain
from turnforge.envs.service.users import SIMULATION_GUIDELINES_TOOLS, ModelUser
from turnforge.formats import get_format
from turnforge.policies.base import Generation
from turnforge.types import Message, ToolCall

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2" / "telecom"
pytestmark = pytest.mark.skipif(not (DATA / "user_db.toml").is_file(), reason="../shared/data/tau2/telecom absent")
# John Smith: customer C1001, lines L1001 (Active, P1001), L1002 (Active, P1002: 15 GB, $2/GB refuel, roaming on),
# L1003 (Suspended); bills B1002 Issued, B1003 Draft
OVERDUE = "[service_issue]break_apn_settings|overdue_bill_suspension|unseat_sim_card[PERSONA:Hard]"


@pytest.fixture(scope="module")
def domain():
    return load_domain("telecom", str(DATA))


def test_thirteen_agent_tools_and_thirty_device_tools(domain):
    assert len(domain.tool_kinds()) == 13 and "refuel_data" in domain.tool_kinds()
    device = domain.kind.user.toolkit.tool_kinds()
    assert len(device) == 30
    assert {"toggle_airplane_mode", "check_status_bar", "run_speed_test", "reboot_device", "reseat_sim_card",
            "reset_apn_settings", "toggle_roaming", "make_payment"} <= set(device)
    assert domain.policy.startswith("<main_policy>\n") and domain.policy.endswith("\n</tech_support_policy>")


def test_agent_tools_with_tau2_values_and_errors(domain):
    tools = domain.toolkit(domain.new_db())
    assert ok(tools, "get_customer_by_phone", phone_number="555-123-2002")["customer_id"] == "C1001"
    assert err(tools, "get_customer_by_phone", phone_number="000") == "Error: Customer with phone number 000 not found"
    assert err(tools, "get_details_by_id", id="X1") == "Error: Unknown ID format or type: X1"
    assert err(tools, "get_details_by_id", id="L9999") == "Error: Line with ID L9999 not found"
    assert err(tools, "suspend_line", customer_id="C1001", line_id="L1003", reason="x") == \
        "Error: Line must be active to suspend"
    assert err(tools, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=0) == \
        "Error: Refuel amount must be positive"
    assert err(tools, "refuel_data", customer_id="C1002", line_id="L1002", gb_amount=1) == \
        "Error: Line L1002 not found for customer C1002"
    # 2 GB at P1002's $2/GB: $4 on the draft bill B1003; numbers come back as strings, as tau2 writes them
    assert ok(tools, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=2.0) == {
        "message": "Successfully added 2.0 GB of data for line L1002 for $4.00", "new_data_refueling_gb": "2.0",
        "charge": "4.0"}
    draft = ok(tools, "get_details_by_id", id="B1003")
    assert draft["total_due"] == 4.0 and draft["line_items"][-1]["description"] == "Data refueling: 2.0 GB at $2.0/GB"
    assert ok(tools, "get_data_usage", customer_id="C1001", line_id="L1002")["cycle_end_date"] == "2025-02-28"
    assert ok(tools, "enable_roaming", customer_id="C1001", line_id="L1002") == "Roaming was already enabled"
    assert ok(tools, "send_payment_request", customer_id="C1001", bill_id="B1002") == \
        "Payment request sent to the customer for bill B1002"
    assert err(tools, "send_payment_request", customer_id="C1001", bill_id="B1002") == \
        "Error: A bill is already awaiting payment for this customer"


def test_device_tools_follow_the_network_model(domain):
    device = domain.kind.user.toolkit(domain.new_user_db())
    assert ok(device, "check_status_bar") == "Status Bar: 📶³ Good | 5G | 📱 Data Enabled | 🔋 80%"
    assert ok(device, "toggle_airplane_mode") == "Airplane Mode is now ON.\nStatus Bar: ✈️ Airplane Mode | 🔋 80%"
    assert ok(device, "run_speed_test") == "Speed test failed: No Connection."
    ok(device, "toggle_airplane_mode")  # off: a network search finds 5G at excellent signal: (50 + 500) / 2 Mbps
    assert ok(device, "run_speed_test") == "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."
    ok(device, "set_network_mode_preference", mode="3g_only")  # 3G at fair signal: (1 + 5) / 2 * 0.5
    assert ok(device, "run_speed_test").startswith("Speed Test Result: 1.50 Mbps (Poor).")
    assert ok(device, "set_network_mode_preference", mode="6g").startswith(
        "Failed to set network mode: '6g' is not a valid option. Please use one of: 4g_5g_preferred, 4g_only,")
    assert ok(device, "grant_app_permission", app_name="nope", permission="sms").startswith(
        "Error. App 'nope' not found. Cannot grant permission.")
    assert err(device, "fly") == "Error: Tool 'fly' not found."


def test_initial_state_and_env_assertions(domain):
    task = domain.tasks[OVERDUE]
    state = domain.new_state(task)
    line = state.tools.line_by_phone("555-123-2002")
    assert line.status == "Suspended"  # suspend_line_for_overdue_bill ran on the agent's side
    assert ok(state.tools, "get_details_by_id", id="B1234321")["status"] == "Overdue"
    assert state.user_db.device.sim_card_missing and state.user_db.device.active_apn_settings.apn_name == "broken"
    assert not state.user_db.surroundings.line_active  # the sync carried the suspension to the phone
    assertions = task["evaluation_criteria"]["env_assertions"]
    assert [state.assertion_met(a) for a in assertions] == [False, False]
    assert state.assertion_met({**assertions[0], "assert_value": False})  # the check is False, as expected
    for action in task["evaluation_criteria"]["actions"]:
        assert not state.call(action["name"], action["arguments"], action["requestor"]).error
    assert [state.assertion_met(a) for a in assertions] == [True, True]
    assert domain.new_state(task).user_db.device.sim_card_missing  # each episode starts again from the task


def test_the_user_calls_its_own_tools_and_the_agent_sees_the_effect(domain):
    env = make_env("service", domain="telecom", data_dir=str(DATA))
    env.reset(domain.to_task(OVERDUE, "train"))
    seen = []
    while not any(c.name == "make_payment" for m in env.history if m.role == "user" for c in m.tool_calls or []):
        seen += env.step(env.expert_reply()).messages
    assert all(m.role in ("user", "tool") for m in seen)
    assert not any(m.tool_calls for m in seen)  # the user's own calls and results never reach the agent
    paid = env.history.index(next(m for m in env.history if m.role == "tool" and m.name == "make_payment"))
    assert env.history[paid].content == "Payment of 65.0 USD has been made for bill B1234321."
    out = env.step(Message("assistant", "", tool_calls=[ToolCall("get_details_by_id", {"id": "B1234321"})]))
    assert json.loads(out.messages[0].content)["status"] == "Paid"  # the sync marked the bill paid


def test_the_expert_solves_train_tasks_and_a_wrong_refuel_fails(domain):
    env = make_env("service", domain="telecom", data_dir=str(DATA))
    for task_id in list(domain.tasks)[::6]:
        env.reset(domain.to_task(task_id, "train"))
        while env.termination is None:
            env.step(env.expert_reply())
        score = env.score()
        assert score.success and score.details["termination"] == "user_stop", (task_id, score.details)
    task_id = next(i for i, t in domain.tasks.items() if t["evaluation_criteria"]["actions"][0]["name"] == "refuel_data")
    env.reset(domain.to_task(task_id, "train"))
    refuel = domain.tasks[task_id]["evaluation_criteria"]["actions"][0]["arguments"]
    env.step(Message("assistant", "", tool_calls=[ToolCall("refuel_data", {**refuel, "gb_amount": 1.0})]))
    env.step(Message("assistant", "###STOP###"))
    assert env.score().details["reward_breakdown"] == {"ENV_ASSERTION": 0.0}


def test_an_llm_user_gets_the_device_tools_and_their_results(domain):
    render = get_format("tool_call").render
    model = ScriptedUserModel(["My phone has no data.",
                            render(Message("assistant", "", tool_calls=[ToolCall("check_status_bar", {})])),
                            "It shows 5G, good signal."])
    user = ModelUser(model, domain.tasks[OVERDUE]["user_scenario"], domain.kind.user.toolkit.schemas(),
                     get_format("tool_call"))
    assert user.system.startswith(SIMULATION_GUIDELINES_TOOLS)
    env = make_env("service", domain="telecom", data_dir=str(DATA), user="hf:unused")
    env.use_roles({"user": model})
    first = env.reset(domain.to_task(OVERDUE, "train"))
    assert first[-1].content == "My phone has no data."
    out = env.step(Message("assistant", "What does your status bar show?"))
    assert [m.content for m in out.messages] == ["It shows 5G, good signal."]
    messages, tools = model.calls[-1]
    assert len(tools) == 30 and messages[-1].role == "tool" and messages[-1].content.startswith("Status Bar: ")
    assert env.user.tokens == 6


def test_a_replayed_user_replays_its_device_tool_calls(tmp_path):
    from turnforge.envs.service.users import ReplayUserPolicy
    from turnforge.policies.base import Prompt, SamplingParams

    call = {"id": "u1", "type": "function", "function": {"name": "toggle_data", "arguments": {}}}
    line = {"task_id": "t", "messages": [{"role": "assistant", "content": "Hi! How can I help you today?"},
                                         {"role": "user", "content": "No data."},
                                         {"role": "user", "content": "", "tool_calls": [call]}]}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n")
    replay = ReplayUserPolicy(tmp_path / "c.jsonl")
    task = type("T", (), {"id": "t"})()
    texts = [replay.generate([Prompt([], task, 0, turn)], SamplingParams())[0].text for turn in (0, 1)]
    assert texts[0] == "No data."
    assert get_format("tool_call").parse(texts[1]).tool_calls[0].name == "toggle_data"


DATA_OFF = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"  # toggle_data (user), refuel (agent)


class _DeviceUserModel:
    """A telecom user as a model plays it, behind the `user` role queue: it writes what the agent asks it to do on
    its phone ("Please do this on your phone: NAME {args}", the expert's request) as a `<tool_call>` block, which
    the env reads through the model user's parsing path, reports the result, and says ###STOP### once the agent
    says the request is handled."""

    name, renderer = "device-user", None

    def __init__(self):
        self.tools_seen: list[int] = []

    def generate(self, prompts, params):
        return [Generation(text=self._reply(p), ids=[1]) for p in prompts]

    def _reply(self, prompt):
        self.tools_seen.append(len(prompt.tools or []))
        last = prompt.messages[-1]  # the user's view: the agent's messages as `user`, its device results as `tool`
        if last.role == "tool":
            return f"My phone says: {last.content[:60]}"
        asked = re.search(r"Please do this on your phone: (\w+) (\{.*\})", last.content)
        if asked:
            return get_format("tool_call").render(
                Message("assistant", "", tool_calls=[ToolCall(asked[1], json.loads(asked[2]))]))
        return "###STOP###" if "handled" in last.content else "My mobile data is not working. Yes, go ahead."


def test_a_model_user_performs_the_device_actions_end_to_end(domain):
    from turnforge.policies import make_policy
    from turnforge.policies.queue import Role
    from turnforge.rollout import run_episodes

    envs, user = [], _DeviceUserModel()

    def env_factory():
        envs.append(make_env("service", domain="telecom", data_dir=str(DATA), user="hf:served-by-the-role"))
        return envs[-1]

    [episode] = run_episodes(make_policy("expert"), env_factory, [domain.to_task(DATA_OFF, "train")], 1,
                             roles={"user": Role(user)})
    details = episode.score.details
    assert episode.score.success and details["termination"] == "user_stop", details
    assert details["reward_breakdown"] == {"ENV_ASSERTION": 1.0} and details["user_faults"] == []
    assert [c.name for m in envs[-1].conversation if m.role == "user" for c in m.tool_calls or []] == ["toggle_data"]
    state = envs[-1].state  # the phone itself: mobile data back on, and fast after the agent's refuel
    assertions = domain.tasks[DATA_OFF]["evaluation_criteria"]["env_assertions"]
    assert all(state.assertion_met(a) for a in assertions) and set(user.tools_seen) == {30}
    assert not any("toggle_data" in m.content for m in episode.messages if m.role == "user")  # the user's calls stay on its side
