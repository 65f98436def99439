"""Data sources: where training records come from, read one way for SFT data and DPO pair data alike.

A source is `hf:NAME[:SPLIT]` (a Hub dataset), a JSON-lines file (read by `turnforge.types.json_records`, the
one JSONL reader), a parquet file, or a dataset folder (`save_to_disk`, or anything `load_dataset` reads).
Every record comes with `where` (FILE:LINE or SOURCE row N), so that an error names the place.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turnforge.types import TRAJECTORY_KEYS, json_records

JSONL_SUFFIXES = (".jsonl", ".json")
DATASET_SUFFIXES = {".parquet": "parquet"}

if TYPE_CHECKING:
    import datasets


def read_records(source: str, what: str = "data") -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, record)` from one data source; `what` names the data in errors ("sft data", ...)."""
    import datasets  # ~0.7 s to import: JSONL sources (collect stages, replay files) do without it

    if source.startswith("hf:"):
        name, _, split = source[3:].partition(":")
        rows = _hub_dataset(name, split or "train", what)
        yield from ((f"{source} row {i}", dict(row)) for i, row in enumerate(rows))
        return
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{what} {source!r} not found: give a JSONL file, a dataset folder or hf:NAME[:SPLIT]")
    if path.is_dir():
        rows = _dataset_folder(path, what)
        yield from ((f"{path} row {i}", dict(row)) for i, row in enumerate(rows))
    elif path.suffix in JSONL_SUFFIXES:
        yield from json_records(path, f"one JSON object a line ({what})")
    elif path.suffix in DATASET_SUFFIXES:
        rows = datasets.load_dataset(DATASET_SUFFIXES[path.suffix], data_files=str(path), split="train")
        yield from ((f"{path} row {i}", dict(row)) for i, row in enumerate(rows))
    else:
        known = ", ".join([*JSONL_SUFFIXES, *DATASET_SUFFIXES])
        raise ValueError(f"{what} {path}: unknown file format {path.suffix!r}; expected one of {known} or a folder")


def _hub_dataset(name: str, split: str, what: str) -> datasets.Dataset:
    """A Hub dataset's split; no network (or HF_HUB_OFFLINE with nothing cached) is one clear error, not a traceback."""
    import datasets

    try:
        return datasets.load_dataset(name, split=split)
    except ConnectionError as e:  # datasets raises the builtin one, offline or unreachable alike
        where = f"{what} hf:{name}: the dataset {name!r} is not in the local Hugging Face cache and"
        if datasets.config.HF_HUB_OFFLINE:
            raise FileNotFoundError(f"{where} HF_HUB_OFFLINE is set, so the Hub is not asked; unset it (with a "
                                    "network) to download it, or give a local JSONL file or dataset folder") from None
        raise FileNotFoundError(f"{where} the Hub is unreachable ({e}); check the network, or give a local JSONL file "
                                "or dataset folder") from None


def holds_trajectories(source: str) -> bool:
    """A JSON-lines file whose first record is a Trajectory (not a pair or a conversation)."""
    if source.startswith("hf:") or not source.endswith(JSONL_SUFFIXES) or not Path(source).is_file():
        return False
    try:
        first = next(json_records(source), None)
    except ValueError:
        return False  # the reader of the data reports the bad line with its place
    return first is not None and first[1].keys() >= TRAJECTORY_KEYS


def _dataset_folder(path: Path, what: str) -> datasets.Dataset:
    """A `save_to_disk` folder (its train split if it holds several), else any folder `load_dataset` reads."""
    import datasets

    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"{what} {path}: a DatasetDict without a 'train' split (splits: {list(loaded)})")
            loaded = loaded["train"]
        return loaded
    return datasets.load_dataset(str(path), split="train")
