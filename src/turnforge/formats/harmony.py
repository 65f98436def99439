"""gpt-oss's harmony format: replies as channel messages, and the renderer that keeps an episode's ids as sampled.

A gpt-oss reply, written after the generation prompt `<|start|>assistant`, is one or more messages on channels:

    <|channel|>analysis<|message|>The fridge is closed.<|end|><|start|>assistant<|channel|>commentary
    to=functions.act <|constrain|>json<|message|>{"action": "open fridge 1"}<|call|>

`analysis` is the model's reasoning, `commentary` with a recipient (`to=functions.NAME`, in the header before or after
the channel) a tool call, `final` the answer. The reply ends in `<|call|>` after a tool call and in `<|return|>` after
an answer; both are stop tokens, `<|end|>` is not (it closes a message inside the reply). `parse_reply` reads the
messages as openai-harmony's `StreamableParser` does; `split_reply` is the family's reasoning split (the analysis
apart: the env reads the answer's text and the calls as written).

**Why a renderer of its own.** gpt-oss's chat template renders an assistant turn only from structured fields (`thinking`,
`tool_calls`, `content`) and refuses channel tags in content, normalises the header (`to=` before the channel), drops
the analysis of turns before a final answer and writes `<|end|>` where the model stopped on `<|return|>`: no delta of
it is the model's own text. Every harmony message is delimited by its own tokens, so `HarmonyRenderer` writes the head
(system, developer with the tools, first user turn) with the model's template and every later message in harmony's
syntax, each reply as the model wrote it and ended, the way the template writes user and tool messages (a test holds
them equal). An episode's ids are then the template's head, the sampled ids and the rendered messages between them, and
render again identically from the messages: multi-turn SFT and GRPO stay token-exact. What differs from the inference
template: earlier turns keep their analysis, and a turn that answered keeps its `<|return|>` (docs/families.md).

openai-harmony itself is not used: it loads its o200k vocabulary from the network and renders to o200k ids only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from turnforge.formats.families import Family, detect_family, get_family
from turnforge.types import Message

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

START, END, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"
CALL, RETURN = "<|call|>", "<|return|>"
"""The stop tokens: after a tool call, after an answer."""
GENERATION_PROMPT = START + "assistant"

_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


@dataclass(frozen=True)
class HarmonyMessage:
    """One message of a reply: its channel, recipient (`functions.act`; None: to the user), content type and body."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    body: str
    complete: bool
    """Whether its `<|message|>` was written (a reply cut off in a header has a message without one)."""


def parse_reply(text: str) -> list[HarmonyMessage]:
    """The messages of a reply (what follows `<|start|>assistant`, the stop token left out); [] for text written
    without any harmony header (a model that never learned the format: that text is its answer)."""
    if CHANNEL not in text and MESSAGE not in text and not text.lstrip().startswith("to="):
        return []
    messages = []
    for index, segment in enumerate(text.split(START)):
        segment = segment.removesuffix(END)
        if index > 0:  # `assistant` (the role) opens every message after the first
            segment = segment.removeprefix("assistant")
        if not segment.strip():
            continue
        header, marked, body = segment.partition(MESSAGE)
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if not (marked or channel or recipient):  # plain text beside the messages (a visible reply's answer)
            messages.append(HarmonyMessage(None, None, None, segment, True))
            continue
        after = header[channel.end():] if channel else header
        after = _RECIPIENT.sub("", after).replace(CONSTRAIN, " ").split()
        messages.append(HarmonyMessage(channel.group(1) if channel else None,
                                       recipient.group(1) if recipient else None,
                                       after[0] if after else None, body, bool(marked)))
    return messages


