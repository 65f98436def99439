"""Hugging Face datasets out of a run, and back into a recipe's data.

    turnforge data export runs/qs/stages/01-collect/trajectories.jsonl --format trl-sft --out sft/
    turnforge data export runs/x/stages/04-dpo/pairs.jsonl --format trl-preference --out pairs/
    turnforge data import pairs/ --schema roundwise-dpo --out pairs.jsonl    # then data = ["pairs.jsonl"]

Schemas (`SCHEMAS`):
  trl-sft         TRL's conversational SFT format: `messages` (+ `tools`), one row per trajectory
  trl-preference  TRL's conversational preference format: `prompt`, `chosen`, `rejected` (+ `tools`, `reason`)
  roundwise-dpo   the seed round-wise DPO schema: `messages`, `chosen`, `rejected`, `reason` (+ provenance)

Export writes a `datasets.Dataset` by the name of `--out`: a folder (`save_to_disk`, ready for `push_to_hub`,
which turnforge never calls), `.parquet` or `.jsonl`. Import reads any of these (or `hf:NAME`) through the one
reader of data sources (`turnforge.data.sources.read_records`; trajectories through `turnforge.types`) and
writes JSONL that an sft stage (trl-sft) or a dpo stage (the pair schemas) takes as `data`.

Arrow needs one type per column, so `tools` is a JSON string (None when none), as in `Pair.to_trl`, and a tool
call's `arguments` are a JSON string (the OpenAI shape, which chat templates and `ToolCall.from_dict` accept).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turnforge.data.dpo_pairs import load_pairs
from turnforge.data.sources import holds_trajectories, read_records
from turnforge.types import Message, trajectory_from_record

SCHEMAS = ("trl-sft", "trl-preference", "roundwise-dpo")


def _message(m: dict[str, Any] | Message) -> dict[str, Any]:
    """One chat message in the Arrow-stable shape: None keys dropped, tool-call arguments as a JSON string."""
    message = m if isinstance(m, Message) else Message.from_dict({k: v for k, v in m.items() if v is not None})
    out = message.to_dict()
    for call in out.get("tool_calls", []):
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False, sort_keys=True)
    return out


def _tools(tools: Any) -> str | None:
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    return json.dumps(tools, ensure_ascii=False) if tools else None


def sft_records(source: str) -> list[dict[str, Any]]:
    """trl-sft rows of a trajectory file or of a conversational dataset (`messages`, `tools`)."""
    trajectories = holds_trajectories(source)
    rows = []
    for where, record in read_records(source, "trl-sft data"):
        if trajectories:
            traj = trajectory_from_record(where, record)
            messages, tools = traj.messages, traj.tools
        elif isinstance(record.get("messages"), list):
            messages, tools = record["messages"], record.get("tools")
        else:
            raise ValueError(f"{where}: neither a trajectory nor a conversation (`messages`); keys {sorted(record)}")
        rows.append({"messages": [_message(m) for m in messages], "tools": _tools(tools)})
    return rows


def pair_records(source: str, schema: str) -> list[dict[str, Any]]:
    """trl-preference or roundwise-dpo rows of a pair file or dataset (either pair schema)."""
    rows = []
    for pair in load_pairs(source):
        pair.messages = [_message(m) for m in pair.messages]
        if schema == "trl-preference":
            rows.append(pair.to_trl() | {"reason": pair.reason})
        else:
            rows.append(pair.to_record() | {"tools": _tools(pair.tools)})
    return rows


def schema_records(source: str | Path, schema: str) -> list[dict[str, Any]]:
    """The rows of `source` (JSONL, parquet, dataset folder or hf:NAME) in `schema`; an error for an unknown one."""
    if schema not in SCHEMAS:
        raise ValueError(f"unknown schema {schema!r}; schemas: {', '.join(SCHEMAS)}")
    source = str(source)
    if not source.startswith("hf:") and not Path(source).exists():
        raise FileNotFoundError(f"{source} not found: give a JSONL or parquet file, a dataset folder or hf:NAME[:SPLIT]")
    return sft_records(source) if schema == "trl-sft" else pair_records(source, schema)


def export_dataset(source: str | Path, schema: str, out: str | Path) -> Path:
    """Write `source`'s rows in `schema` as a Hugging Face dataset: `out` a folder (save_to_disk), .parquet or .jsonl."""
    import datasets  # ~0.7 s to import: only the data commands need it

    rows = schema_records(source, schema)
    if not rows:
        raise ValueError(f"{source} holds no records to export")
    out = Path(out)
    if out.suffix not in ("", ".parquet", ".jsonl"):
        raise ValueError(f"--out {out}: give a folder (save_to_disk), a .parquet or a .jsonl file")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".jsonl":  # written by us, not `to_json`: its rows keep no Arrow None fill
        out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return out
    dataset = datasets.Dataset.from_list(rows)
    if out.suffix == ".parquet":
        dataset.to_parquet(str(out))
    else:
        dataset.save_to_disk(str(out))
    return out


def import_dataset(source: str | Path, schema: str, out: str | Path) -> tuple[Path, int]:
    """Read a dataset in `schema` and write it as JSONL at `out` (a recipe's `data`); returns (out, rows)."""
    rows = schema_records(source, schema)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return out, len(rows)
