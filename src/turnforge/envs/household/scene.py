"""Procedural household scenes and tasks: seeded, reproducible, split by unseen combinations.

A task is a JSON-serialisable dict (stored in `Task.data`): the receptacles and objects of one room,
each with an ALFRED-style PDDL id, and a goal. Entity names ("countertop 2") are derived from the ids
exactly as ALFWorld's `Demangler` derives them, so a task exported as PDDL reads identically in the
real engine (see `display_names`).

Splits: a (task type, object type, receptacle type) combination belongs either to the held-out set or
not, by a fixed hash. `train` and `valid_seen` draw from the seen combinations (different seeds);
`test` draws only from held-out ones, so no test combination was ever generated for training.
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass
from typing import Any

from turnforge.envs.household.catalog import (
    CAN_CONTAIN,
    LAMP_HOLDERS,
    OBJECTS,
    OPENABLE,
    SCENES,
    TASK_TRANSFORM,
    TASK_TYPES,
    TRANSFORM_APPLIANCE,
)

SPLITS = ("train", "valid_seen", "test")
SPLIT_SIZES = {"train": 6000, "valid_seen": 300, "test": 3000}
HELD_OUT_PERCENT = 25
MOST_TARGETS = 3  # goal objects in a room: 2-3 for "put two", 1-2 otherwise

GOAL_TEMPLATES = {
    "pick_and_place_simple": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    "look_at_obj_in_light": ("look at {obj} under the {toggle}", "examine the {obj} with the {toggle}"),
    "pick_clean_then_place_in_recep": ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
    "pick_heat_then_place_in_recep": ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
    "pick_cool_then_place_in_recep": ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
    "pick_two_obj_and_place": ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
}


@dataclass(frozen=True)
class Knobs:
    """Difficulty knobs of the generator (env options of the same names)."""

    receptacles: float = 1.0  # scales the number of receptacles of each type (0.5 = about half)
    distractors: int = 8  # objects that are not part of the goal
    closed: float = 1.0  # fraction of openable receptacles that start closed (ALFWorld: all)


def pddl_id(type_name: str, k: int) -> str:
    """An ALFRED-style mangled id. Sink and bathtub basins carry ALFRED's `_bar_<Type>Basin` suffix,
    which is how ALFWorld's demangler names them "sinkbasin"/"bathtubbasin"."""
    coords = f"_bar__plus_{k // 100:02d}_dot_{k % 100:02d}_bar__plus_00_dot_90_bar__minus_01_dot_00"
    if type_name.endswith("Basin"):
        return f"{type_name[: -len('Basin')]}{coords}_bar_{type_name}"
    return f"{type_name}{coords}"


def display_names(ids: list[str]) -> dict[str, str]:
    """id -> the name the agent sees, as ALFWorld's Demangler computes it.

    Ids are compared lower-cased (the PDDL parser lower-cases them); each name's numbers are handed
    out from the highest down in sorted id order, hence "a cabinet 2, a cabinet 1" in listings.
    """
    ordered = sorted(i.lower() for i in ids)
    counts: dict[str, int] = {}
    for i in ordered:
        counts[_base_name(i)] = counts.get(_base_name(i), 0) + 1
    out = {}
    for i in ordered:
        base = _base_name(i)
        out[i] = f"{base} {counts[base]}"
        counts[base] -= 1
    return {i: out[i.lower()] for i in ids}


def _base_name(lower_id: str) -> str:
    name = lower_id.split("_bar_", 1)[0]
    return name + "basin" if "basin" in lower_id else name


def is_held_out(task_type: str, obj: str, recep: str) -> bool:
    """Whether a combination belongs to the test split (fixed hash, independent of seeds)."""
    return zlib.crc32(f"{task_type}|{obj}|{recep}".encode()) % 100 < HELD_OUT_PERCENT


