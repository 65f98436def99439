"""Did the user side break the scenario? Rule-based attribution of a service episode's failure to the simulated user.

Peers find the user simulator behind many failed episodes (tau2 PR #392: up to 30 % of failed retail trajectories;
tau2 issue #182: a user-prompt fix moved pass^1 from 63.1 to 78.9), so every graded episode says which of these
user-side faults it shows (`details["user_faults"]`, empty when none), and summary.json's env_metrics count them
over the failed episodes of each domain (metrics.py). The rules, checked against what the user was given:

    protocol_break        the user's reply was no message at all (termination user_error)
    user_tool_error       a call on the user's own tools (telecom's device) returned an error
    unfounded_fact        the user stated an identifier (an email, an order / user id, a phone or other number of 4+
                          digits) found neither in its scenario nor earlier in the conversation: tau2's guidelines
                          forbid making up information
    missed_device_action  the user ended the conversation while a gold action it must perform on its device
                          (requestor "user") that the agent asked for never happened (tau2's user acts on its phone
                          when the agent asks: an agent that never asked is not the user's fault). "Asked" is the
                          scripted user's rule (`users.asks_for`: the message names the tool and its arguments); a
                          request in other words is left to the judge (`judged_user_fault`)
    early_stop            the user ended the conversation (###STOP###, ###OUT-OF-SCOPE###, or ###TRANSFER### with no
                          call of the agent's transfer tool) while the task's gold writes or assertions were still unmet: tau2's
                          guidelines allow ###STOP### only once the goal is satisfied

    judged_user_fault     with a `judge` role: a failed episode no rule explains, which the judge, shown the user's
                          scenario and the conversation the user saw, says the user side broke (`review_messages`);
                          a reply that is not the JSON asked for is no verdict (`user_review: "no_verdict"`)

A rule can only point at the user; it cannot clear the agent (the agent may have caused the user's stop).
"""

from __future__ import annotations

import json
import re
from typing import Any

from turnforge.envs.service.users import OUT_OF_SCOPE, STOP, TRANSFER, asks_for
from turnforge.types import Message

USER_FAULTS = ("protocol_break", "user_tool_error", "unfounded_fact", "missed_device_action", "early_stop",
               "judged_user_fault")

USER_REVIEW_SYSTEM = (
    "You review a customer-service conversation in which the customer is played by a simulator that was given the "
    "scenario below. Decide whether the simulated customer broke its scenario: stated information the scenario "
    "does not give, contradicted or withheld what it was given when asked, ended the conversation before its goal "
    "was met, or did not do on its own side what the agent asked and the scenario allows. Mistakes of the agent "
    "are not the customer's. Reply with JSON only: {\"user_fault\": true or false, \"reason\": \"one sentence\"}"
)

TRANSFER_TOOL = "transfer_to_human_agents"  # tau2's transfer tool (retail, airline)

# Identifiers a user could only know from its scenario: emails, then tokens with 4+ digits (#W2378156,
# yusuf_rossi_9620, 555-123-2002, 19122). Short numbers (2.0 GB, 3 items) are too common to check.
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_ID = r"#?[A-Za-z_]*\d[\w-]*"
_FACT = re.compile(rf"{_EMAIL}|{_ID}")


def user_faults(
    scenario: dict[str, Any], conversation: list[Message], history: list[Message], termination: str,
    goal_pending: bool, user_tool_errors: int, gold_actions: list[dict[str, Any]],
) -> list[str]:
    """The user-side faults of one episode, in `USER_FAULTS` order. `conversation` is what the user saw and said
    (the agent's messages, the user's messages and tool calls, their results), `history` tau2's whole trajectory
    (the agent's tool calls too); `goal_pending`: the task's gold writes or assertions were not all met at the end."""
    said = [m for m in conversation if m.role == "user"]
    faults = []
    if termination == "user_error":
        faults.append("protocol_break")
    if user_tool_errors:
        faults.append("user_tool_error")
    if unfounded_facts(scenario, conversation):
        faults.append("unfounded_fact")
    done = {c.name for m in said for c in (m.tool_calls or [])}
    asked = [m.content for m in conversation if m.role == "assistant" and m.content]
    if termination == "user_stop" and any(a.get("requestor") == "user" and a.get("name") not in done
                                          and any(asks_for(text, a) for text in asked) for a in gold_actions):
        faults.append("missed_device_action")
    if termination == "user_stop" and goal_pending and not _transferred(said, history):
        faults.append("early_stop")
    return faults


def unfounded_facts(scenario: dict[str, Any], conversation: list[Message]) -> list[str]:
    """The identifiers the user stated that neither its scenario nor an earlier message (the agent's, a tool
    result) holds, in the order stated."""
    known = json.dumps(scenario, ensure_ascii=False).lower()
    unfounded = []
    for message in conversation:
        if message.role == "user" and not message.tool_calls:
            unfounded += [f for f in stated_facts(message.content) if f.lower() not in known]
        known += "\n" + message.content.lower()
        for call in message.tool_calls or []:
            known += "\n" + json.dumps(call.arguments, ensure_ascii=False).lower()
    return unfounded


def stated_facts(text: str) -> list[str]:
    """Emails and tokens with at least 4 digits in `text`, trailing punctuation dropped."""
    facts = [m.group().rstrip(".-_") for m in _FACT.finditer(text)]
    return [f for f in facts if "@" in f or sum(ch.isdigit() for ch in f) >= 4]


def _transferred(said: list[Message], history: list[Message]) -> bool:
    """The user's ###TRANSFER### answers a transfer the agent made: its call of tau2's transfer tool."""
    last = said[-1].content if said else ""
    if TRANSFER not in last or STOP in last or OUT_OF_SCOPE in last:
        return False
    return any(c.name == TRANSFER_TOOL for m in history if m.role == "assistant" for c in (m.tool_calls or []))


def review_messages(scenario: dict[str, Any], conversation: list[Message]) -> list[Message]:
    """The judge's prompt: the user's scenario, then the conversation as the user saw it (`role: content` lines,
    the user's tool calls as their JSON)."""
    lines = []
    for m in conversation:
        calls = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls or []]
        lines.append(f"{m.role}: {m.content}" + (f" {json.dumps(calls)}" if calls else ""))
    text = f"scenario:\n{json.dumps(scenario, indent=1)}\n\nconversation:\n" + "\n".join(lines)
    return [Message("system", USER_REVIEW_SYSTEM), Message("user", text)]


def read_review(text: str) -> bool | None:
    """The judge's `user_fault`, or None when its reply is not the JSON asked for (no verdict)."""
    match = re.search(r"\{.*\}", text, re.S)
    try:
        verdict = json.loads(match.group(0))["user_fault"] if match else None
    except (ValueError, KeyError, TypeError):
        return None
    return verdict if isinstance(verdict, bool) else None
