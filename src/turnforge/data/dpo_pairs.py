"""Round-wise DPO pairs: one pair per decision point where a reply went wrong, mined from rollouts.

A pair is (history, chosen next assistant turn, rejected next assistant turn, reason), the schema of the seed
ALFWorld DPO dataset (kuririrn/alfworld_roundwise_dpo_v1: `messages`, `chosen`, `rejected`, `reason`). Mining
replays each trajectory in a fresh env (the env is deterministic given the task and the replies) and judges
every assistant reply; a reply with a defect becomes `rejected`, and `chosen` is, at the same state:
  - for `verbose`: the same action written concisely (the Iron Guard seed's "concise thought + valid action"
    against "verbose, chatty");
  - else a successful sibling episode's reply at an identical history (on-policy text), when one exists;
  - else the env's expert (`expert_reply()` after replaying the history).
A chosen reply is itself stepped and judged; one with any defect is not used (the pair is dropped).

Reasons, in the order that picks one when a reply has several (`REASONS`):
  format                   the reply does not parse in the env's format
  task_succeeded_negative  the reply claims the task is done ("ACTION: task succeeded") and it is not
  loop                     the action repeats the previous one, or an earlier one that got the same observation
                           since progress last rose, and progress does not rise
  implausible_location     env defect (household: searching where the goal object never occurs)
  invalid_action           env defect (household: "Nothing happens.")
  verbose                  a valid reply with more than `verbose_chars` characters beyond its concise rendering
Env defects come from `StepResult.info["defects"]` (docs/decisions.md); SQL envs add sql_error, wrong_table and
answer_without_query, which are kept too (after the generic reasons, in the env's order).

Import/export: `save_pairs` / `load_pairs` read and write the seed schema and TRL's conversational preference
format (`prompt`, `chosen`, `rejected` as message lists) as JSONL, parquet, `save_to_disk` folders or `hf:NAME`.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnforge.envs.base import Env, SupportsExpert
from turnforge.formats.base import FormatError
from turnforge.types import Message, Task, Trajectory

logger = logging.getLogger(__name__)

REASONS = ("format", "task_succeeded_negative", "loop", "implausible_location", "invalid_action", "verbose")
"""Known reasons, most specific first: a reply with several defects is labelled with the first."""
PAIR_KEYS = ("messages", "chosen", "rejected", "reason")
"""The seed dataset's schema; `tools`, `task_id`, `turn` and `chosen_from` are optional extras."""
# "ACTION: task succeeded" is how the seed's agents claim success; the household has no such command.
_SUCCESS_CLAIM = re.compile(
    r"\btask\s+(?:has\s+been\s+|is\s+)?(?:succeeded|success(?:ful)?|completed?|done|finished|solved)\b|^\s*(?:done|finish(?:ed)?)\s*\.?\s*$",
    re.IGNORECASE,
)


@dataclass
class Pair:
    """One DPO example: after `messages` (system ... last observation), `chosen` is preferred to `rejected`."""

    messages: list[dict[str, Any]]
    chosen: str
    rejected: str
    reason: str
    tools: list[dict[str, Any]] | None = None
    task_id: str = ""
    turn: int = -1
    """Index of the assistant turn the pair replaces (0 = first reply); -1 when unknown (imported)."""
    chosen_from: str = ""
    """expert | sibling | concise | dataset."""

    def to_record(self) -> dict[str, Any]:
        """The seed schema (+ tools and provenance when known): a line of pairs.jsonl."""
        out: dict[str, Any] = {k: getattr(self, k) for k in PAIR_KEYS}
        if self.tools is not None:
            out["tools"] = self.tools
        out |= {"task_id": self.task_id, "turn": self.turn, "chosen_from": self.chosen_from}
        return out

    def to_trl(self, window_messages: Callable[[list], list] | None = None) -> dict[str, Any]:
        """TRL's conversational preference row: `prompt` messages, one-message `chosen` / `rejected`.

        `tools` is a JSON string (TRL's DPOTrainer decodes it), None when there are none, so that rows with and
        without tools share one Arrow column.
        """
        prompt = window_messages(self.messages) if window_messages else self.messages
        return {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": self.chosen}],
            "rejected": [{"role": "assistant", "content": self.rejected}],
            "tools": json.dumps(self.tools) if self.tools else None,
        }


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


