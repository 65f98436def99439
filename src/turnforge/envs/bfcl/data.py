"""BFCL multi-turn data from the installed `bfcl-eval` wheel: entries, ground truth, function docs, splits.

The wheel ships everything (shared/benchmarks.md §1): `bfcl_eval/data/BFCL_v{3,4}_multi_turn_<cat>.json`
(entries), `possible_answer/` (ground truth) and `multi_turn_func_doc/<class file>.json` (function docs),
all JSON Lines. Releases up to 2025.8.5 name the files `BFCL_v3_*`, later ones `BFCL_v4_*`, and the content
differs between releases, so the version is pinned (`PINNED_VERSION`) and checked against what is
installed: only one `bfcl-eval` can be installed at a time, so asking for another version is a clear error.

Splits: `test` is BFCL's whole evaluation set (200 entries per category); `train` / `heldout` are the
Environment Tuning protocol's halves: per category, the entries are shuffled with `split_seed` and the
first half is `train`, the other half `heldout` (disjoint, together the whole category).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PINNED_VERSION = "2025.6.8"
CATEGORIES = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
SPLITS = ("test", "train", "heldout")

# bfcl_eval.constants.category_mapping.MULTI_TURN_FUNC_DOC_FILE_MAPPING, restated so that loading data
# does not import bfcl_eval.constants (its eval_config creates result/ and score/ folders on import).
FUNC_DOC_FILES = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

INSTALL_HINT = "pip install --no-deps bfcl-eval=={v} mpmath  (or: pip install 'turnforge[bfcl]')"


class BfclUnavailable(RuntimeError):
    """bfcl-eval is not installed, or not the version asked for."""


@dataclass(frozen=True)
class BfclData:
    """Where the installed wheel's data lives and which version it is."""

    version: str
    root: Path
    prefix: str  # "BFCL_v3" or "BFCL_v4": the file-name generation of this release

    def entries_file(self, category: str) -> Path:
        return self.root / f"{self.prefix}_{category}.json"

    def answers_file(self, category: str) -> Path:
        return self.root / "possible_answer" / f"{self.prefix}_{category}.json"


def installed_version() -> str | None:
    """The installed bfcl-eval version, or None."""
    try:
        return importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def locate(version: str = PINNED_VERSION) -> BfclData:
    """The installed wheel's data folder; `version` is a release ("2025.6.8") or "installed" (any)."""
    found = installed_version()
    if found is None:
        raise BfclUnavailable(
            f"the bfcl env needs the bfcl-eval package, which is not installed; {INSTALL_HINT.format(v=PINNED_VERSION)}"
        )
    if version not in ("installed", found):
        raise BfclUnavailable(
            f"bfcl env option version={version!r} asked for bfcl-eval {version}, but {found} is installed "
            f"(only one can be installed at a time). Install it with: {INSTALL_HINT.format(v=version)}; "
            "or pass version=installed to use the installed data"
        )
    import bfcl_eval  # only after the version check: the error above is the useful one

    root = Path(bfcl_eval.__file__).parent / "data"
    for prefix in ("BFCL_v3", "BFCL_v4"):
        if (root / f"{prefix}_multi_turn_base.json").is_file():
            return BfclData(version=found, root=root, prefix=prefix)
    raise BfclUnavailable(f"bfcl-eval {found} at {root} has no BFCL_v3/v4_multi_turn_base.json data file")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON Lines file; a bad line is an error naming the file and line."""
    if not path.is_file():
        raise BfclUnavailable(f"missing data file {path}; reinstall bfcl-eval")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise BfclUnavailable(f"{path}:{lineno}: not JSON ({e.msg})") from None
    return rows


@functools.cache
def load_category(category: str, version: str = PINNED_VERSION) -> tuple[dict[str, Any], ...]:
    """Every entry of a category, each with its `ground_truth` merged in, in BFCL's id order."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}; choose one of {', '.join(CATEGORIES)} or all")
    data = locate(version)
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(data.answers_file(category))}
    entries = []
    for entry in _read_jsonl(data.entries_file(category)):
        if entry["id"] not in answers:
            raise BfclUnavailable(f"{data.answers_file(category)} has no ground truth for {entry['id']}")
        if len(answers[entry["id"]]) != len(entry["question"]):
            raise BfclUnavailable(f"{entry['id']}: {len(entry['question'])} turns but {len(answers[entry['id']])} answers")
        entries.append({**entry, "ground_truth": answers[entry["id"]]})
    return tuple(entries)


@functools.cache
def function_docs(class_name: str, version: str = PINNED_VERSION) -> tuple[dict[str, Any], ...]:
    """The function docs of one executable class, as BFCL ships them (treat as read-only)."""
    if class_name not in FUNC_DOC_FILES:
        raise ValueError(f"unknown BFCL class {class_name!r}")
    return tuple(_read_jsonl(locate(version).root / "multi_turn_func_doc" / FUNC_DOC_FILES[class_name]))


def split_ids(entries: list[dict[str, Any]] | tuple[dict[str, Any], ...], split: str, seed: int) -> set[str]:
    """Ids of `split` among one category's entries (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    ids = [e["id"] for e in entries]
    if split == "test":
        return set(ids)
    shuffled = sorted(ids)
    random.Random(f"bfcl-split/{seed}").shuffle(shuffled)
    half = len(shuffled) // 2
    return set(shuffled[:half] if split == "train" else shuffled[half:])
