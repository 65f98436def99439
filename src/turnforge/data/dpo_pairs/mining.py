"""Mining round-wise DPO pairs from rollouts: one pair per decision point where a reply went wrong.

Mining replays each trajectory in a fresh env (the env is deterministic given the task and the replies) and judges
every reply the policy wrote (`judging.judge_reply`); a reply with a defect becomes `rejected`, and `chosen` is, at
the same state:
  - for `verbose`: the same action written concisely (the Iron Guard seed's "concise thought + valid action"
    against "verbose, chatty");
  - else, with a `teacher` (a stronger model: the Iron Guard seed's pairs were written by a Qwen3-30B teacher),
    the teacher's reply to the same history, all decision points asked in one batch;
  - else a successful sibling episode's reply at an identical history (on-policy text), when one exists;
  - else the env's expert (`expert_reply()` after replaying the history).
A chosen reply is itself stepped and judged; one with any defect is not used: the next source is tried (a
teacher's reply that fails counts in `teacher_rejected`), and with none left the pair is dropped.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from turnforge.data.dpo_pairs.files import Pair
from turnforge.data.dpo_pairs.judging import REASONS, Judged, MiningSettings, judge_reply
from turnforge.envs.base import Env, SupportsExpert, expert_text
from turnforge.policies.base import Policy, Prompt, SamplingParams
from turnforge.types import Message, Task, Trajectory

logger = logging.getLogger(__name__)


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
    teacher_rejected: int = 0
    """Teacher replies not kept: replayed in the env, they had a defect (or repeated the rejected reply)."""


Teacher = Callable[[list[tuple[Task, list[Message], list[dict] | None]]], list[str]]
"""Writes one reply per decision point (task, history up to the reply, tools): `policy_teacher(...)` over a policy."""


def policy_teacher(policy: Policy, params: SamplingParams, env_factory: Callable[[], Env]) -> Teacher:
    """A teacher over any policy backend (hf, vllm, openai): each decision point is a prompt of one batch."""

    def write(points: list[tuple[Task, list[Message], list[dict] | None]]) -> list[str]:
        env = env_factory()  # gives backends that write tool calls the env's format; never stepped
        try:
            prompts = [Prompt(messages=h, task=t, sample=0, turn=0, tools=tools, env=env) for t, h, tools in points]
            return [g.text for g in policy.generate(prompts, params)] if prompts else []
        finally:
            env.close()

    return write


def _history_key(messages: list[Message]) -> str:
    return json.dumps([m.to_dict() for m in messages], sort_keys=True)


def _replay(env_factory: Callable[[], Env], task: Task, replies: list[str], settings: MiningSettings) -> tuple[Env, list[Judged]]:
    """A fresh env stepped through `replies`, and each reply judged. The caller closes the env: it may hold a
    database, a sandbox or an OpenEnv session."""
    env = env_factory()
    try:
        env.reset(task)
        past: list[Judged] = []
        for reply in replies:
            past.append(judge_reply(env, reply, past, settings))
    except BaseException:
        env.close()
        raise
    return env, past


def replay_trajectory(traj: Trajectory, env_factory: Callable[[], Env], task: Task, settings: MiningSettings) -> list[Judged] | None:
    """Every assistant reply of `traj` judged in a fresh env; None when the replay's observations differ from the record."""
    starts = traj.reply_indices()
    env, judged = _replay(env_factory, task, [traj.messages[i].content for i in starts], settings)
    env.close()
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
    sources: list[tuple[str, str | None]],
    settings: MiningSettings,
    counts: MiningCounts,
) -> tuple[str, str] | None:
    """(chosen reply, where it came from) at the state after `history`: the first of `sources` (teacher, sibling;
    then the expert) whose reply is defect-free when stepped there; None if none is."""
    env, past = _replay(env_factory, task, [j.reply for j in history], settings)
    try:
        if rejected.defects == ["verbose"]:
            assert isinstance(rejected.parsed, Message)
            sources = [("concise", env.format.render(rejected.parsed))]
        elif isinstance(env, SupportsExpert):
            sources = [*sources, ("expert", None)]
        for source, candidate in sources:
            if source == "expert":
                candidate = expert_text(env)
            if candidate is None:
                continue
            if candidate != rejected.reply and not judge_reply(env, candidate, past, settings).defects:
                return candidate, source
            if source == "teacher":
                counts.teacher_rejected += 1
            stepped, env = env, None  # judging stepped it: the next candidate gets a fresh replay
            stepped.close()
            env, past = _replay(env_factory, task, [j.reply for j in history], settings)
        return None
    finally:
        if env is not None:
            env.close()


def mine_dpo_pairs(
    trajectories: Iterable[Trajectory],
    env_factory: Callable[[], Env],
    tasks: dict[str, Task],
    settings: MiningSettings | None = None,
    counts: MiningCounts | None = None,
    teacher: Teacher | None = None,
) -> list[Pair]:
    """One pair per defective assistant reply of `trajectories` (see the module docstring); duplicates dropped.

    `env_factory` builds the env the trajectories were collected in (same options); `tasks` maps task ids to tasks;
    `teacher`, when given, writes the first candidate chosen reply of every decision point (one batch).
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
    points = []  # (trajectory, judged replies, index of the defective one)
    for traj, judged in judged_all:
        counts.turns += len(judged)
        for n, j in enumerate(judged):
            if j.defects:
                counts.defective_turns += 1
                if settings.reasons is None or j.defects[0] in settings.reasons:
                    points.append((traj, judged, n))
    asked = [(tasks[t.task_id], t.messages[: t.reply_indices()[n]], t.tools) for t, _, n in points]
    taught = teacher(asked) if teacher is not None else [None] * len(points)
    if len(taught) != len(points):
        raise RuntimeError(f"the DPO teacher wrote {len(taught)} replies for {len(points)} decision points")
    pairs, seen = [], set()
    for (traj, judged, n), teacher_reply in zip(points, taught, strict=True):
        j, reason = judged[n], judged[n].defects[0]
        history = traj.messages[: traj.reply_indices()[n]]
        key = _history_key(history)
        sources = [("teacher", teacher_reply), ("sibling", siblings.get(key))]
        picked = _chosen_reply(env_factory, tasks[traj.task_id], judged[:n], j, sources, settings, counts)
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
