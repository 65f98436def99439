"""The household world: state, ALFWorld's command grammar, its feedback strings, goals and progress.

Every rule mirrors ALFWorld's PDDL domain (`alfworld/data/alfred.pddl`) and its text grammar
(`alfred.twl2`) as the TextWorld engine applies them: a command runs only if it is exactly one of
the admissible commands of the state (after stripping outer spaces; case matters), otherwise
"Nothing happens.". `check(command)` is the one place that decides validity; `admissible()` lists
the candidates that pass it, and hints reuse the reason it gives for failing.

Written by hand rather than driving TextWorld because TextWorld replans and re-grounds PDDL each
step (~10 steps/s); this engine is a few microseconds per step with the same transcripts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from turnforge.envs.household.catalog import (
    CAN_CONTAIN,
    OBJECTS,
    TRANSFORM_APPLIANCE,
    TRANSFORM_STATE,
    ObjectKind,
)
from turnforge.envs.household.scene import display_names

NOTHING = "Nothing happens."
GRAMMARS = ("0.3", "0.4")
# TextWorld's help text, stripped of its outer newlines as every observation is (normalize_observation).
HELP_TEXT = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object"
)

_PATTERNS = [
    ("goto", re.compile(r"go to (.+)")),
    ("open", re.compile(r"open (.+)")),
    ("close", re.compile(r"close (.+)")),
    ("take", re.compile(r"take (.+) from (.+)")),
    ("move", re.compile(r"move (.+) to (.+)")),
    ("put", re.compile(r"put (.+) in/on (.+)")),
    ("heat", re.compile(r"heat (.+) with (.+)")),
    ("cool", re.compile(r"cool (.+) with (.+)")),
    ("clean", re.compile(r"clean (.+) with (.+)")),
    ("slice", re.compile(r"slice (.+) with (.+)")),
    ("use", re.compile(r"use (.+)")),
    ("examine", re.compile(r"examine (.+)")),
]


@dataclass
class Receptacle:
    id: str
    name: str
    type: str
    loc: int
    openable: bool
    opened: bool
    contents: list[str] = field(default_factory=list)  # object names, kept sorted by id


@dataclass
class Obj:
    id: str
    name: str
    type: str
    kind: ObjectKind
    parent: str | None  # receptacle name; None while held
    hot: bool = False
    cool: bool = False
    clean: bool = False
    sliced: bool = False
    toggled: bool = False


@dataclass
class Check:
    """The outcome of validating a command: `ok` with what to do, or the reason it fails (for hints)."""

    ok: bool
    verb: str = ""
    args: tuple[str, ...] = ()
    reason: str = ""


class World:
    """One household episode's state. Build from a task dict (`scene.generate_task`)."""

    def __init__(self, data: dict, grammar: str = "0.4"):
        if grammar not in GRAMMARS:
            raise ValueError(f"grammar must be one of {GRAMMARS}, got {grammar!r}")
        self.grammar = grammar
        self.goal = data["goal"]
        self.goal_text = data["goal_text"]
        names = display_names([r["id"] for r in data["receptacles"]] + [o["id"] for o in data["objects"]])
        self.receptacles: dict[str, Receptacle] = {}
        for r in sorted(data["receptacles"], key=lambda r: r["id"].lower()):
            name = names[r["id"]]
            self.receptacles[name] = Receptacle(r["id"].lower(), name, r["type"], r["loc"], r["openable"], r["opened"])
        rec_by_id = {r.id: r for r in self.receptacles.values()}
        self.objects: dict[str, Obj] = {}
        for o in sorted(data["objects"], key=lambda o: o["id"].lower()):
            parent = rec_by_id[o["in"].lower()]
            obj = Obj(o["id"].lower(), names[o["id"]], o["type"], OBJECTS[o["type"]], parent.name)
            self.objects[obj.name] = obj
            parent.contents.append(obj.name)
        self.at: str | None = None  # None: the middle of the room, where every episode starts
        self.held: str | None = None

    # ---- text ----------------------------------------------------------------------------------------

    def intro(self) -> str:
        """The first observation, without TextWorld's "-= Welcome to TextWorld, ALFRED! =-" banner."""
        listing = _listing([f"a {name}" for name in self.receptacles])
        return (
            f"You are in the middle of a room. Looking quickly around you, you see {listing}.\n\n"
            f"Your task is to: {self.goal_text}."
        )

    def view(self, rec: Receptacle) -> str:
        items = _listing([f"a {name}" for name in rec.contents])
        if rec.openable and rec.opened:
            return f"The {rec.name} is open. In it, you see {items}."
        if rec.openable:
            return f"The {rec.name} is closed."
        return f"On the {rec.name}, you see {items}."

    # ---- validity ------------------------------------------------------------------------------------

    def check(self, command: str) -> Check:
        """Whether `command` is admissible now, and why not when it is not."""
        cmd = command.strip()
        if cmd in ("look", "inventory") or (cmd == "help" and self.grammar == "0.4"):
            return Check(True, cmd)
        for verb, pattern in _PATTERNS:
            m = pattern.fullmatch(cmd)
            if m:
                if verb in ("put", "move") and (verb == "put") != (self.grammar == "0.3"):
                    form = "move X to Y" if self.grammar == "0.4" else "put X in/on Y"
                    return Check(False, reason=f'To place an object, say "{form}".')
                return getattr(self, f"_check_{verb}")(*m.groups())
        return Check(False, reason="Unknown command. " + _COMMANDS_HINT[self.grammar])

    def _here(self, rname: str) -> Check | None:
        if rname not in self.receptacles:
            return Check(False, reason=f"There is no {rname} here. {self._receptacle_hint()}")
        if self.at != rname:
            return Check(False, reason=f"You are not at the {rname}. Go to it first.")
        return None

    def _accessible(self, rec: Receptacle) -> Check | None:
        if rec.openable and not rec.opened:
            return Check(False, reason=f"The {rec.name} is closed; open it first.")
        return None

    def _holding(self, oname: str) -> Check | None:
        if self.held != oname:
            now = f"You are carrying the {self.held}." if self.held else "You are not carrying anything."
            return Check(False, reason=f"You are not holding the {oname}. {now}")
        return None

    def _check_goto(self, rname: str) -> Check:
        if rname not in self.receptacles:
            return Check(False, reason=f"There is no {rname} here. {self._receptacle_hint()}")
        if self.at == rname:
            return Check(False, reason=f"You are already at the {rname}.")
        return Check(True, "goto", (rname,))

    def _check_open(self, rname: str, opening: bool = True) -> Check:
        fail = self._here(rname)
        if fail:
            return fail
        rec = self.receptacles[rname]
        if not rec.openable:
            return Check(False, reason=f"The {rname} cannot be opened or closed.")
        if rec.opened == opening:
            return Check(False, reason=f"The {rname} is already {'open' if opening else 'closed'}.")
        return Check(True, "open" if opening else "close", (rname,))

    def _check_close(self, rname: str) -> Check:
        return self._check_open(rname, opening=False)

    def _check_take(self, oname: str, rname: str) -> Check:
        fail = self._here(rname)
        if fail:
            return fail
        fail = self._accessible(self.receptacles[rname])
        if fail:
            return fail
        obj = self.objects.get(oname)
        if obj is None or obj.parent != rname:
            return Check(False, reason=f"There is no {oname} in the {rname}.")
        if not obj.kind.pickupable:
            return Check(False, reason=f"The {oname} cannot be picked up.")
        if self.held is not None:
            return Check(False, reason=f"You are already carrying the {self.held}; put it somewhere first.")
        return Check(True, "take", (oname, rname))

    def _check_move(self, oname: str, rname: str) -> Check:
        fail = self._holding(oname) or self._here(rname)
        if fail:
            return fail
        rec = self.receptacles[rname]
        fail = self._accessible(rec)
        if fail:
            return fail
        if self.objects[oname].type not in CAN_CONTAIN[rec.type]:
            return Check(False, reason=f"The {oname} cannot go in the {rname}.")
        return Check(True, "move", (oname, rname))

    _check_put = _check_move

    def _check_transform(self, verb: str, oname: str, rname: str) -> Check:
        fail = self._holding(oname)
        if fail:
            return fail
        appliance = TRANSFORM_APPLIANCE[verb]
        rec = self.receptacles.get(rname)
        if rec is None or rec.type != appliance:
            return Check(False, reason=f"You can only {verb} things with a {appliance.lower()}.")
        fail = self._here(rname)
        if fail:
            return fail
        if not getattr(self.objects[oname].kind, {"heat": "heatable", "cool": "coolable", "clean": "cleanable"}[verb]):
            return Check(False, reason=f"The {oname} cannot be {verb}ed." if verb != "clean" else f"The {oname} cannot be cleaned.")
        return Check(True, verb, (oname, rname))

    def _check_heat(self, oname: str, rname: str) -> Check:
        return self._check_transform("heat", oname, rname)

    def _check_cool(self, oname: str, rname: str) -> Check:
        return self._check_transform("cool", oname, rname)

    def _check_clean(self, oname: str, rname: str) -> Check:
        return self._check_transform("clean", oname, rname)

    def _check_slice(self, oname: str, kname: str) -> Check:
        fail = self._holding(kname)
        if fail:
            return fail
        if self.objects[kname].type not in ("Knife", "ButterKnife"):
            return Check(False, reason=f"The {kname} is not sharp; slice with a knife.")
        obj = self.objects.get(oname)
        if obj is None or obj.parent is None or obj.parent != self.at:
            return Check(False, reason=f"There is no {oname} here.")
        if not obj.kind.sliceable:
            return Check(False, reason=f"The {oname} cannot be sliced.")
        return Check(True, "slice", (oname, kname))

    def _check_use(self, oname: str) -> Check:
        obj = self.objects.get(oname)
        if obj is None or obj.parent is None or obj.parent != self.at:
            return Check(False, reason=f"There is no {oname} here.")
        if not obj.kind.toggleable:
            return Check(False, reason=f"The {oname} cannot be used.")
        return Check(True, "use", (oname,))

    def _check_examine(self, name: str) -> Check:
        if name in self.receptacles:
            fail = self._here(name)
            return fail or Check(True, "examine_receptacle", (name,))
        if self.held == name:
            return Check(True, "examine_object", (name,))
        return Check(False, reason=f"You can only examine what you carry or the receptacle you are at; not the {name}.")

    def admissible(self) -> list[str]:
        """Every command valid now, sorted (as TextWorld lists them)."""
        return sorted(c for c in self._candidates() if self.check(c).ok)

    def near_misses(self) -> list[str]:
        """Commands that look valid here and fail ("Nothing happens."), sorted: the verbs of this place with the
        wrong object or appliance (`heat apple 1 with fridge 1`), and valid commands with a number one off
        (`take mug 2` where mug 1 is, `go to cabinet 4` in a room of three): the slips a model makes."""
        candidates = self._candidates()
        valid = {c for c in candidates if self.check(c).ok}
        shifted = {
            command[: m.start()] + str(n) + command[m.end() :]
            for command in valid
            for m in re.finditer(r"\b(\d+)\b", command)
            for n in (int(m.group(1)) - 1, int(m.group(1)) + 1)
            if n >= 1
        }
        return sorted((candidates - valid) | {c for c in shifted if not self.check(c).ok})

    def _candidates(self) -> set[str]:
        """The commands a player could type here: those `admissible` keeps, and some that fail."""
        here = self.receptacles.get(self.at) if self.at else None
        cands = ["look", "inventory"] + (["help"] if self.grammar == "0.4" else [])
        cands += [f"go to {r}" for r in self.receptacles]
        if here:
            cands += [f"open {here.name}", f"close {here.name}", f"examine {here.name}"]
            cands += [f"take {o} from {here.name}" for o in here.contents]
            cands += [f"use {o}" for o in here.contents]
            if self.held:
                place = "put {} in/on {}" if self.grammar == "0.3" else "move {} to {}"
                cands.append(place.format(self.held, here.name))
                cands += [f"{v} {self.held} with {here.name}" for v in ("heat", "cool", "clean")]
                cands += [f"slice {o} with {self.held}" for o in here.contents]
        if self.held:
            cands.append(f"examine {self.held}")
        return set(cands)

    # ---- effects -------------------------------------------------------------------------------------

    def step(self, command: str) -> tuple[str, Check]:
        """Apply `command`; return ALFWorld's feedback and the validity check."""
        chk = self.check(command)
        if not chk.ok:
            return NOTHING, chk
        return getattr(self, f"_do_{chk.verb}")(*chk.args), chk

    def _do_look(self) -> str:
        if self.at is None:
            return "You are in the middle of a room. Looking quickly around you, you see nothing."
        return f"You are facing the {self.at}. Next to it, you see nothing."

    def _do_inventory(self) -> str:
        return f"You are carrying: a {self.held}." if self.held else "You are not carrying anything."

    def _do_help(self) -> str:
        return HELP_TEXT

    def _do_goto(self, rname: str) -> str:
        self.at = rname
        rec = self.receptacles[rname]
        where = rname if self.grammar == "0.4" else f"loc {rec.loc}"
        return f"You arrive at {where}. {self.view(rec)}"

    def _do_open(self, rname: str) -> str:
        rec = self.receptacles[rname]
        rec.opened = True
        return f"You open the {rname}. {self.view(rec)}"

    def _do_close(self, rname: str) -> str:
        self.receptacles[rname].opened = False
        return f"You close the {rname}."

    def _do_take(self, oname: str, rname: str) -> str:
        self.receptacles[rname].contents.remove(oname)
        self.objects[oname].parent = None
        self.held = oname
        return f"You pick up the {oname} from the {rname}."

    def _do_move(self, oname: str, rname: str) -> str:
        rec = self.receptacles[rname]
        rec.contents.append(oname)
        rec.contents.sort(key=lambda n: self.objects[n].id)
        self.objects[oname].parent = rname
        self.held = None
        if self.grammar == "0.3":
            return f"You put the {oname} in/on the {rname}."
        return f"You move the {oname} to the {rname}."

    _do_put = _do_move

    def _do_heat(self, oname: str, rname: str) -> str:
        obj = self.objects[oname]
        obj.hot, obj.cool = True, False
        return f"You heat the {oname} using the {rname}."

    def _do_cool(self, oname: str, rname: str) -> str:
        obj = self.objects[oname]
        obj.cool, obj.hot = True, False
        return f"You cool the {oname} using the {rname}."

    def _do_clean(self, oname: str, rname: str) -> str:
        self.objects[oname].clean = True
        return f"You clean the {oname} using the {rname}."

    def _do_slice(self, oname: str, kname: str) -> str:
        self.objects[oname].sliced = True
        return f"You sliced the {oname} with the {kname}."

    def _do_use(self, oname: str) -> str:
        self.objects[oname].toggled = True  # ALFWorld's isToggled never resets, so it always "turns on"
        return f"You turn on the {oname}."

    def _do_examine_receptacle(self, rname: str) -> str:
        return self.view(self.receptacles[rname])

    def _do_examine_object(self, oname: str) -> str:
        return describe_object(self.objects[oname])

    # ---- goal ----------------------------------------------------------------------------------------

    def goal_objects_placed(self) -> int:
        """How many goal-satisfying objects the best single receptacle of the goal type holds."""
        g = self.goal
        best = 0
        for rec in self.receptacles.values():
            if rec.type == g["receptacle"]:
                best = max(best, sum(1 for n in rec.contents if self._goal_ready(self.objects[n])))
        return best

    def _goal_ready(self, obj: Obj) -> bool:
        g = self.goal
        return obj.type == g["object"] and (g["transform"] is None or getattr(obj, TRANSFORM_STATE[g["transform"]]))

    def lamp_on_here(self) -> bool:
        here = self.receptacles.get(self.at) if self.at else None
        return bool(here) and any(
            self.objects[n].type == self.goal["toggle"] and self.objects[n].toggled for n in here.contents
        )

    def goal_reached(self) -> bool:
        if self.goal["toggle"]:
            return self.held is not None and self.objects[self.held].type == self.goal["object"] and self.lamp_on_here()
        return self.goal_objects_placed() >= self.goal["count"]

    def _receptacle_hint(self) -> str:
        return "Receptacles: " + ", ".join(self.receptacles) + "."


