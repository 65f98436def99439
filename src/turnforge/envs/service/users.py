"""The customer side of a service episode: an LLM user simulator through the `user` model role, a scripted
user for tests and gold runs, and the replay user that re-grades saved conversations.

LLM user (tau2-bench `user/user_simulator.py`): system prompt = the simulation guidelines +
`<scenario>{user_scenario}</scenario>`; it sees the conversation with roles flipped (the agent's messages as
`user`, its own as `assistant`; the agent's tool calls and results never); its stop tokens `###STOP###`,
`###TRANSFER###`, `###OUT-OF-SCOPE###` end the episode (USER_STOP).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Protocol

from turnforge.envs.service.evaluation import action_matches
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.types import Message

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
USER_STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)

# tau2-bench data/tau2/user_simulator/simulation_guidelines.md (MIT, (c) 2025 Sierra Research), verbatim.
SIMULATION_GUIDELINES = "\n".join([
    '# User Simulation Guidelines',
    'You are playing the role of a customer contacting a customer service representative.\x20',
    'Your goal is to simulate realistic customer interactions while following specific scenario instructions.',
    '',
    '## Core Principles',
    '- Generate one message at a time, maintaining natural conversation flow.',
    '- Strictly follow the scenario instructions you have received.',
    '- Never make up or hallucinate information not provided in the scenario instructions. Information that is not provided in the scenario instructions should be considered unknown or unavailable.',
    '- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language to convey the same information',
    '- Disclose information progressively. Wait for the agent to ask for specific information before providing it.',
    '',
    '## Task Completion',
    '- The goal is to continue the conversation until the task is complete.',
    "- If the instruction goal is satisified, generate the '###STOP###' token to end the conversation.",
    "- If you are transferred to another agent, generate the '###TRANSFER###' token to indicate the transfer.",
    "- If you find yourself in a situation in which the scenario does not provide enough information for you to continue the conversation, generate the '###OUT-OF-SCOPE###' token to end the conversation.",
    'Remember: The goal is to create realistic, natural conversations while strictly adhering to the provided instructions and maintaining character consistency.',
    '',
])


def is_user_stop(text: str) -> bool:
    return any(token in text for token in USER_STOP_TOKENS)


def scenario_text(scenario: dict[str, Any]) -> str:
    """tau2's `str(UserScenario)`: persona, then the instructions (structured ones field by field)."""
    tab = "\t"
    lines = []
    if scenario.get("persona") is not None:
        lines += ["Persona:", textwrap.indent(scenario["persona"], tab)]
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        parts = [f"Domain: {instructions.get('domain')}",
                 f"Reason for call:\n{textwrap.indent(instructions.get('reason_for_call') or '', tab)}"]
        if instructions.get("known_info") is not None:
            parts.append(f"Known info:\n{textwrap.indent(instructions['known_info'], tab)}")
        if instructions.get("unknown_info") is not None:
            parts.append(f"Unknown info:\n{textwrap.indent(instructions['unknown_info'], tab)}")
        parts.append(f"Task instructions:\n{textwrap.indent(instructions.get('task_instructions') or '', tab)}")
        instructions = "\n".join(parts)
    lines += ["Instructions:", textwrap.indent(str(instructions), tab)]
    return "\n".join(lines)


def user_system_prompt(scenario: dict[str, Any]) -> str:
    """tau2's user SYSTEM_PROMPT: guidelines, then the scenario in `<scenario>` tags."""
    return f"{SIMULATION_GUIDELINES}\n\n<scenario>\n{scenario_text(scenario)}\n</scenario>"


class User(Protocol):
    """Answers each message the agent sends to the user; `tokens` counts what a model user generated."""

    tokens: int

    def reply(self, conversation: list[Message], history: list[Message]) -> str | None:
        """The user's next message (None: the user broke protocol or has nothing left: user error / end).
        `conversation` = the messages routed to / from the user so far (greeting first), agent-side roles;
        `history` = the whole episode (tool calls and results included)."""
        ...


class ModelUser:
    """An LLM user simulator: the `user` role's client, prompted as tau2 prompts its user."""

    def __init__(self, client: Any, scenario: dict[str, Any]):
        self.client, self.system = client, user_system_prompt(scenario)
        self.tokens = 0

    def reply(self, conversation: list[Message], history: list[Message]) -> str | None:
        flipped = [Message("system", self.system)]
        for m in conversation:
            flipped.append(Message("user" if m.role == "assistant" else "assistant", m.content))
        gen: Generation = self.client.generate(flipped)
        self.tokens += len(gen.ids)
        if gen.finish_reason == "exhausted":  # a replayed user with nothing left: the recorded user ended here
            return STOP
        text = gen.text.strip()
        return text or None  # an empty user message breaks tau2's protocol


class ScriptedUser:
    """States `reason_for_call` and `known_info`, then confirms; says ###STOP### once every gold action of
    the agent has a matching call (or after `patience` replies without a new match)."""

    def __init__(self, task: dict[str, Any], patience: int = 8):
        instructions = (task.get("user_scenario") or {}).get("instructions") or {}
        if isinstance(instructions, dict):
            parts = [instructions.get("reason_for_call"), instructions.get("known_info")]
            self.opening = " ".join(p.strip() for p in parts if p)
        else:
            self.opening = str(instructions)
        criteria = task.get("evaluation_criteria") or {}
        self.actions = [a for a in criteria.get("actions") or [] if a.get("requestor", "assistant") == "assistant"]
        self.patience, self.idle, self.best = patience, 0, -1
        self.tokens = 0

    def reply(self, conversation: list[Message], history: list[Message]) -> str | None:
        if len(conversation) <= 1:
            return self.opening or "Hi, I need some help."
        calls = [c for m in history if m.role == "assistant" for c in m.tool_calls or []]
        done = sum(any(action_matches(a, c) for c in calls) for a in self.actions)
        if done == len(self.actions):
            return STOP
        self.idle = 0 if done > self.best else self.idle + 1
        self.best = max(self.best, done)
        if self.idle >= self.patience:
            return STOP
        return "Yes, I confirm. Please go ahead."


class ReplayUserPolicy:
    """The `user` role for `--env-opt user=replay`: the user messages of a saved conversation, in order.

    Reads the same JSONL as `--policy replay:FILE` (`{"task_id", "sample"?, "messages": [...]}` or saved
    trajectories); a user message that follows nothing but the greeting is the first. When the recorded
    user has no message left the reply is empty with finish_reason "exhausted": the episode ends there.
    """

    renderer = None

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"replay-user:{path}"
        self.messages: dict[tuple[str, int], list[str]] = {}
        with self.path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    key = (str(record["task_id"]), int(record.get("sample", 0)))
                    users = [m.get("content") or "" for m in record.get("messages", []) if m.get("role") == "user"
                             and not m.get("tool_calls")]
                    self.messages[key] = users

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            said = self.messages.get((p.task.id, p.sample), [])
            if p.turn < len(said):
                out.append(Generation(text=said[p.turn]))
            else:
                out.append(Generation(text="", finish_reason="exhausted"))
        return out