@dataclass
class MiningCounts:
    """What mining did (written to the DPO stage's done.json)."""

    episodes: int = 0
    turns: int = 0
    defective_turns: int = 0
    no_clean_chosen: int = 0
    """Defective replies dropped because no defect-free chosen reply was found at their state."""
    not_replayable: int = 0
    """Episodes skipped: replaying them gave other observations than recorded (other env options?)."""
    duplicates: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    chosen_from: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------------------
# Judging one reply


def action_key(message: Message) -> str:
    """What a parsed reply does, for comparing actions (text actions, or tool calls without their ids)."""
    calls = [(c.name, c.arguments) for c in message.tool_calls or []]
    return json.dumps([message.content.strip(), calls], sort_keys=True)


def claims_success(message: Message) -> bool:
    """The reply says the task is done.

    >>> claims_success(Message("assistant", "task succeeded")), claims_success(Message("assistant", "go to desk 1"))
    (True, False)
    """
    texts = [message.content] + [str(v) for c in message.tool_calls or [] for v in c.arguments.values()]
    return any(_SUCCESS_CLAIM.search(t) for t in texts)


def is_loop(parsed: Message, observation: str, past: list[Judged], progressed: bool) -> bool:
    """The action repeats the previous one, or one since progress last rose that got the same observation.

    >>> a, b = Message("assistant", "look"), Message("assistant", "go to desk 1")
    >>> past = [Judged("", a, "room", 0.0, 0.0, False), Judged("", b, "desk", 0.0, 0.0, False)]
    >>> is_loop(a, "room", past, False), is_loop(a, "other", past, False), is_loop(b, "x", past, False)
    (True, False, True)
    """
    if progressed or not past:
        return False
    key = action_key(parsed)
    if isinstance(past[-1].parsed, Message) and action_key(past[-1].parsed) == key:
        return True
    for earlier in reversed(past):
        if earlier.progress > earlier.progress_before:
            break  # progress rose at that turn: repeating what came before it is no loop
        if isinstance(earlier.parsed, Message) and action_key(earlier.parsed) == key and earlier.observation == observation:
            return True
    return False


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


# ---------------------------------------------------------------------------------------------------------------
# Mining


def _history_key(messages: list[Message]) -> str:
    return json.dumps([m.to_dict() for m in messages], sort_keys=True)


def _replay(env_factory: Callable[[], Env], task: Task, replies: list[str], settings: MiningSettings) -> tuple[Env, list[Judged]]:
    """A fresh env stepped through `replies`, and each reply judged."""
    env = env_factory()
    env.reset(task)
    past: list[Judged] = []
    for reply in replies:
        past.append(judge_reply(env, reply, past, settings))
    return env, past


def replay_trajectory(traj: Trajectory, env_factory: Callable[[], Env], task: Task, settings: MiningSettings) -> list[Judged] | None:
    """Every assistant reply of `traj` judged in a fresh env; None when the replay's observations differ from the record."""
    starts = traj.reply_indices()
    _, judged = _replay(env_factory, task, [traj.messages[i].content for i in starts], settings)
    for n, i in enumerate(starts):
        nxt = starts[n + 1] if n + 1 < len(starts) else len(traj.messages)
        recorded = "\n".join(m.content for m in traj.messages[i + 1 : nxt])
        if recorded and recorded != judged[n].observation:
            return None
    return judged


