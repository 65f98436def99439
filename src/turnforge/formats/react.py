"""react: AgentBench-style ReAct replies — `Thought: ...`, then `Action: ...` or a `Final Answer: ...`.

Three reply shapes, all from AgentBench (THUDM/AgentBench v0.2, see shared/benchmarks.md §2–3):

    Thought: ...                 Thought: ...                 Thought: ...
    Action: go to fridge 1       Action: Operation            Action: Answer
                                 ```sql                       Final Answer: ["a", "b"]
                                 SELECT * FROM t;
                                 ```

A plain action parses to `Message("assistant", "go to fridge 1")`; DBBench's `Action: Operation`
parses to the code inside the fence that follows; a final answer parses to
`Message("assistant", <answer>, name="final_answer")` (also accepted without the `Action: Answer` line).
Text from a line starting with `Observation:` on is ignored: it is the model imagining the env's turn,
which ReAct agents cut with that stop word.

`ReactFormat(code_language="sql")` (registered as "react_sql") parses and renders as DBBench does:
an operation is the first `` ```sql\\n...\\n``` `` block of the reply (another fence, or an unclosed one,
is a format error), and an action other than `Operation` / `Answer` is a format error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from turnforge.formats.act_line import strip_action_markup
from turnforge.formats.base import FormatError, TextActions
from turnforge.types import Message

FINAL_ANSWER = "final_answer"

_PREFIX = r"^[ \t*#>`-]*"  # markdown a model may put before a tag: bullets, bold, quotes, headings
_ACTION = re.compile(_PREFIX + r"action[ \t]*(?:\d+[ \t]*)?(?:\*+[ \t]*)?:\**(?P<value>.*)$", re.I | re.M)
_FINAL = re.compile(_PREFIX + r"final[ \t]+answer[ \t]*(?:\*+[ \t]*)?:\**", re.I | re.M)
# Fallbacks for one-line replies ("Thought: x. Action: y"); exact case only, so prose does not trigger them.
_ACTION_INLINE = re.compile(r"(?<![A-Za-z])Action:(?P<value>.*)$", re.M)
_FINAL_INLINE = re.compile(r"(?<![A-Za-z])Final Answer:")
_OBSERVATION = re.compile(r"^[ \t]*Observation[ \t]*(?:\d+[ \t]*)?:", re.I | re.M)
# Plain react reads the first fence after `Action: Operation`; an unclosed last fence is read to the end.
_FENCE = re.compile(r"```[^\n]*\n(?P<code>.*?)(?:```|\Z)", re.S)

_OPERATION, _ANSWER = "operation", "answer"


@dataclass
class _Tag:
    """Where a tag starts in the reply, where it ends, and (for actions) the rest of its line."""

    start: int
    end: int
    value: str = ""


def _first(line_start: re.Pattern[str], inline: re.Pattern[str], text: str) -> _Tag | None:
    """The first tag opening a line; an inline tag only when no line opens with one (it may be prose)."""
    match = line_start.search(text) or inline.search(text)
    if match is None:
        return None
    value = match.group("value") if "value" in match.groupdict() else ""
    return _Tag(match.start(), match.end(), strip_action_markup(value))


def _final_answer(body: str, tag: _Tag, text: str) -> Message | FormatError:
    answer = body[tag.end :].strip()
    if not answer:
        return FormatError(reason='"Final Answer:" is followed by no answer', text=text)
    return Message(role="assistant", content=answer, name=FINAL_ANSWER)


def _operation(body: str, tag: _Tag, text: str, language: str | None) -> Message | FormatError:
    if language is not None:
        # DBBench executes the first ```sql block of the reply, wherever it is, closed by "\n```" (v0.2:
        # re.search(r"```sql\n([\s\S]*?)\n```", res)); any other fence fails its validation.
        fence = re.search(r"```" + re.escape(language) + r"\n(?P<code>[\s\S]*?)\n```", body)
        if fence is None:
            return FormatError(reason=f'"Action: Operation" needs a closed ```{language} code block', text=text)
    else:
        fence = _FENCE.search(body, tag.end)
    if fence is None:
        return FormatError(reason='"Action: Operation" is not followed by a ``` code block', text=text)
    code = fence.group("code").strip()
    if not code:
        return FormatError(reason='the code block after "Action: Operation" is empty', text=text)
    return Message(role="assistant", content=code)


class ReactFormat(TextActions):
    """Thought / Action / Final Answer replies; `code_language` set = DBBench's fenced operations."""

    def __init__(self, code_language: str | None = None, name: str = "react") -> None:
        self.code_language = code_language
        self.name = name

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """How to reply; `tools` is ignored because actions are free text checked by the env."""
        if self.code_language is None:
            action = "Action: <one action>"
        else:
            action = f"Action: Operation\n```{self.code_language}\n<one statement>\n```"
        return (
            "Reply in this format:\n"
            "Thought: <your reasoning>\n"
            f"{action}\n"
            "\n"
            "When you have the final answer, reply:\n"
            "Thought: <your reasoning>\n"
            "Action: Answer\n"
            "Final Answer: <your answer>"
        )

    def parse(self, text: str) -> Message | FormatError:
        body = text.replace("\r\n", "\n")
        observation = _OBSERVATION.search(body)
        if observation is not None:
            body = body[: observation.start()]
        action = _first(_ACTION, _ACTION_INLINE, body)
        final = _first(_FINAL, _FINAL_INLINE, body)
        if action is not None and action.value.lower() == _ANSWER:
            if final is None:
                return FormatError(
                    reason='"Action: Answer" is not followed by a "Final Answer:" line', text=text
                )
            action = None
        if final is not None and (action is None or final.start < action.start):
            return _final_answer(body, final, text)
        if action is None:
            return FormatError(reason='no "Action:" or "Final Answer:" line', text=text)
        if action.value.lower() == _OPERATION:
            return _operation(body, action, text, self.code_language)
        if not action.value:
            return FormatError(reason='"Action:" is followed by no action', text=text)
        if self.code_language is not None:  # DBBench knows only "Operation" and "Answer"
            return FormatError(reason='"Action:" must be "Operation" (with a code block) or "Answer"', text=text)
        return Message(role="assistant", content=action.value)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """The inverse of `parse`; `Thought:` is written only when a scripted policy gives one."""
        if message.name == FINAL_ANSWER:
            reply = f"Action: Answer\nFinal Answer: {message.content}"
        elif self._needs_fence(message.content):
            reply = f"Action: Operation\n```{self.code_language or ''}\n{message.content}\n```"
        else:
            reply = f"Action: {message.content}"
        return reply if thought is None else f"Thought: {thought}\n{reply}"

    def _needs_fence(self, action: str) -> bool:
        """Fence DBBench code always, and any action a bare `Action:` line could not carry back intact."""
        bare_reserved = action.strip().lower() in (_OPERATION, _ANSWER)
        return self.code_language is not None or "\n" in action or bare_reserved

    def error_observation(self, error: FormatError) -> str:
        if self.code_language is None:
            expected = '"Action: <action>"'
        else:
            expected = f'"Action: Operation" and a ```{self.code_language} block'
        return (
            f"Invalid format: {error.reason}. End your reply with {expected}, "
            'or "Action: Answer" and "Final Answer: <answer>" when you are done.'
        )