def split_reply(text: str) -> tuple[str, str]:
    """(reasoning, what the env reads) of a reply: the analysis messages' bodies; the answer's and any commentary's
    text, with each tool call as written (its own `<|start|>assistant` message, for `tool_call:harmony` to read). A
    reply without harmony headers is all answer."""
    messages = parse_reply(text)
    if not messages:
        return "", text
    reasoning = "\n".join(m.body for m in messages if m.channel == "analysis" and m.recipient is None)
    visible = []
    for m in messages:
        if m.recipient is not None:
            visible.append(call_text(m.recipient, m.body, m.content_type, header=GENERATION_PROMPT))
        elif m.channel != "analysis":
            visible.append(m.body)
    return reasoning, "".join(visible)


def call_text(recipient: str, arguments: str, content_type: str | None = "json", header: str = "") -> str:
    """A tool-call message as gpt-oss writes it: `<|channel|>commentary to=functions.act <|constrain|>json<|message|>`
    + arguments (`header`: `<|start|>assistant` where it is not the reply's first message)."""
    typed = f" {CONSTRAIN}{content_type}" if content_type else ""
    return f"{header}{CHANNEL}commentary to={recipient}{typed}{MESSAGE}{arguments}"


def reply_end(text: str) -> str:
    """The stop token a reply ends with: `<|call|>` after a tool call, else `<|return|>`."""
    messages = parse_reply(text)
    return CALL if messages and messages[-1].recipient is not None else RETURN


def is_harmony(content: str) -> bool:
    """Whether an assistant message's content is a raw reply in harmony syntax (as the model wrote it), not an answer."""
    return content.startswith((CHANNEL, " to=", "to="))


def assistant_reply(message: dict[str, Any]) -> tuple[str, str]:
    """(the reply's text after `<|start|>assistant`, its stop token) for an assistant message: a raw reply as written;
    otherwise its reasoning (`thinking` / `reasoning_content`) on the analysis channel, then its tool call on
    commentary (text beside it a commentary preamble) or its content as the final answer."""
    content = message.get("content") or ""
    if is_harmony(content) and not message.get("tool_calls"):
        return content, reply_end(content)
    parts = []
    thinking = message.get("thinking") or message.get("reasoning_content")
    if thinking:
        parts.append(f"{CHANNEL}analysis{MESSAGE}{thinking}")
    calls = message.get("tool_calls") or []
    if len(calls) > 1:
        raise ValueError("a gpt-oss reply makes one tool call (it stops at <|call|>): split the calls over replies")
    if calls:
        function = calls[0].get("function", calls[0])
        arguments = function.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        if content:
            parts.append(f"{CHANNEL}commentary{MESSAGE}{content}")
        parts.append(call_text(f"functions.{function['name']}", arguments))
        return (END + GENERATION_PROMPT).join(parts), CALL
    parts.append(f"{CHANNEL}final{MESSAGE}{content}")
    return (END + GENERATION_PROMPT).join(parts), RETURN


def called(message: dict[str, Any]) -> str | None:
    """The function an assistant message called (the recipient of its last message), if any."""
    calls = message.get("tool_calls") or []
    if calls:
        return calls[-1].get("function", calls[-1])["name"]
    messages = parse_reply(message.get("content") or "")
    recipient = messages[-1].recipient if messages else None
    return recipient.removeprefix("functions.") if recipient and recipient.startswith("functions.") else None


def render_message(message: dict[str, Any], last_call: str | None = None) -> str:
    """One message after the head, as gpt-oss's template writes user and tool messages and each reply as the model
    wrote and ended it. A tool message's author is its tool: its `name`, else the function called last (`last_call`,
    as the template takes it); an env's answer to a reply that called nothing (a format error) has no tool to come
    from, and is written as the user's message."""
    role = message["role"]
    if role == "assistant":
        text, end = assistant_reply(message)
        return GENERATION_PROMPT + text + end
    tool = message.get("name") or last_call
    if role == "user" or (role == "tool" and not tool):
        return f"{START}user{MESSAGE}{message.get('content') or ''}{END}"
    if role == "tool":
        content = json.dumps(message.get("content") or "", ensure_ascii=False)  # the template's `tojson`
        return f"{START}functions.{tool} to=assistant{CHANNEL}commentary{MESSAGE}{content}{END}"
    raise ValueError(f"gpt-oss's template writes no {role} message after the first reply")


