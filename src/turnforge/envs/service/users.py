"""The customer side of a service episode: an LLM user simulator through the `user` model role, a scripted
user for tests and gold runs, and the replay user that re-grades saved conversations.

LLM user (tau2-bench `user/user_simulator.py`): system prompt = the simulation guidelines +
`<scenario>{user_scenario}</scenario>`; it sees the conversation with roles flipped (the agent's messages as
`user`, its own as `assistant`; the agent's tool calls and results never); its stop tokens `###STOP###`,
`###TRANSFER###`, `###OUT-OF-SCOPE###` end the episode (USER_STOP). In a dual-control domain (telecom) it gets
the user's tools and tau2's tools guidelines: a reply may be tool calls on its own device, whose results come
back to it (as `tool` messages) before it speaks to the agent again; the agent sees only what it says. A reply
of a user without tools is read for tool calls too (out of protocol): the env answers them with tau2's error.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any, Protocol

from turnforge.envs.service.evaluation import action_matches, actions_done_in_order
from turnforge.formats import get_format
from turnforge.formats.base import Format, FormatError
from turnforge.types import (
    CONTEXT_LENGTH,
    Generation,
    Message,
    Prompt,
    SamplingParams,
    ToolCall,
    json_records,
)

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


# tau2-bench data/tau2/user_simulator/simulation_guidelines_tools.md (MIT, (c) 2025 Sierra Research), verbatim:
# the guidelines of a user who has tools (dual control).
SIMULATION_GUIDELINES_TOOLS = "\n".join([
    '# User Simulation Guidelines',
    '',
    'You are playing the role of a customer contacting a customer service representative agent.\x20',
    'Your goal is to simulate realistic customer interactions while following specific scenario instructions.',
    'You have some tools to perform the actions on your end that might be requested by the agent to diagnose and resolve your issue.',
    '',
    '## Core Principles',
    '- Generate one message at a time, maintaining natural conversation flow.',
    '- At each turn you can either:',
    '    - Send a message to the agent.',
    '    - Make a tool call to perform an action requested by the agent.',
    '    - You cannot do both at the same time.',
    '- Strictly follow the scenario instructions you have received.',
    '- Never make up or hallucinate information not provided in the scenario instructions. Information that is not provided in the scenario instructions should be considered unknown or unavailable.',
    '- Never make up the results of tool calls that the agent has requested, you must ground your responses based on the results of tool calls if the agent has requested.',
    '- If you made an error in a tool call and get an error message, fix the error and try again.',
    '- All the information you provide to the agent must be grounded in the information provided in the scenario instructions or the results of tool calls.',
    '- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language to convey the same information',
    '- Disclose information progressively. Wait for the agent to ask for specific information before providing it.',
    '- Only call a tool if the agent has requested it or if it is necessary to answer a question the agent has asked. Ask clarifying questions if you do not know what action to take.',
    '- If the agent asks multiple actions to perform, state that you cannot perform multiple actions at once, and ask the agent to instruct you one action at a time.',
    '- Your messages when performing tool calls will not be displayed to the agent, only the messages without tool calls will be displayed to the agent.',
    '',
    '## Task Completion',
    '- The goal is to continue the conversation until the task is complete.',
    "- If the instruction goal is satisified, generate the '###STOP###' token to end the conversation.",
    "- If you have been transferred to another agent, generate the '###TRANSFER###' token to indicate the transfer. Only do this after the agent has clearly indicated that you are being transferred.",
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


def user_system_prompt(scenario: dict[str, Any], with_tools: bool = False) -> str:
    """tau2's user SYSTEM_PROMPT: guidelines (the tools ones for a user with tools), then the scenario in tags."""
    guidelines = SIMULATION_GUIDELINES_TOOLS if with_tools else SIMULATION_GUIDELINES
    return f"{guidelines}\n\n<scenario>\n{scenario_text(scenario)}\n</scenario>"


class User(Protocol):
    """Answers each message the agent sends to the user; `tokens` counts what a model user generated."""

    tokens: int

    def reply(self, conversation: list[Message], history: list[Message]) -> Message | None:
        """The user's next message, role "user": text for the agent, or (dual control) tool calls on the user's
        own tools (None: the user broke protocol or has nothing left: user error / end).
        `conversation` = the messages routed to / from the user so far (greeting first; the user's own tool calls
        and their results included), agent-side roles; `history` = the whole episode."""
        ...


