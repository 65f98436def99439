"""Per-episode DBs over one shared, parsed base: copy-on-access records, and DB comparison by touched records.

tau2 gives every simulation a freshly loaded DB and grades it by hashing the whole of it
(`sha256(json.dumps(db.model_dump(), sort_keys=True, default=str))`), once for the agent's replayed DB and
once for the gold one. Done naively that is, per episode, a 7 MB parse or deep copy plus two full dumps and
hashes of the airline DB (benchmarks/service_env.py measures it). Here:

- the base DB is parsed once per process (`SharedDB`) and never written;
- an episode sees it through `EpisodeDB`: each top-level dict collection (orders, users, flights, ...) is a
  `RecordOverlay` that deep-copies a record the first time it is fetched *by key* and keeps that copy for
  the episode, and so is the `data` dict of a top-level table model (banking_knowledge's `{data, notes}`
  tables, seen through a `TableView`); other top-level fields are deep-copied at reset (small). Iterating a collection yields the
  episode's copy where there is one, else the shared record, so tools must change only records they
  fetched by key (every tau2 retail / airline tool does; `test_service_db.py` checks the base stays intact);
- two episode DBs built on the same base are equal exactly when tau2's hashes are: their canonical JSON
  (sort_keys) is equal iff every collection has the same keys and every record the same canonical JSON, and
  only records that either side touched can differ. `same_state` compares just those records;
  `tau2_hash` computes tau2's full hash when wanted (tests, benchmark).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

from pydantic import BaseModel

_MISSING = object()


def canonical_json(value: Any) -> str:
    """tau2's hashing text: `json.dumps(model_dump(), sort_keys=True, default=str)`."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return json.dumps(value, sort_keys=True, default=str)


class SharedDB:
    """A domain's parsed DB, shared read-only by every episode of the process; caches records' JSON."""

    def __init__(self, db: BaseModel):
        self.model = db
        self.collections: dict[str, dict] = {}
        self.tables: dict[str, BaseModel] = {}  # name -> a table model whose `data` dict is the collection
        for name in type(db).model_fields:
            value = getattr(db, name)
            if isinstance(value, dict):
                self.collections[name] = value
            elif isinstance(value, BaseModel) and isinstance(getattr(value, "data", None), dict):
                self.collections[name], self.tables[name] = value.data, value
        self.others = [name for name in type(db).model_fields if name not in self.collections]
        self._json: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def record_json(self, collection: str, key: str) -> str | None:
        """Canonical JSON of a base record (None when the base has no such key), computed once."""
        cache_key = (collection, key)
        text = self._json.get(cache_key)
        if text is None:
            record = self.collections[collection].get(key, _MISSING)
            if record is _MISSING:
                return None
            text = canonical_json(record)
            with self._lock:
                self._json[cache_key] = text
        return text


class RecordOverlay(MutableMapping):
    """One collection as an episode sees it: the shared records plus this episode's copies and deletions."""

    def __init__(self, base: dict[str, Any]):
        self.base = base
        self.copies: dict[str, Any] = {}
        self.deleted: set[str] = set()
        self.added_order: list[str] = []  # keys not in the base, in insertion order (dict order for iteration)

    def __getitem__(self, key: str) -> Any:
        if key in self.copies:
            return self.copies[key]
        if key in self.deleted or key not in self.base:
            raise KeyError(key)
        record = self.copies[key] = _deep_copy(self.base[key])
        return record

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.base and key not in self.copies:
            self.added_order.append(key)
        self.deleted.discard(key)
        self.copies[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self.copies.pop(key, None)
        if key in self.added_order:
            self.added_order.remove(key)
        if key in self.base:
            self.deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key in self.copies or (key in self.base and key not in self.deleted)

    def __iter__(self) -> Iterator[str]:
        for key in self.base:
            if key not in self.deleted:
                yield key
        yield from self.added_order

    def __len__(self) -> int:
        return len(self.base) - len(self.deleted) + len(self.added_order)

    def peek(self, key: str) -> Any:
        """The record without copying it (read-only use: iteration, hashing)."""
        return self.copies[key] if key in self.copies else self.base[key]

    def values(self):  # type: ignore[override]
        return [self.peek(k) for k in self]

    def items(self):  # type: ignore[override]
        return [(k, self.peek(k)) for k in self]

    def touched(self) -> set[str]:
        return set(self.copies) | self.deleted


def _deep_copy(record: Any) -> Any:
    if isinstance(record, BaseModel):
        return record.model_copy(deep=True)
    return copy.deepcopy(record)


class TableView:
    """A table model as an episode sees it: `data` is the episode's overlay, its other fields the shared model's
    (read-only: no tool changes a table's notes)."""

    def __init__(self, overlay: RecordOverlay, table: BaseModel):
        self.data, self._table = overlay, table

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)