def goal_combos(task_type: str, scene: str) -> list[tuple[str, str]]:
    """(object type, receptacle type) pairs a task of this type can ask for in this kind of scene."""
    recs = SCENES[scene]
    if task_type == "look_at_obj_in_light":
        holders = [r for r in LAMP_HOLDERS if r in recs]
        if not holders:
            return []
        objs = {o for r in recs for o in CAN_CONTAIN[r] if OBJECTS[o].pickupable} - {"DeskLamp"}
        return [(o, "DeskLamp") for o in sorted(objs)]
    transform = TASK_TRANSFORM.get(task_type)
    if transform and TRANSFORM_APPLIANCE[transform] not in recs:
        return []
    combos = []
    for r in sorted(recs):
        if transform and r == TRANSFORM_APPLIANCE[transform]:
            continue
        for o in sorted(CAN_CONTAIN[r]):
            if not OBJECTS[o].pickupable or (transform and not _transformable(o, transform)):
                continue
            # The object must also occur somewhere else in the room, to be found and brought over.
            if not any(o in CAN_CONTAIN[r2] for r2 in recs if r2 != r):
                continue
            combos.append((o, r))
    return combos


def _transformable(obj: str, transform: str) -> bool:
    kind = OBJECTS[obj]
    return {"clean": kind.cleanable, "heat": kind.heatable, "cool": kind.coolable}[transform]


def generate_task(split: str, index: int, seed: int = 0, knobs: Knobs = Knobs()) -> dict[str, Any]:
    """The task at `index` of `split`: task types cycle so any prefix of a split covers all six."""
    rng = random.Random(f"household:{seed}:{split}:{index}")
    task_type = TASK_TYPES[index % len(TASK_TYPES)]
    scene, obj, recep = rng.choice(goal_options(task_type, split == "test"))
    return _build_scene(rng, task_type, scene, obj, recep, knobs)


@functools.cache  # a split of 6,000 tasks recomputed these lists once per task (5 s a load)
def goal_options(task_type: str, held_out: bool) -> tuple[tuple[str, str, str], ...]:
    """(scene, object type, receptacle type) choices of a task type, in the test split's combinations or not."""
    return tuple(
        (scene, o, r)
        for scene in sorted(SCENES)
        for o, r in goal_combos(task_type, scene)
        if is_held_out(task_type, o, r) == held_out
    )


def _build_scene(rng: random.Random, task_type: str, scene: str, obj: str, recep: str, knobs: Knobs) -> dict:
    counts = {}
    for rtype, (lo, hi) in SCENES[scene].items():
        counts[rtype] = _scaled_count(rng.randint(lo, hi), lo, hi, knobs)
    if task_type == "look_at_obj_in_light":
        holder = rng.choice([r for r in LAMP_HOLDERS if r in counts])
        counts[holder] = max(1, counts[holder])
    else:
        counts[recep] = max(1, counts[recep])
    avoid = {recep} if task_type in ("pick_and_place_simple", "pick_two_obj_and_place") else set()
    source_types = sorted(t for t in counts if obj in CAN_CONTAIN[t] and t not in avoid)
    if not any(counts[t] for t in source_types):
        counts[rng.choice(source_types)] = 1
    receptacles = _make_receptacles(rng, counts, knobs)
    by_type: dict[str, list[dict]] = {}
    for r in receptacles:
        by_type.setdefault(r["type"], []).append(r)

    placements: list[tuple[str, dict]] = []
    n_targets = {"pick_two_obj_and_place": rng.randint(2, MOST_TARGETS)}.get(task_type, rng.randint(1, 2))
    sources = [r for r in receptacles if obj in CAN_CONTAIN[r["type"]] and r["type"] not in avoid]
    for _ in range(n_targets):
        placements.append((obj, rng.choice(sources)))
    if task_type == "look_at_obj_in_light":
        placements.append(("DeskLamp", rng.choice(by_type[holder])))
    goal_types = {obj, "DeskLamp"}
    for _ in range(knobs.distractors):
        r = rng.choice(receptacles)
        choices = sorted(o for o in CAN_CONTAIN[r["type"]] if o not in goal_types)
        if choices:
            placements.append((rng.choice(choices), r))

    objects = _number_objects(rng, placements)
    template = rng.choice(GOAL_TEMPLATES[task_type])
    goal_text = template.format(obj=obj.lower(), recep=recep.lower(), toggle="desklamp")
    return {
        "scene": scene,
        "task_type": task_type,
        "goal": {
            "object": obj,
            "receptacle": None if task_type == "look_at_obj_in_light" else recep,
            "toggle": "DeskLamp" if task_type == "look_at_obj_in_light" else None,
            "transform": TASK_TRANSFORM.get(task_type),
            "count": 2 if task_type == "pick_two_obj_and_place" else 1,
        },
        "goal_text": goal_text,
        "receptacles": receptacles,
        "objects": objects,
    }