class ModelUser:
    """An LLM user simulator: the `user` role's client, prompted as tau2 prompts its user."""

    def __init__(self, client: Any, scenario: dict[str, Any], tools: list[dict] | None = None,
                 format: Format | None = None):
        self.client, self.tools, self.format = client, tools, format
        self.system = user_system_prompt(scenario, with_tools=bool(tools))
        self.tokens = 0

    def reply(self, conversation: list[Message], history: list[Message]) -> Message | None:
        flipped = [Message("system", self.system)]
        for m in conversation:
            if m.role == "tool":
                flipped.append(m)
            else:
                flipped.append(Message("user" if m.role == "assistant" else "assistant", m.content, m.tool_calls))
        gen: Generation = self.client.generate(flipped, tools=self.tools) if self.tools else self.client.generate(flipped)
        self.tokens += len(gen.ids)
        if gen.finish_reason == "exhausted":  # a replayed user with nothing left: the recorded user ended here
            return Message("user", STOP)
        if gen.finish_reason == CONTEXT_LENGTH:  # the user model's context is full: its text is the refusal
            return None
        parsed = self.format.parse(gen.text) if self.format is not None else None
        if isinstance(parsed, FormatError) and self.tools:
            return None  # a tool call that cannot be read breaks the protocol: a user error, not the agent's
        if isinstance(parsed, Message) and parsed.tool_calls:  # a user without tools too: tau2 answers it an error
            return Message("user", parsed.content, tool_calls=parsed.tool_calls)
        text = gen.text.strip()
        return Message("user", text) if text else None  # an empty user message breaks tau2's protocol


class ScriptedUser:
    """Opens with the customer's words (`scripted_opening`), then confirms; says ###STOP### once every gold action of
    the agent has a matching call (or after `patience` replies without a new match).

    Dual control: when the next gold action in order (see `actions_done_in_order`) is the user's and the agent's
    latest message asks for it (`asks_for`), it performs that one action on its own tools instead of answering,
    then reports "Done."; unasked, it answers as otherwise (a real user acts on its phone when told to). It stops
    once every gold action of both sides is done."""

    def __init__(self, task: dict[str, Any], patience: int = 8):
        self.opening = scripted_opening((task.get("user_scenario") or {}).get("instructions") or {})
        criteria = task.get("evaluation_criteria") or {}
        self.all_actions = list(criteria.get("actions") or [])
        self.actions = [a for a in self.all_actions if a.get("requestor", "assistant") == "assistant"]
        self.dual = any(a.get("requestor") == "user" for a in self.all_actions)
        self.patience, self.idle, self.best = patience, 0, -1
        self.tokens = self.user_calls = 0

    def reply(self, conversation: list[Message], history: list[Message]) -> Message | None:
        if len(conversation) <= 1:
            return Message("user", self.opening or "Hi, I need some help.")
        if self.dual:
            calls = [c for m in history if m.role in ("assistant", "user") for c in m.tool_calls or []]
            done = actions_done_in_order(self.all_actions, calls)
            if done == len(self.all_actions):
                return Message("user", STOP)
            if conversation[-1].role == "tool":  # one action per request: report it, the agent asks for the next
                return Message("user", "Done.")
            action = self.all_actions[done]
            asked = next((m.content for m in reversed(conversation) if m.role == "assistant"), "")
            if action.get("requestor") == "user" and asks_for(asked, action):
                self.user_calls += 1
                return Message("user", "", tool_calls=[ToolCall(action["name"], dict(action.get("arguments") or {}),
                                                                f"user_call_{self.user_calls}")])
        calls = [c for m in history if m.role == "assistant" for c in m.tool_calls or []]
        done = sum(any(action_matches(a, c) for c in calls) for a in self.actions)
        if done == len(self.actions) and not self.dual:
            return Message("user", STOP)
        self.idle = 0 if done > self.best else self.idle + 1
        self.best = max(self.best, done)
        if self.idle >= self.patience:
            return Message("user", STOP)
        return Message("user", "Yes, I confirm. Please go ahead.")