class EpisodeDB:
    """An episode's DB: attribute access like the pydantic DB (`db.orders[...]`), writes kept to itself."""

    def __init__(self, shared: SharedDB):
        overlays = {n: RecordOverlay(c) for n, c in shared.collections.items()}
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_overlays", overlays)
        object.__setattr__(self, "_views", {n: TableView(overlays[n], t) for n, t in shared.tables.items()})
        object.__setattr__(self, "_others", {n: copy.deepcopy(getattr(shared.model, n)) for n in shared.others})

    def __getattr__(self, name: str) -> Any:
        views = object.__getattribute__(self, "_views")
        if name in views:
            return views[name]
        overlays = object.__getattribute__(self, "_overlays")
        if name in overlays:
            return overlays[name]
        others = object.__getattribute__(self, "_others")
        if name in others:
            return others[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._overlays:
            raise AttributeError(f"replace records of {name!r}, not the whole collection")
        self._others[name] = value

    @property
    def shared(self) -> SharedDB:
        return self._shared

    def touched(self) -> dict[str, set[str]]:
        """Collection -> keys this episode copied, added or deleted."""
        return {n: o.touched() for n, o in self._overlays.items() if o.touched()}

    def record_json(self, collection: str, key: str) -> str | None:
        overlay = self._overlays[collection]
        if key in overlay.copies:
            return canonical_json(overlay.copies[key])
        if key in overlay.deleted:
            return None
        return self._shared.record_json(collection, key)

    def same_state(self, other: EpisodeDB, keys: dict[str, set[str]] | None = None) -> bool:
        """Whether the two DBs (same base) hash alike in tau2's sense; `keys` limits the records compared."""
        if self._shared is not other._shared:
            raise ValueError("compare episode DBs built on the same shared DB")
        for name in self._others:
            if keys is None and canonical_json(self._others[name]) != canonical_json(other._others[name]):
                return False
        if keys is None:
            keys = {}
            for name in self._overlays:
                keys[name] = self._overlays[name].touched() | other._overlays[name].touched()
        for name, names in keys.items():
            for key in names:
                if self.record_json(name, key) != other.record_json(name, key):
                    return False
        return True

    def to_dict(self) -> dict[str, Any]:
        """The whole DB as tau2's `model_dump()` would give it (materialises every record)."""
        out: dict[str, Any] = {}
        for name in type(self._shared.model).model_fields:
            if name in self._shared.tables:
                table = self._shared.tables[name]
                out[name] = {**table.model_dump(exclude={"data"}),
                             "data": {k: _dump(v) for k, v in self._overlays[name].items()}}
            elif name in self._overlays:
                out[name] = {k: _dump(v) for k, v in self._overlays[name].items()}
            else:
                out[name] = _dump(self._others[name])
        return out

    def tau2_hash(self) -> str:
        """tau2's `get_db_hash()` of this DB: sha256 of the canonical JSON of the whole DB."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()


def _dump(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value
