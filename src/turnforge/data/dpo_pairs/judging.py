"""Judging one reply of a DPO mining replay: step it in the env and list its defects, most specific first.

Reasons, in the order that picks one when a reply has several (`REASONS`):
  format                   the reply does not parse in the env's format
  task_succeeded_negative  the reply claims the task is done ("ACTION: task succeeded") and it is not
  loop                     the reply repeats (`turnforge.rewards.repeats`): the previous action again, or an earlier
                           one since progress last rose that got the same observation, and progress does not rise
  implausible_location     env defect (household: searching where the goal object never occurs)
  invalid_action           env defect (household: "Nothing happens.")
  verbose                  a valid reply with more than `verbose_chars` characters beyond its concise rendering
Env defects come from `StepResult.info["defects"]` (docs/decisions.md); SQL envs add sql_error, wrong_table and
answer_without_query, which are kept too (after the generic reasons, in the env's order).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from turnforge.envs.base import Env
from turnforge.formats.base import FormatError
from turnforge.rewards import Step, repeats, reply_key
from turnforge.types import Message

REASONS = ("format", "task_succeeded_negative", "loop", "implausible_location", "invalid_action", "verbose")
"""Known reasons, most specific first: a reply with several defects is labelled with the first."""
# "ACTION: task succeeded" is how the seed's agents claim success; the household has no such command.
_SUCCESS_CLAIM = re.compile(
    r"\btask\s+(?:has\s+been\s+|is\s+)?(?:succeeded|success(?:ful)?|completed?|done|finished|solved)\b|^\s*(?:done|finish(?:ed)?)\s*\.?\s*$",
    re.IGNORECASE,
)


@dataclass
class MiningSettings:
    """How replies are judged."""

    verbose_chars: int = 160
    """A valid reply is `verbose` when its text is longer than its concise rendering by more than this."""
    reasons: tuple[str, ...] | None = None
    """Keep pairs of these reasons only; None = every reason."""


@dataclass
class Judged:
    """One assistant reply, stepped: what the env answered and what was wrong with it (reasons in order)."""

    reply: str
    parsed: Message | FormatError
    observation: str
    progress_before: float
    progress: float
    won: bool
    defects: list[str] = field(default_factory=list)

    def step(self) -> Step:
        """This reply as loop detection sees it."""
        return _step(self.parsed, self.observation, self.progress > self.progress_before)


def claims_success(message: Message) -> bool:
    """The reply says the task is done.

    >>> claims_success(Message("assistant", "task succeeded")), claims_success(Message("assistant", "go to desk 1"))
    (True, False)
    """
    texts = [message.content] + [str(v) for c in message.tool_calls or [] for v in c.arguments.values()]
    return any(_SUCCESS_CLAIM.search(t) for t in texts)


def is_loop(parsed: Message, observation: str, past: list[Judged], progressed: bool) -> bool:
    """The reply repeats (`turnforge.rewards.repeats`, the one definition the loop reward uses too): the action
    repeats the previous one, or one since progress last rose that got the same observation.

    >>> a, b = Message("assistant", "look"), Message("assistant", "go to desk 1")
    >>> past = [Judged("", a, "room", 0.0, 0.0, False), Judged("", b, "desk", 0.0, 0.0, False)]
    >>> is_loop(a, "room", past, False), is_loop(a, "other", past, False), is_loop(b, "x", past, False)
    (True, False, True)
    """
    return repeats(_step(parsed, observation, progressed), [j.step() for j in past])


def _step(parsed: Message | FormatError, observation: str, progressed: bool) -> Step:
    reply = reply_key(parsed) if isinstance(parsed, Message) else None  # an unparsed reply does nothing
    return Step(reply, " ".join(observation.split()), progressed)


def judge_reply(env: Env, reply: str, past: list[Judged], settings: MiningSettings) -> Judged:
    """Parse and step `reply` in `env` (at the state `past` led to) and list its defects, in `REASONS` order."""
    parsed = env.format.parse(reply)
    before = past[-1].progress if past else 0.0
    result = env.step(parsed)
    observation = "\n".join(m.content for m in result.messages)
    progress = float(result.info.get("progress", before))
    won = bool(result.info.get("won", result.stop is not None and result.stop.value == "success"))
    judged = Judged(reply, parsed, observation, before, progress, won)
    found = set(result.info.get("defects", []))
    if isinstance(parsed, FormatError):
        found.add("format")
    else:
        if claims_success(parsed) and not won:
            found.add("task_succeeded_negative")
        if is_loop(parsed, observation, past, progress > before):
            found.add("loop")
        if not found and len(reply.strip()) - len(env.format.render(parsed)) > settings.verbose_chars:
            found.add("verbose")
    judged.defects = [r for r in REASONS if r in found] + sorted(found - set(REASONS))
    return judged