def asks_for(message: str, action: dict[str, Any]) -> bool:
    """Whether an agent `message` asks the user to perform the gold `action` (the scripted user's rule; stated in
    docs/decisions.md): it names the action's tool, with underscores or spaces, and each of its argument values
    (`argument_words`), ignoring case and commas. The expert's "Please do this on your phone: NAME {json args}" does.

    >>> asks_for("Please toggle airplane mode.", {"name": "toggle_airplane_mode", "arguments": {}})
    True
    >>> asks_for("Please set your network mode.", {"name": "set_network_mode_preference", "arguments": {"mode": "4g"}})
    False
    """
    said = message.lower().replace(",", "")
    name = action["name"].lower()
    if name not in said and name.replace("_", " ") not in said:
        return False
    return all(word in said for word in argument_words(action.get("arguments") or {}))


def argument_words(value: Any) -> list[str]:
    """The argument values an agent must name to ask for a call, lower case and without commas: strings as they are
    (one that holds a JSON object or list, as banking's `call_discoverable_user_tool` arguments do: the values in it),
    numbers and booleans as JSON writes them, the values of dicts and lists one by one.

    >>> argument_words({"card_type": "Gold Rewards Card", "annual_income": 100000, "rho_bank_subscription": True})
    ['gold rewards card', '100000', 'true']
    >>> argument_words({"arguments": '{"credit_card_account_id": "cc_1"}'})
    ['cc_1']
    """
    if isinstance(value, dict):
        return [w for v in value.values() for w in argument_words(v)]
    if isinstance(value, list):
        return [w for v in value for w in argument_words(v)]
    if isinstance(value, str):
        if value.lstrip().startswith(("{", "[")):
            try:
                return argument_words(json.loads(value))
            except json.JSONDecodeError:
                pass
        return [value.lower().replace(",", "")]
    return [json.dumps(value).replace(",", "")]


# A free-text scenario (banking_knowledge) mostly scripts the customer's first words in a numbered step whose bold label
# names the opening: `1. **Opening:** "Hi, I need ..."`, `1. **Start naturally:** Explain ...: "Hi, I ..."`.
_OPENING_STEP = re.compile(r"^\s*\d+[a-z]?\.\s*\*\*[^*\n]*\b(?:opening|start)[^*\n]*\*\*(.*?)(?=^\s*\d+[a-z]?\.\s|\Z)",
                           re.I | re.M | re.S)
_QUOTED = re.compile(r'"([^"]+)"|\u201c([^\u201d]+)\u201d')
# Otherwise (tau2's first banking tasks, one role-play prompt): its first sentence that says what the customer wants.
_WANTS = re.compile(r"\blooking for\b|\bstart by saying\b|\byou want to\b", re.I)
_FIRST_PERSON = [(r"\byou're\b", "I'm"), (r"\byou are\b", "I am"), (r"\byou've\b", "I've"), (r"\byou'll\b", "I'll"),
                 (r"\byourself\b", "myself"), (r"\byours\b", "mine"), (r"\byour\b", "my"), (r"^you\b", "I"),
                 (r"\byou\b", "me")]


def scripted_opening(instructions: dict[str, Any] | str) -> str:
    """The scripted user's first message, the customer's words, never the role-play prompt. Structured instructions:
    `reason_for_call` then `known_info`. Free text (banking_knowledge): the first quoted passage of the step that
    scripts the opening (`_OPENING_STEP`); else its first sentence saying what the customer is looking for or wants,
    in the first person (your -> my, you're -> I'm, you -> I at the start and me elsewhere; parentheses, which hold
    directions to the role player, dropped); else nothing (the user then says "Hi, I need some help."). The user stop
    tokens the instructions quote are dropped (the episode would end at the first message).

    >>> scripted_opening('You play a customer. You are looking for a card (say "card") for your trips.')
    'I am looking for a card for my trips.'
    """
    if isinstance(instructions, dict):
        parts = [instructions.get("reason_for_call"), instructions.get("known_info")]
        return " ".join(p.strip() for p in parts if p)
    text = str(instructions)
    step = _OPENING_STEP.search(text)
    quoted = _QUOTED.search(step.group(1)) if step else None
    if quoted:
        opening = quoted.group(1) or quoted.group(2)
    else:
        sentences = re.split(r"(?<=[.!?])\s+|\n+", text)
        opening = next((_first_person(s) for s in sentences if _WANTS.search(s)), "")
    for token in USER_STOP_TOKENS:
        opening = opening.replace(token, "")
    return " ".join(opening.split())


