"""The searching expert: solves household tasks the way an agent that cannot see through walls must.

The oracle planner (`expert.py`) knows where every object is, so its first move ("go to drawer 3")
cannot be inferred from what the agent has seen; a model imitating it can only guess. This expert
acts only on what the episode showed: it searches the receptacles that can hold the object and that
the episode has not looked into since the search began (in the order the room listing names them,
opening closed ones), takes a goal object as soon as one is in view, transforms it at the first
appliance of the right kind, and delivers it to the first receptacle of the goal type. On its own
episodes each decision depends on the goal, the room listing and the last turn or two (its search
goes down the listing), so a model with a short history window can learn it; from a state other
replies reached, it searches on from what they looked into. `--env-opt expert=explorer`.
"""

from __future__ import annotations

from turnforge.envs.household.catalog import CAN_CONTAIN, TRANSFORM_APPLIANCE, TRANSFORM_STATE
from turnforge.envs.household.engine import Receptacle, World


class Explorer:
    """Stateful over one episode: remembers which receptacles the current search has seen (`observe`)."""

    def __init__(self) -> None:
        self.pointer = -1  # index (in the room listing) of the receptacle the search last went to
        self.seen: set[str] = set()  # receptacles whose contents the agent has seen since the search (re)started
        self.placed = 0
        self.lamp_search = False

    def observe(self, w: World) -> None:
        """After every step, whoever chose it: the receptacle the agent stands at counts as searched once its
        contents are in view. So the search goes on from what the episode has seen, also when other replies
        (a model's, between expert-guided turns; a noisy expert's detours) moved the agent, instead of sending it
        back to receptacles it has looked into. On the expert's own episodes this is where its search went."""
        here = w.receptacles.get(w.at) if w.at else None
        if here is not None and not (here.openable and not here.opened):
            self.seen.add(here.name)

    def next_action(self, w: World) -> str:
        g = w.goal
        if w.held and w.objects[w.held].type != g["object"]:  # taken by someone else's mistake: put it back down
            return _deliver(w, w.receptacles[w.at])
        if g["toggle"]:
            return self._look_task(w)
        placed = w.goal_objects_placed()
        if placed != self.placed:  # a delivery restarts the search for the next object
            self.placed = placed
            self._restart()
        held = w.objects[w.held] if w.held else None
        if held is not None:
            transform = g["transform"]
            if transform and not getattr(held, TRANSFORM_STATE[transform]):
                appliance = _first_of_type(w, TRANSFORM_APPLIANCE[transform])
                if w.at != appliance.name:
                    return f"go to {appliance.name}"
                return f"{transform} {held.name} with {appliance.name}"
            return _deliver(w, _first_of_type(w, g["receptacle"]))
        candidate = self._visible(w, g["object"], exclude_ready_in=g["receptacle"])
        if candidate:
            return f"take {candidate} from {w.at}"
        return self._search(w, g["object"], skip_type=g["receptacle"] if not g["transform"] else None)

    def search_note(self, w: World) -> str:
        """Where the search is (`thoughts=search`): the receptacle it last went to search, which decides the next
        `go to` but is otherwise in no text the agent sees; "" when no search is under way."""
        if self.pointer < 0 or (w.held and not w.goal["toggle"]):  # none begun, or carrying the goal object
            return ""
        return f"searching {list(w.receptacles)[self.pointer]}."

    def _look_task(self, w: World) -> str:
        g = w.goal
        if w.held is None:
            candidate = self._visible(w, g["object"])
            if candidate:
                self.lamp_search = False
                return f"take {candidate} from {w.at}"
            return self._search(w, g["object"])
        if not self.lamp_search:  # the lamp search starts over, at the first turn with the object in hand
            self.lamp_search = True
            self._restart()
        lamp = self._visible(w, g["toggle"], need_open=False)
        if lamp:
            return f"use {lamp}"
        return self._search(w, g["toggle"])

    def _visible(self, w: World, otype: str, exclude_ready_in: str | None = None, need_open: bool = True) -> str | None:
        """A goal-type object in view at the receptacle the agent stands at (first in listing order)."""
        here = w.receptacles.get(w.at) if w.at else None
        if here is None or (need_open and here.openable and not here.opened):
            return None
        for name in here.contents:
            obj = w.objects[name]
            if obj.type == otype and not (here.type == exclude_ready_in and w._goal_ready(obj)):
                return name
        return None

    def _restart(self) -> None:
        self.pointer = -1
        self.seen.clear()

    def _search(self, w: World, otype: str, skip_type: str | None = None) -> str:
        """Open the receptacle we stand at if it is closed and one to search, else go to the first (in listing
        order) that can hold `otype` and whose contents the search has not seen."""
        def unseen(rec: Receptacle) -> bool:
            return rec.name not in self.seen and otype in CAN_CONTAIN[rec.type] and rec.type != skip_type

        listing = list(w.receptacles)
        here = w.receptacles.get(w.at) if w.at else None
        if here is not None and unseen(here) and here.openable and not here.opened:
            self.pointer = listing.index(here.name)
            return f"open {here.name}"
        for i, rec in enumerate(w.receptacles.values()):
            if not unseen(rec):
                continue
            self.pointer = i
            if rec is here:  # open, its contents in view: searched now, in its turn of the listing
                self.seen.add(rec.name)
                continue
            return f"go to {rec.name}"
        self._restart()  # searched everything (only after objects moved): start over
        return "look"


def goal_thought(goal: dict) -> str:
    """The goal restated in one canonical line (the `thoughts=goal` expert writes it before every action).

    The task sentence comes in several phrasings ("put a hot egg in countertop", "heat some egg and put it in
    countertop"); restated the same way each turn, the goal sits a few dozen tokens before each decision
    instead of at the start of the episode, where a small model must look it up across the whole history.
    """
    obj = goal["object"].lower()
    if goal["toggle"]:
        return f"examine the {obj} with the {goal['toggle'].lower()}."
    what = f"two {obj}" if goal["count"] == 2 else f"a {obj}"
    rec = goal["receptacle"].lower()
    if goal["transform"]:
        return f"{goal['transform']} {what}, then put it in {rec}."
    return f"put {what} in {rec}."


def _first_of_type(w: World, rtype: str) -> Receptacle:
    return next(r for r in w.receptacles.values() if r.type == rtype)


def _deliver(w: World, target: Receptacle) -> str:
    if w.at != target.name:
        return f"go to {target.name}"
    if target.openable and not target.opened:
        return f"open {target.name}"
    verb = "put {} in/on {}" if w.grammar == "0.3" else "move {} to {}"
    return verb.format(w.held, target.name)
