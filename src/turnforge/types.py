"""Core types shared by every part of turnforge: messages, tasks, steps, trajectories, scores.

Plain dataclasses with an exact JSON round trip (`Trajectory.from_json(t.to_json()) == t`), and the one reader
of JSON-lines files of them (`json_records`, `read_trajectories`): eval episodes, collect stages' trajectories,
replay files and SFT data are all read by it, so a bad line is reported the same way everywhere (FILE:LINE).
`Message.to_dict()` gives the OpenAI / Hugging Face chat shape, so
`tokenizer.apply_chat_template([m.to_dict() for m in messages], tools=...)` accepts it unchanged.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

TRAJECTORY_KEYS = frozenset({"task_id", "turns", "score", "stop_reason"})
"""The keys that mark a JSON record as a Trajectory (`Trajectory.to_dict`); a conversational record has `messages`."""


@dataclass
class ToolCall:
    """One function call written by the assistant (`arguments` already decoded from JSON; the undecoded string
    only in a saved call being replayed, see `from_saved`)."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # HF chat templates (Qwen3 included) read `function.name` / `function.arguments`.
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            out["id"] = self.id
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        fn = d.get("function", d)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        return cls(name=fn["name"], arguments=args, id=d.get("id"))

    @classmethod
    def from_saved(cls, d: dict[str, Any]) -> ToolCall:
        """`from_dict` for a call being replayed: arguments that are not JSON stay the string the model wrote (a
        format writes it back as such, and reads it as an unreadable call) instead of refusing the whole file."""
        try:
            return cls.from_dict(d)
        except json.JSONDecodeError:
            fn = d.get("function", d)
            return cls(name=fn["name"], arguments=fn["arguments"], id=d.get("id"))


@dataclass
class Message:
    """A chat message: role is one of system, user, assistant, tool."""

    role: str
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls is not None:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        calls = d.get("tool_calls")
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=[ToolCall.from_dict(c) for c in calls] if calls is not None else None,
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


@dataclass
class Task:
    """One problem instance. `data` is the environment's own payload (JSON-serialisable)."""

    id: str
    env: str
    split: str
    category: str
    data: dict[str, Any] = field(default_factory=dict)


class StopReason(enum.StrEnum):
    """Why an episode ended. Every finished episode has exactly one."""

    success = "success"
    failure = "failure"
    gave_up = "gave_up"
    max_turns = "max_turns"
    max_tokens = "max_tokens"
    format_error_limit = "format_error_limit"
    env_error = "env_error"
    user_stop = "user_stop"
    timeout = "timeout"


@dataclass
class StepResult:
    """What an env returns for one assistant reply: new observation messages and the outcome so far."""

    messages: list[Message]
    reward: float = 0.0
    done: bool = False
    stop: StopReason | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Score:
    """The final judgement of an episode."""

    success: bool
    reward: float
    progress: float
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Turn:
    """One assistant turn and the environment's answer to it.

    `generated_ids`/`logprobs` are the exact tokens the policy sampled (empty for scripted policies);
    `observation_ids` are the chat-template tokens appended after it (observation + next prompt header).
    With a history window the episode has no single id sequence: `prompt_ids` is then the windowed prompt
    this turn was generated from (empty without a window), and `observation_ids` stays empty.
    """

    text: str
    generated_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    observation_ids: list[int] = field(default_factory=list)
    reward: float = 0.0
    progress: float = 0.0
    parse_ok: bool = True
    parse_error: str | None = None
    finish_reason: str | None = None
    prompt_ids: list[int] = field(default_factory=list)
    learn: bool = True
    """False for a reply SFT must not imitate: the deliberate mistakes of a noisy expert (DART), which stay in
    the episode as context for the recovery that follows."""


@dataclass
class Trajectory:
    """One episode, serialised as one JSON line."""

    task_id: str
    env: str
    category: str
    messages: list[Message]
    turns: list[Turn]
    score: Score
    stop_reason: StopReason
    split: str = ""
    sample: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    tokens_generated: int = 0
    env_steps: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    seed: int | None = None
    model: str | None = None
    tools: list[dict[str, Any]] | None = None

    def reply_indices(self) -> list[int]:
        """Positions in `messages` of the replies the policy wrote: the last len(turns) assistant messages (an
        env's first messages may hold assistant turns of its own, e.g. DBBench's few-shot "Ok.")."""
        assistant = [i for i, m in enumerate(self.messages) if m.role == "assistant"]
        return assistant[len(assistant) - len(self.turns) :] if self.turns else []

    def between_replies(self) -> list[list[Message]]:
        """The messages around the policy's replies, one list more than there are replies: what came before the
        first reply (the prompt), between each reply and the next (its observation), and after the last. What
        the model saw before reply k is `between_replies()[k]`; the env's answer to it, `between_replies()[k + 1]`."""
        out, start = [], 0
        for i in self.reply_indices():
            out.append(self.messages[start:i])
            start = i + 1
        return [*out, self.messages[start:]]

    @property
    def key(self) -> tuple[str, int]:
        """(task_id, sample): identifies an episode within a run (used to resume)."""
        return (self.task_id, self.sample)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["messages"] = [m.to_dict() for m in self.messages]
        out["turns"] = [asdict(t) for t in self.turns]
        out["score"] = asdict(self.score)
        out["stop_reason"] = self.stop_reason.value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown trajectory keys {sorted(unknown)}")
        kw = dict(d)
        kw["messages"] = [Message.from_dict(m) for m in d["messages"]]
        kw["turns"] = [Turn(**t) for t in d.get("turns", [])]
        kw["score"] = Score(**d["score"])
        kw["stop_reason"] = StopReason(d["stop_reason"])
        return cls(**kw)

    @classmethod
    def from_json(cls, line: str) -> Trajectory:
        return cls.from_dict(json.loads(line))