def _chosen_reply(
    env_factory: Callable[[], Env],
    task: Task,
    history: list[Judged],
    rejected: Judged,
    sibling: str | None,
    settings: MiningSettings,
) -> tuple[str, str] | None:
    """(chosen reply, where it came from) at the state after `history`, checked defect-free; None if none is."""
    env, past = _replay(env_factory, task, [j.reply for j in history], settings)
    if rejected.defects == ["verbose"]:
        assert isinstance(rejected.parsed, Message)
        candidate, source = env.format.render(rejected.parsed), "concise"
    elif sibling is not None:
        candidate, source = sibling, "sibling"
    elif isinstance(env, SupportsExpert):
        candidate, source = env.format.render(env.expert_reply()), "expert"
    else:
        return None
    if candidate == rejected.reply or judge_reply(env, candidate, past, settings).defects:
        return None
    return candidate, source


def mine_dpo_pairs(
    trajectories: Iterable[Trajectory],
    env_factory: Callable[[], Env],
    tasks: dict[str, Task],
    settings: MiningSettings | None = None,
    counts: MiningCounts | None = None,
) -> list[Pair]:
    """One pair per defective assistant reply of `trajectories` (see the module docstring); duplicates dropped.

    `env_factory` builds the env the trajectories were collected in (same options); `tasks` maps task ids to tasks.
    """
    settings = settings or MiningSettings()
    counts = counts if counts is not None else MiningCounts()
    judged_all: list[tuple[Trajectory, list[Judged]]] = []
    for traj in trajectories:
        if traj.task_id not in tasks:
            raise ValueError(f"trajectory of task {traj.task_id!r} (sample {traj.sample}): no such task in the env's splits")
        counts.episodes += 1
        judged = replay_trajectory(traj, env_factory, tasks[traj.task_id], settings)
        if judged is None:
            counts.not_replayable += 1
            logger.warning("dpo mining: task %s sample %s does not replay as recorded; skipped", traj.task_id, traj.sample)
            continue
        judged_all.append((traj, judged))
    siblings = _sibling_replies(judged_all)
    pairs, seen = [], set()
    for traj, judged in judged_all:
        starts = traj.reply_indices()
        counts.turns += len(judged)
        for n, j in enumerate(judged):
            if not j.defects:
                continue
            counts.defective_turns += 1
            reason = j.defects[0]
            if settings.reasons is not None and reason not in settings.reasons:
                continue
            history = traj.messages[: starts[n]]
            key = _history_key(history)
            sibling = siblings.get(key)
            picked = _chosen_reply(env_factory, tasks[traj.task_id], judged[:n], j, sibling, settings)
            if picked is None:
                counts.no_clean_chosen += 1
                continue
            if (key, j.reply) in seen:
                counts.duplicates += 1
                continue
            seen.add((key, j.reply))
            chosen, source = picked
            pairs.append(Pair([m.to_dict() for m in history], chosen, j.reply, reason, traj.tools, traj.task_id, n, source))
            counts.by_reason[reason] = counts.by_reason.get(reason, 0) + 1
            counts.chosen_from[source] = counts.chosen_from.get(source, 0) + 1
    return pairs


def _sibling_replies(judged_all: list[tuple[Trajectory, list[Judged]]]) -> dict[str, str]:
    """History -> the next reply of a successful episode there, when that reply has no defect."""
    out: dict[str, str] = {}
    for traj, judged in judged_all:
        if not traj.score.success:
            continue
        for n, i in enumerate(traj.reply_indices()):
            if not judged[n].defects:
                out.setdefault(_history_key(traj.messages[:i]), judged[n].reply)
    return out


def reason_counts(pairs: Iterable[Pair]) -> dict[str, int]:
    """Pairs per reason, in `REASONS` order then others alphabetically."""
    c = Counter(p.reason for p in pairs)
    return {r: c[r] for r in [*REASONS, *sorted(set(c) - set(REASONS))] if c[r]}


# ---------------------------------------------------------------------------------------------------------------
# Import / export


