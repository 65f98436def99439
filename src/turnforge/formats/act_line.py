"""act_line: an optional `THOUGHT:` and exactly one `ACTION: <command>` line per reply.

This is the format of the seed ALFWorld trajectory DPO adapter (kuririrn/qwen3-4b-agent-trajectory_dpo_v1):
"Actions are emitted as a single line: use the ACTION: tag (uppercase), followed by a structured action
string compatible with the environment", e.g. `ACTION: take apple 1 from countertop 1`. Its data
normalised the older ReAct tags `Act:`/`Think:` to `ACTION:`/`THOUGHT:`; we accept those too.

Parsing is lenient about the tag (any case, `Act:`, markdown bold, bullets, surrounding backticks or
quotes) but never edits the command itself: ALFWorld compares commands exactly, so a trailing period
is kept and the env answers "Nothing happens." as the real game would.
"""

from __future__ import annotations

import re

from turnforge.formats.base import FormatError, TextActions
from turnforge.types import Message

# A tag that opens its line, after optional markdown (`**ACTION:**`, `- Act:`, `> ACTION:`).
_LINE_START_TAG = re.compile(r"^[ \t*#>`-]*(?:action|act)[ \t]*(?:\*+[ \t]*)?:", re.IGNORECASE)
# A tag anywhere in a line ("THOUGHT: ... ACTION: go to fridge 1"); not inside a word ("REACTION:").
_ANY_TAG = re.compile(r"(?<![A-Za-z0-9_])(?:action|act)[ \t]*(?:\*+[ \t]*)?:\**", re.IGNORECASE)

_QUOTE_PAIRS = {"`": "`", '"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019"}


def strip_action_markup(action: str) -> str:
    """Remove what models wrap around a command (whitespace, `**bold**`, backticks, quotes), nothing else.

    Shared with the react format so both read a command the same way.
    """
    action = action.strip().strip("*").strip()
    while len(action) >= 2 and _QUOTE_PAIRS.get(action[0]) == action[-1]:
        action = action[1:-1].strip()
    return action


def _action_line(text: str) -> str | None:
    """The line that carries the action: the first one opening with a tag, else the first with a tag anywhere.

    Line-opening tags win so that a thought mentioning "the last action: go to x" does not shadow the
    real `ACTION:` line below it; the first line wins so a hallucinated continuation
    ("ACTION: a / Observation: ... / ACTION: b") executes only the action the model committed to first.
    """
    lines = text.split("\n")
    for line in lines:
        if _LINE_START_TAG.match(line):
            return line
    for line in lines:
        if _ANY_TAG.search(line):
            return line
    return None


def parse_action_text(text: str) -> str | FormatError:
    """The command after the last ACTION tag on the action line, or why there is none."""
    line = _action_line(text)
    if line is None:
        return FormatError(reason='no "ACTION:" line', text=text)
    *_, last_tag = _ANY_TAG.finditer(line)
    action = strip_action_markup(line[last_tag.end() :])
    if not action:
        return FormatError(reason='"ACTION:" is followed by no command', text=text)
    return action


class ActLineFormat(TextActions):
    """`THOUGHT: ...` (optional, any number of lines) then one `ACTION: <command>` line."""

    name = "act_line"

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """How to reply; `tools` is ignored because commands are free text checked by the env."""
        return (
            "Reply in this format:\n"
            "THOUGHT: <optional short reasoning>\n"
            "ACTION: <exactly one command>\n"
            "\n"
            "Write exactly one ACTION line per reply; the command is executed exactly as written.\n"
            "Example:\n"
            "THOUGHT: The apple is probably in the fridge.\n"
            "ACTION: go to fridge 1"
        )

    def parse(self, text: str) -> Message | FormatError:
        action = parse_action_text(text)
        if isinstance(action, FormatError):
            return action
        return Message(role="assistant", content=action)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """`ACTION: <content>`, preceded by `THOUGHT: <thought>` when a scripted policy gives one."""
        action = f"ACTION: {message.content}"
        return action if thought is None else f"THOUGHT: {thought}\n{action}"

    def error_observation(self, error: FormatError) -> str:
        return f'Invalid format: {error.reason}. Reply with one line "ACTION: <command>".'