def render_tail(messages: Sequence[dict[str, Any]], last_call: str | None = None) -> str:
    """`render_message` of each message, a tool message's author the function called last before it."""
    out = []
    for message in messages:
        out.append(render_message(message, last_call))
        if message["role"] == "assistant":
            last_call = called(message)
    return "".join(out)


def render_conversation(messages: Sequence[Message | dict[str, Any]], tools: list[dict] | None, generation_prompt: bool,
                        head: Callable[..., str]) -> str:
    """A conversation's text: `head(messages, tools=tools)` (the model's template, no generation prompt) writes the
    messages before the first reply, `render_message` each one from there."""
    dicts = [_as_dict(m) for m in messages]
    first = next((i for i, m in enumerate(dicts) if m["role"] == "assistant"), len(dicts))
    text = head(dicts[:first], tools=tools) if first else ""
    return text + render_tail(dicts[first:]) + (GENERATION_PROMPT if generation_prompt else "")


def _as_dict(message: Message | dict[str, Any]) -> dict[str, Any]:
    return message.to_dict() if isinstance(message, Message) else message


class HarmonyRenderer:
    """The rollout's `ChatRenderer` for gpt-oss (see the module docstring): the model's template writes the head, harmony
    syntax the rest; a reply's end is its own stop token."""

    template = None
    """It renders the head with the tokenizer's own template."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, window: int | None = None):
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1 assistant turn (or None for the whole history), got {window}")
        self.tokenizer = tokenizer
        self.window = window
        self.family: Family = detect_family(tokenizer.chat_template) or get_family("gptoss")
        self.end_ids = dict(zip((CALL, RETURN), tokenizer.convert_tokens_to_ids([CALL, RETURN]), strict=True))

    def render(self, messages: Sequence[Message | dict[str, Any]], tools: list[dict] | None,
               generation_prompt: bool) -> str:
        return render_conversation(messages, tools, generation_prompt, partial(
            self.tokenizer.apply_chat_template, tokenize=False, add_generation_prompt=False))

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: Sequence[Message | dict[str, Any]], tools: list[dict] | None) -> list[int]:
        return self._encode(self.render(messages, tools, True))

    def observation_ids(self, messages: Sequence[Message | dict[str, Any]], new_messages: Sequence[Message | dict[str, Any]],
                        tools: list[dict] | None, generated_ids: Sequence[int], finish_reason: str | None) -> list[int]:
        """The reply's stop token where the generation lacks it (cut by length or a stop string), then the new
        messages and the next generation prompt: every harmony message starts at `<|start|>`, so the delta does not
        depend on the reply's text."""
        reply = _as_dict(messages[-1])
        stopped = bool(generated_ids) and generated_ids[-1] in self.end_ids.values()
        end = "" if stopped else assistant_reply(reply)[1]
        return self._encode(end + render_tail([_as_dict(m) for m in new_messages], called(reply)) + GENERATION_PROMPT)

    def completion_ids(self, messages: Sequence[Message | dict[str, Any]], tools: list[dict] | None,
                       following: Sequence[Message | dict[str, Any]] = ()) -> list[int]:
        """Canonical ids of the last (assistant) message as the model writes it, its own stop token last (whatever
        `following`, the messages after it, are)."""
        text, end = assistant_reply(_as_dict(messages[-1]))
        return self._encode(text) + [self.end_ids[end]]


__all__ = ["CALL", "RETURN", "HarmonyMessage", "HarmonyRenderer", "assistant_reply", "call_text", "parse_reply",
           "called", "render_conversation", "render_message", "render_tail", "reply_end", "split_reply"]