def pairs_dataset(pairs: list[Pair], schema: str = "seed"):
    """A `datasets.Dataset` of `pairs`: schema "seed" (messages, chosen, rejected, reason, ...) or "trl"."""
    import datasets

    if schema not in ("seed", "trl"):
        raise ValueError(f"pair schema must be 'seed' or 'trl', got {schema!r}")
    rows = [p.to_trl() | {"reason": p.reason} if schema == "trl" else _flat_record(p) for p in pairs]
    return datasets.Dataset.from_list(rows)


def _flat_record(pair: Pair) -> dict[str, Any]:
    # Arrow needs one type per column: tools as a JSON string (None when none), as Hub datasets usually store them.
    record = pair.to_record()
    record["tools"] = json.dumps(pair.tools) if pair.tools else None
    return record


def save_pairs(pairs: list[Pair], path: str | Path, schema: str = "seed") -> Path:
    """Write `pairs` to `path`: .jsonl (one record a line), .parquet, or a folder (`save_to_disk`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for p in pairs:
                record = p.to_record() if schema == "seed" else p.to_trl() | {"reason": p.reason}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    elif path.suffix == ".parquet":
        pairs_dataset(pairs, schema).to_parquet(str(path))
    elif not path.suffix:
        pairs_dataset(pairs, schema).save_to_disk(str(path))
    else:
        raise ValueError(f"cannot write pairs to {path}: use a .jsonl or .parquet file, or a folder")
    return path


def load_pairs(source: str) -> list[Pair]:
    """Pairs from a JSONL/parquet file, a dataset folder or `hf:NAME[:SPLIT]`, in the seed or the TRL schema."""
    if not source.startswith("hf:") and not Path(source).exists():
        raise FileNotFoundError(f"dpo pair data {source!r} not found: give a JSONL/parquet file, a dataset folder or hf:NAME[:SPLIT]")
    # The one reader of data sources (it lives with SFT and imports the training stack, hence here).
    from turnforge.train.sft import read_records

    return [pair_from_record(where, record) for where, record in read_records(source)]


def pair_from_record(where: str, record: dict[str, Any]) -> Pair:
    """A seed-schema or TRL-schema record as a Pair; an error naming `where` when it is neither."""
    history = record.get("messages", record.get("prompt"))
    missing = [k for k in ("chosen", "rejected") if k not in record] + ([] if history is not None else ["messages"])
    if missing:
        raise ValueError(f"{where}: not a DPO pair: missing {missing}; expected keys {list(PAIR_KEYS)} or prompt/chosen/rejected")
    if isinstance(history, str):  # TRL's standard (non-conversational) format: the prompt is plain text
        history = [{"role": "user", "content": history}]
    if not isinstance(history, list) or not all(isinstance(m, dict) and "role" in m for m in history):
        raise ValueError(f"{where}: messages/prompt must be a list of {{role, content}} messages")
    tools = record.get("tools") or None
    if isinstance(tools, str):
        tools = json.loads(tools)
    return Pair(
        messages=[{k: v for k, v in m.items() if v is not None} for m in history],
        chosen=_reply_text(record["chosen"], where, "chosen"),
        rejected=_reply_text(record["rejected"], where, "rejected"),
        reason=str(record.get("reason") or "unknown"),
        tools=tools,
        task_id=str(record.get("task_id") or ""),
        turn=int(record["turn"]) if record.get("turn") is not None else -1,
        chosen_from=str(record.get("chosen_from") or "dataset"),
    )


def _reply_text(value: Any, where: str, key: str) -> str:
    """A reply given as text, as an assistant message, or as a one-message list (TRL) -> its text."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, dict):
        if value.get("tool_calls"):
            raise ValueError(f"{where}: {key} has structured tool_calls; give the reply as the text the model writes")
        value = value.get("content")
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key} must be a string, an assistant message or a list of one (got {type(value).__name__})")
    return value
