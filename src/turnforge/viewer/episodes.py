"""The viewer's data: episode files found in a run, indexed by byte offset, filtered and paged, one episode in full.

An `EpisodeFile` scans its JSON-lines file once (byte offset and a few fields per line: task, category, success,
reward, stop reason, turns) and then reads an episode by seeking to its offset, so a 50 MB file costs one pass
and little memory; text search scans the lines' raw bytes (mmap) without decoding whole episodes.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from turnforge.data.sft import trajectory_examples
from turnforge.data.sources import holds_trajectories
from turnforge.rundir import is_run_dir, read_run
from turnforge.types import Trajectory, trajectory_from_record


@dataclass
class EpisodeRow:
    """What the list shows of one episode, and where its line starts and ends in the file."""

    index: int
    task_id: str
    sample: int
    category: str
    success: bool
    reward: float
    stop_reason: str
    turns: int
    start: int
    end: int


class EpisodeFile:
    """One JSON-lines file of trajectories, indexed by byte offset."""

    def __init__(self, path: Path, label: str) -> None:
        self.path, self.label = path, label
        self.rows: list[EpisodeRow] = []
        with path.open("rb") as f:
            start = 0
            for lineno, raw in enumerate(f, 1):
                end = start + len(raw)
                if raw.strip():
                    try:
                        r = json.loads(raw)
                        self.rows.append(EpisodeRow(
                            len(self.rows), r["task_id"], r.get("sample", 0), r.get("category", ""),
                            bool(r["score"]["success"]), float(r["score"]["reward"]), r["stop_reason"],
                            len(r.get("turns", [])), start, end,
                        ))
                    except (ValueError, KeyError, TypeError):
                        if raw.endswith(b"\n"):  # only the last line of a killed run may be cut short
                            raise ValueError(f"{path}:{lineno}: not a trajectory JSON line") from None
                start = end

    def filtered(self, success: str = "", category: str = "", stop: str = "", query: str = "") -> list[EpisodeRow]:
        """The rows that pass every filter given (`success` 1/true or 0/false; `query` is searched in the raw line)."""
        wanted = _flag("success", success)
        rows = [
            r for r in self.rows
            if (wanted is None or r.success == wanted) and (not category or r.category == category)
            and (not stop or r.stop_reason == stop)
        ]  # fmt: skip
        if query and rows:
            needle = query.lower().encode()
            with self.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                rows = [r for r in rows if needle in data[r.start : r.end].lower()]
        return rows

    def trajectory(self, index: int) -> Trajectory:
        row = self.rows[index]
        with self.path.open("rb") as f:
            f.seek(row.start)
            raw = f.read(row.end - row.start)
        return trajectory_from_record(f"{self.path}:{index + 1}", json.loads(raw))

    def facets(self) -> dict[str, Any]:
        return {
            "id": self.label, "episodes": len(self.rows),
            "categories": sorted({r.category for r in self.rows}),
            "stop_reasons": sorted({r.stop_reason for r in self.rows}),
        }  # fmt: skip


_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _flag(name: str, value: str) -> bool | None:
    """A query's yes/no filter: None when not given; anything else than 1/true/yes, 0/false/no is refused (a typo
    once gave the failed episodes for `success=true`)."""
    if not value:
        return None
    if value.lower() not in _FLAGS:
        raise ValueError(f"{name}={value!r}: give 1/true/yes or 0/false/no")
    return _FLAGS[value.lower()]


def find_episode_files(target: Path) -> dict[str, EpisodeFile]:
    """A run directory's episode files (evaluations first, then every stage's trajectories), or one file."""
    if target.is_file():
        return {target.name: EpisodeFile(target, target.name)}
    if not target.is_dir():
        raise FileNotFoundError(f"{target} not found: give a run directory or an episodes.jsonl file")
    files: dict[str, Path] = {}
    if is_run_dir(target):
        files |= {f"eval/{name}": path for name, path in read_run(target).eval_episodes().items()}
    for path in sorted(target.rglob("*.jsonl")):
        label = str(path.relative_to(target).parent if path.name == "episodes.jsonl" else path.relative_to(target))
        label = target.name if label == "." else label  # an eval's --out: its own episodes.jsonl
        if path not in files.values() and holds_trajectories(str(path)):
            files[label] = path
    if not files:
        raise FileNotFoundError(f"{target} holds no episode files (episodes.jsonl, trajectories.jsonl)")
    return {label: EpisodeFile(path, label) for label, path in files.items()}


def episode_view(traj: Trajectory, decode: Any = None) -> dict[str, Any]:
    """One episode for the page: its messages with their turn's record, and its loss mask as segments.

    The mask is the training rule itself (`turnforge.data.sft.trajectory_examples`): segments of tokens that
    train (1) or not (0), decoded to text when `decode` (ids -> str) is given. Only a token-exact episode has
    one; a scripted episode's has to be rendered with a tokenizer first, so it is left out.
    """
    turn_of = {i: k for k, i in enumerate(traj.reply_indices())}
    messages = []
    for i, message in enumerate(traj.messages):
        entry = {"role": message.role, "content": message.content,
                 "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in message.tool_calls or []]}
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        if i in turn_of:
            turn = traj.turns[turn_of[i]]
            entry["turn"] = {"index": turn_of[i], "reward": turn.reward, "progress": turn.progress,
                             "parse_ok": turn.parse_ok, "parse_error": turn.parse_error,
                             "tokens": len(turn.generated_ids), "finish_reason": turn.finish_reason}
        messages.append(entry)
    examples = trajectory_examples(traj, tokenizer=None) if traj.prompt_ids else []
    masks = [_segments(e.input_ids, e.completion_mask, decode) for e in examples]
    return {
        "task_id": traj.task_id, "sample": traj.sample, "env": traj.env, "category": traj.category,
        "split": traj.split, "stop_reason": traj.stop_reason.value, "score": asdict(traj.score),
        "tokens_generated": traj.tokens_generated, "env_steps": traj.env_steps, "timings": traj.timings,
        "model": traj.model, "tools": [t.get("function", t).get("name") for t in traj.tools or []],
        "messages": messages, "loss_masks": masks,
    }  # fmt: skip


def _segments(ids: list[int], mask: list[int], decode: Any) -> list[dict[str, Any]]:
    """Runs of equal mask: {"train": 0|1, "tokens": n, "text": decoded or None}."""
    out: list[dict[str, Any]] = []
    start = 0
    for t in range(1, len(ids) + 1):
        if t == len(ids) or mask[t] != mask[start]:
            piece = ids[start:t]
            out.append({"train": mask[start], "tokens": len(piece), "text": decode(piece) if decode else None})
            start = t
    return out
