"""The Format contract: how an agent writes actions as text and how that text becomes a Message.

A format owns (a) the instructions appended to an env's system prompt, (b) `parse(text)`, which turns
model text into the parsed assistant `Message` an env steps on, or a `FormatError` — it never raises —
and (c) `render(message)`, the inverse, used by scripted policies to write in the format
(`parse(render(m)) == m`).

Text-action formats (act_line, react) put the bare action in `Message.content`
(`"ACTION: go to fridge 1"` parses to `Message("assistant", "go to fridge 1")`); tool formats put the
calls in `Message.tool_calls` and any free text before them in `content`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from turnforge.types import Message, ToolCall


@dataclass
class FormatError:
    """Why a reply could not be parsed; `text` is the raw reply."""

    reason: str
    text: str


@runtime_checkable
class Format(Protocol):
    name: str

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """Instructions on how to write a reply in this format (appended to the env's system prompt)."""
        ...

    def parse(self, text: str) -> Message | FormatError:
        """Model text -> parsed assistant Message, or FormatError. Never raises."""
        ...

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Parsed assistant Message -> text in this format; `thought` (a scripted policy's note, e.g. the
        household expert's restated goal) is written before the action where the format has a place for it
        (`thoughts`), and is a ValueError where it has none."""
        ...

    thoughts: bool
    """True when `render` can write a thought before the action (text formats' THOUGHT line, the free text
    before a tool call); False where a reply is the action alone."""

    def error_observation(self, error: FormatError) -> str:
        """What the agent is told when its reply could not be parsed."""
        ...

    uses_tools: bool
    """True when actions are tool calls: the env lists its tools (`Env.tools()`) and answers in tool messages."""

    def action(self, tool: str, arguments: dict, text: str) -> Message:
        """The parsed reply performing one action: a call of `tool` with `arguments`, or the bare `text`."""
        ...

    def observation(self, content: str, call: ToolCall | None = None, tool: str | None = None) -> Message:
        """The env's answer to an action (`call`: the tool call answered, when there is one; `tool`: the
        tool's name when the reply had no call, e.g. after a format error)."""
        ...


def bind_tools(fmt: Format, tools: list[dict] | None) -> None:
    """Give a format that reads argument values by the tools' JSON schemas (GLM-4's and Qwen3.5's: values are untyped
    text there, as vLLM's parsers read them by the request's tools) the tools of the episode it parses next."""
    bind = getattr(fmt, "bind_tools", None)
    if bind is not None:
        bind(tools)


class TextActions:
    """Formats whose actions are text: the action is the message content, observations are user turns."""

    uses_tools = False
    thoughts = True

    def action(self, tool: str, arguments: dict, text: str) -> Message:
        return Message("assistant", text)

    def observation(self, content: str, call: ToolCall | None = None, tool: str | None = None) -> Message:
        return Message("user", content)


class ToolActions:
    """Formats whose actions are tool calls: observations are `tool` messages answering the call."""

    uses_tools = True
    thoughts = True

    def action(self, tool: str, arguments: dict, text: str) -> Message:
        return Message("assistant", "", tool_calls=[ToolCall(tool, dict(arguments))])

    def observation(self, content: str, call: ToolCall | None = None, tool: str | None = None) -> Message:
        if call is None:
            return Message("tool", content, name=tool)
        return Message("tool", content, tool_call_id=call.id, name=call.name)
