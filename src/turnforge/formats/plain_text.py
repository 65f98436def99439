"""PlainTextEndsTurn: a tool format in which a reply without any call is a plain answer, not a format error.

In BFCL multi-turn (and in customer-service dialogues) a reply without calls is the normal end of the agent's
turn: it speaks to the user. The wrapped format's `parse` would count it as a FormatError; this wrapper
returns it as a plain assistant message instead when the text holds no call attempt (the inner format's
`call_marker`, e.g. `<tool_call>`). Everything else is the wrapped format's.
"""

from __future__ import annotations

from turnforge.formats.base import Format, FormatError, bind_tools
from turnforge.types import Message, ToolCall


class PlainTextEndsTurn:
    """`PlainTextEndsTurn(get_format("tool_call"))`: plain text passes as an answer; calls parse as before."""

    def __init__(self, inner: Format):
        marker = getattr(inner, "call_marker", None)
        if not marker:
            raise ValueError(f"format {inner.name!r} has no call_marker; it cannot tell plain text from a call")
        self.inner, self.marker, self.name = inner, marker, inner.name
        self.uses_tools, self.thoughts = inner.uses_tools, inner.thoughts

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        return self.inner.system_prompt(tools)

    def bind_tools(self, tools: list[dict] | None) -> None:
        bind_tools(self.inner, tools)

    def parse(self, text: str) -> Message | FormatError:
        if self.marker not in text:
            return Message(role="assistant", content=text.strip())
        return self.inner.parse(text)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        return self.inner.render(message, thought=thought)

    def error_observation(self, error: FormatError) -> str:
        return self.inner.error_observation(error)

    def action(self, tool: str, arguments: dict, text: str) -> Message:
        return self.inner.action(tool, arguments, text)

    def observation(self, content: str, call: ToolCall | None = None, tool: str | None = None) -> Message:
        return self.inner.observation(content, call, tool)