def _scaled_count(n: int, lo: int, hi: int, knobs: Knobs) -> int:
    """A receptacle type's count in a room: its scene's draw `n` scaled by `knobs.receptacles`, kept in [lo, hi]."""
    return max(lo, min(hi, round(n * knobs.receptacles)))


def _loc_numbers(total: int) -> range:
    """The "loc N" numbers (0.3 grammar) a room of `total` receptacles draws from."""
    return range(1, 10 + 2 * total)


def _make_receptacles(rng: random.Random, counts: dict[str, int], knobs: Knobs) -> list[dict]:
    total = sum(counts.values())
    locs = rng.sample(_loc_numbers(total), total)
    receptacles = []
    for rtype in sorted(counts):
        for k in range(1, counts[rtype] + 1):
            openable = rtype in OPENABLE
            receptacles.append({
                "id": pddl_id(rtype, k),
                "type": rtype,
                "loc": locs[len(receptacles)],
                "openable": openable,
                "opened": openable and rng.random() >= knobs.closed,
            })
    return receptacles


def _number_objects(rng: random.Random, placements: list[tuple[str, dict]]) -> list[dict]:
    per_type: dict[str, int] = {}
    objects = []
    order = list(range(len(placements)))
    rng.shuffle(order)  # which instance gets which number is not tied to goal-ness
    for i in order:
        otype, r = placements[i]
        per_type[otype] = per_type.get(otype, 0) + 1
        objects.append({"id": pddl_id(otype, per_type[otype]), "type": otype, "in": r["id"]})
    return sorted(objects, key=lambda o: o["id"])


def entity_names(knobs: Knobs = Knobs()) -> list[str]:
    """Every name a room generated with `knobs` can show: "cabinet 7", "apple 11", "loc 63" (the 0.3 grammar's
    places). Bounds: a receptacle type's most in any scene, an object type's most (the goal's three plus every
    distractor), the highest "loc" number `_make_receptacles` can draw."""
    def count(lo: int, hi: int) -> int:  # at the highest draw; a goal's receptacle is added where the draw gave 0
        return max(1, _scaled_count(hi, lo, hi, knobs))

    most: dict[str, int] = {}
    for recs in SCENES.values():
        for rtype, (lo, hi) in recs.items():
            most[rtype] = max(most.get(rtype, 0), count(lo, hi))
    total = max(sum(count(lo, hi) for lo, hi in recs.values()) for recs in SCENES.values())
    most |= {otype: MOST_TARGETS + knobs.distractors for otype in OBJECTS}
    names = [_base_name(pddl_id(t, k).lower()) + f" {k}" for t, n in most.items() for k in range(1, n + 1)]
    return names + [f"loc {k}" for k in _loc_numbers(total)]


def generate_split(split: str, n: int | None = None, seed: int = 0, knobs: Knobs = Knobs()) -> list[dict]:
    if split not in SPLITS:
        raise ValueError(f"household has no split {split!r}; splits are {', '.join(SPLITS)}")
    n = SPLIT_SIZES[split] if n is None else n
    return [generate_task(split, i, seed, knobs) for i in range(n)]
