"""DPO pairs in files: the seed schema and TRL's conversational preference format, read and written.

A pair is (history, chosen next assistant turn, rejected next assistant turn, reason), the schema of the seed
ALFWorld DPO dataset (kuririrn/alfworld_roundwise_dpo_v1: `messages`, `chosen`, `rejected`, `reason`). `save_pairs`
/ `load_pairs` read and write it and TRL's format (`prompt`, `chosen`, `rejected` as message lists) as JSONL,
parquet, `save_to_disk` folders or `hf:NAME` (read through `turnforge.data.sources`, as SFT data is).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.data.sources import read_records

PAIR_KEYS = ("messages", "chosen", "rejected", "reason")
"""The seed dataset's schema; `tools`, `task_id`, `turn` and `chosen_from` are optional extras."""


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


def pairs_dataset(pairs: list[Pair], schema: str = "seed"):
    """A `datasets.Dataset` of `pairs`: schema "seed" (messages, chosen, rejected, reason, ...) or "trl"."""
    import datasets  # ~0.7 s to import: only writing parquet or a dataset folder needs it

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
    return [pair_from_record(where, record) for where, record in read_records(source, "dpo pair data")]


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