def _first_person(sentence: str) -> str:
    """A sentence of a role-play prompt as the customer says it (see `scripted_opening`)."""
    sentence = re.sub(r"^\W*(?:start by saying\s+)?", "", sentence, flags=re.I)
    sentence = re.sub(r"\s*\([^)]*\)", "", sentence)
    for pattern, replacement in _FIRST_PERSON:
        sentence = re.sub(pattern, replacement, sentence, flags=re.I)
    return sentence[:1].upper() + sentence[1:]


class ReplayUserPolicy:
    """The `user` role for `--env-opt user=replay`: the user messages of a saved conversation, in order.

    Reads the same JSONL as `--policy replay:FILE` (`{"task_id", "sample"?, "messages": [...]}` or saved
    trajectories); a user message that follows nothing but the greeting is the first. When the recorded
    user has no message left the reply is empty with finish_reason "exhausted": the episode ends there.
    A recorded user message with tool calls is replayed as those calls, written in the tool_call format the
    service env reads the user's replies with; their results are recomputed, like the agent's. A saved trajectory
    holds the user's tool calls in its score's `user_side` (the agent never saw them, so its `messages` lack them);
    one of a dual-control domain without it is refused: its user would be replayed without its device calls.
    """

    renderer = None

    def __init__(self, path: str | Path, dual_control: bool = False):
        self.path = Path(path)
        self.name = f"replay-user:{path}"
        # The agent's replay policy has read this file first (model_roles builds it after --policy): its lines are
        # JSON objects with a task id, a sample and a list of messages.
        self.messages: dict[tuple[str, int], list[str]] = {}
        for where, record in json_records(self.path):
            key = (str(record["task_id"]), int(record.get("sample", 0)))
            try:
                said = [_replayed_text(m) for m in _user_messages(record, where, dual_control)]
            except (TypeError, KeyError, AttributeError) as e:
                raise ValueError(f"{where}: task {key[0]!r} sample {key[1]}: a user message cannot be replayed ({e!r}); "
                                 "each tool call needs a function name and arguments") from None
            if not said:
                # tau2's user always answers the greeting (an empty answer is USER_ERROR, never recorded as a
                # message): a conversation without one is not tau2's, and there is no user to replay.
                raise ValueError(f"{where}: task {key[0]!r} sample {key[1]} has no user message; re-grading replays "
                                 "the recorded user (tau2: the greeting, then the user's first message, then the agent)")
            self.messages[key] = said

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            said = self.messages.get((p.task.id, p.sample), [])
            if p.turn < len(said):
                out.append(Generation(text=said[p.turn]))
            else:
                out.append(Generation(text="", finish_reason="exhausted"))
        return out


def _user_messages(record: dict, where: str, dual_control: bool) -> list[dict]:
    """The user's messages of a saved conversation, tool calls included: a trajectory's `user_side`, else (tau2's
    own conversations, older runs of a domain whose user has no tools) the user messages of `messages`."""
    side = (record.get("score") or {}).get("details", {}).get("user_side") if "turns" in record else None
    if side is None and "turns" in record and dual_control:
        raise ValueError(f"{where}: task {record['task_id']!r} sample {record.get('sample', 0)} is a dual-control "
                         "episode saved without the user's device tool calls (score.details.user_side, recorded "
                         "since issue 46): its user cannot be replayed; re-run the episode with this version")
    return [m for m in (record.get("messages", []) if side is None else side) if m.get("role") == "user"]


def _replayed_text(message: dict) -> str:
    if not message.get("tool_calls"):
        return message.get("content") or ""
    calls = [ToolCall.from_saved(c) for c in message["tool_calls"]]
    return get_format("tool_call").render(Message("assistant", message.get("content") or "", tool_calls=calls))