_COMMANDS_HINT = {
    "0.4": "Commands: go to X, open X, close X, take X from Y, move X to Y, heat/cool/clean X with Y, "
    "use X, examine X, inventory, look, help.",
    "0.3": "Commands: go to X, open X, close X, take X from Y, put X in/on Y, heat/cool/clean X with Y, "
    "use X, examine X, inventory, look.",
}


def describe_object(obj: Obj) -> str:
    """ALFWorld's examineObject feedback: the first matching rule of alfred.twl2, in its order."""
    n = obj.name
    if obj.kind.receptacle_object:
        return f"This is a normal {n}. In it, you see nothing."
    rules = [
        (obj.clean and obj.hot and obj.sliced, f"This is a hot and clean sliced {n}."),
        (obj.clean and obj.cool and obj.sliced, f"This is a cool and clean sliced {n}."),
        (obj.clean and obj.sliced, f"This is a clean sliced {n}."),
        (obj.hot and obj.sliced, f"This is a hot sliced {n}."),
        (obj.cool and obj.sliced, f"This is a cool sliced {n}."),
        (obj.clean and obj.hot, f"This is a hot and clean {n}."),
        (obj.clean and obj.cool, f"This is a cool and clean {n}."),
        (obj.hot, f"This is a hot {n}."),
        (obj.clean, f"This is a clean {n}."),
        (obj.cool, f"This is a cold {n}."),
        (obj.kind.toggleable and obj.toggled, f"This {n} is on."),
        (obj.kind.toggleable, f"This {n} is off."),
        (obj.kind.sliceable and obj.sliced, f"This is a sliced {n}."),
    ]
    return next((text for cond, text in rules if cond), f"There's nothing special about {n}.")


def _listing(items: list[str]) -> str:
    """TextWorld's list rendering: "nothing", "a x", "a x, and a y", "a x, a y, and a z"."""
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]