def json_records(path: str | Path, expected: str = "one JSON object a line") -> Iterator[tuple[str, dict[str, Any]]]:
    """(`FILE:LINE`, record) for every non-blank line of a JSON-lines file, in order.

    A line that is not a JSON object is an error naming its file and line and what the file should hold
    (`expected`).
    """
    with Path(path).open("rb") as f:  # bytes: a line that is not UTF-8 is reported with its place
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{where}: not UTF-8 text (byte {e.start + 1} of the line); expected {expected}") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg}); expected {expected}") from None
            except RecursionError:
                raise ValueError(f"{where}: JSON nested too deeply to read; expected {expected}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object ({expected}), got {type(record).__name__}")
            yield where, record


def trajectory_records(path: str | Path) -> Iterator[tuple[str, Trajectory]]:
    """(`FILE:LINE`, Trajectory) for every line of a JSON-lines file of trajectories; a bad line names its place."""
    for where, record in json_records(path, "one Trajectory JSON line a line"):
        yield where, trajectory_from_record(where, record)


def trajectory_from_record(where: str, record: dict[str, Any]) -> Trajectory:
    """`Trajectory.from_dict(record)`; a record that is none is an error naming `where`."""
    try:
        return Trajectory.from_dict(record)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a trajectory ({type(e).__name__}: {e}); fix or delete the line") from None


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Every Trajectory of a JSON-lines file (episodes.jsonl, trajectories.jsonl); a bad line names its place."""
    return [traj for _, traj in trajectory_records(path)]


# ---- model calls: what a policy (or an env's model role, e.g. a user simulator) is asked and answers -------------
# Here, not in policies/, so that envs reach their model roles without importing policies (design §3).


Temperature = Annotated[float, Field(ge=0.0)]
EVAL_TEMPERATURE = 0.0
"""An evaluation plays the greedy policy unless told otherwise: `turnforge eval`'s default and an eval stage's."""
"""A sampling temperature's type and rule (0 = greedy): a stage that changes only its default keeps the rule."""


class SamplingParams(BaseModel):
    """How a reply is sampled: the one sampling group. Every backend takes it (scripted policies ignore most of
    it); rollout stages and GRPO's settings derive from it (their recipe keys are its fields), `turnforge eval`'s
    options take their defaults and checks from it, and `turnforge serve` turns each request into one.

    Checked where it is made, so a bad value fails before any model loads; in a recipe, at its key."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    temperature: Temperature = 1.0
    """Sampling temperature; 0 = greedy."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens of this probability mass; 1 = off."""
    top_k: int = Field(default=0, ge=0)
    """Sample from the k most likely tokens only; 0 = off."""
    max_new_tokens: int = Field(default=256, ge=1)
    """Tokens per assistant turn at most."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a reply (kept in its text), besides the model's end-of-turn token."""
    seed: int = 0
    """Seed of the sampling (and of the random policy)."""
    explore: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of replies sampled; the others are the greedy reply (argmax), chosen per reply by `explores`.
    1 = every reply sampled (the usual); below 1, episodes play greedily and leave it at a few turns, so a
    group's outcomes differ by what those turns did (RL aimed at the greedy policy that is evaluated)."""

    @model_validator(mode="after")
    def _explore_needs_sampling(self) -> SamplingParams:
        if self.explore < 1 and self.temperature == 0:
            raise ValueError(f"explore={self.explore} samples some replies: it needs a temperature above 0")
        return self

    def sampling(self) -> SamplingParams:
        """The sampling group alone, of this object or of one deriving from it (a rollout stage, GRPO's settings)."""
        return SamplingParams(**{name: getattr(self, name) for name in SamplingParams.model_fields})

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with `changes`, checked as a new one is (pydantic's `model_copy` would not check them)."""
        return type(self).model_validate({**self.model_dump(), **changes})


@dataclass
class Prompt:
    """One open episode, as a policy sees it at its next turn."""

    messages: list[Message]
    task: Task
    sample: int
    turn: int
    ids: list[int] | None = None
    tools: list[dict] | None = None
    env: Any = None
    """The episode's env (scripted policies read it; model backends do not)."""



CONTEXT_LENGTH = "context_length"
"""The finish reason of a prompt refused for the model's context (`context_refusal`): nothing was generated, the
text is the refusal, and the rollout ends the episode with StopReason.max_tokens."""


@dataclass
class Generation:
    """One reply. `finish_reason`: "stop", "length" (hit max_new_tokens), "exhausted" (nothing left to say) or
    "context_length" (`CONTEXT_LENGTH`: the prompt was refused, `text` says why)."""

    text: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    learn: bool = True
    """False for a reply a training stage must not imitate (a scripted policy's deliberate mistake: `Turn.learn`)."""
