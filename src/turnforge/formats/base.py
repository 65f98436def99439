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

from turnforge.types import Message


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

    def render(self, message: Message) -> str:
        """Parsed assistant Message -> text in this format."""
        ...

    def error_observation(self, error: FormatError) -> str:
        """What the agent is told when its reply could not be parsed."""
        ...
