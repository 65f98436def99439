"""The household expert: a planner with full knowledge of the scene that finds a near-shortest plan.

It enumerates the few real choices (which goal receptacle, which object instances, in which order,
which lamp) and, for each, writes the plan by stepping a copy of the world through the real engine,
so every planned command is admissible by construction; the shortest plan wins. It plans from any
state (a half-done episode, an object in the wrong hand), which is what DAgger-style relabelling and
DPO mining need.
"""

from __future__ import annotations

import copy
from itertools import permutations

from turnforge.envs.household.catalog import CAN_CONTAIN, TRANSFORM_APPLIANCE, TRANSFORM_STATE
from turnforge.envs.household.engine import World


class PlanError(RuntimeError):
    """The planner found no plan (a generator bug: every generated task must be solvable)."""


def expert_plan(world: World) -> list[str]:
    """The shortest plan found from the current state to the goal ([] when the goal already holds)."""
    if world.goal_reached():
        return []
    plans = _look_plans(world) if world.goal["toggle"] else _delivery_plans(world)
    plans = [p for p in plans if p is not None]
    if not plans:
        raise PlanError(f"no plan reaches the goal {world.goal_text!r}")
    return min(plans, key=len)


class _Sim:
    """A copy of the world that records the commands applied to it."""

    def __init__(self, world: World):
        self.w = copy.deepcopy(world)
        self.plan: list[str] = []

    def do(self, command: str) -> None:
        _, chk = self.w.step(command)
        if not chk.ok:
            raise PlanError(f"planned command {command!r} is not admissible: {chk.reason}")
        self.plan.append(command)

    def go(self, rname: str) -> None:
        if self.w.at != rname:
            self.do(f"go to {rname}")

    def reach_inside(self, rname: str) -> None:
        self.go(rname)
        rec = self.w.receptacles[rname]
        if rec.openable and not rec.opened:
            self.do(f"open {rname}")

    def take(self, oname: str) -> None:
        if self.w.held == oname:
            return
        self.drop_held()
        self.reach_inside(self.w.objects[oname].parent)
        self.do(f"take {oname} from {self.w.objects[oname].parent}")

    def put(self, rname: str) -> None:
        self.reach_inside(rname)
        verb = "put {} in/on {}" if self.w.grammar == "0.3" else "move {} to {}"
        self.do(verb.format(self.w.held, rname))

    def drop_held(self) -> None:
        """Put down whatever is held: here if it fits, else in the first receptacle that takes it."""
        if self.w.held is None:
            return
        otype = self.w.objects[self.w.held].type
        fits = [r for r in self.w.receptacles.values() if otype in CAN_CONTAIN[r.type]]
        here = [r for r in fits if r.name == self.w.at]
        self.put((here or fits)[0].name)

    def transform(self, verb: str) -> None:
        # Every "go to" costs one step, so the appliance we stand at (if any) is the cheapest one.
        appliances = [r.name for r in self.w.receptacles.values() if r.type == TRANSFORM_APPLIANCE[verb]]
        appliance = self.w.at if self.w.at in appliances else appliances[0]
        self.go(appliance)
        self.do(f"{verb} {self.w.held} with {appliance}")


def _attempt(world: World, script) -> list[str] | None:
    sim = _Sim(world)
    try:
        script(sim)
    except (PlanError, StopIteration, IndexError):
        return None
    return sim.plan if sim.w.goal_reached() else None


def _delivery_plans(world: World) -> list[list[str] | None]:
    g = world.goal
    plans = []
    for target in [r.name for r in world.receptacles.values() if r.type == g["receptacle"]]:
        ready_in_target = [
            n for n in world.receptacles[target].contents if world._goal_ready(world.objects[n])
        ]
        need = g["count"] - len(ready_in_target)
        movable = [o.name for o in world.objects.values() if o.type == g["object"] and o.name not in ready_in_target]
        for chosen in permutations(movable, need):
            plans.append(_attempt(world, lambda sim, chosen=chosen, target=target: _deliver(sim, chosen, target)))
    return plans


def _deliver(sim: _Sim, chosen: tuple[str, ...], target: str) -> None:
    transform = sim.w.goal["transform"]
    for oname in chosen:
        sim.take(oname)
        obj = sim.w.objects[oname]
        if transform and not getattr(obj, TRANSFORM_STATE[transform]):
            sim.transform(transform)
        sim.put(target)


def _look_plans(world: World) -> list[list[str] | None]:
    g = world.goal
    objs = [o.name for o in world.objects.values() if o.type == g["object"]]
    lamps = [o for o in world.objects.values() if o.type == g["toggle"] and o.parent is not None]
    plans = []
    for oname in objs:
        for lamp in lamps:
            def script(sim: _Sim, oname=oname, lamp=lamp.name) -> None:
                sim.take(oname)
                sim.go(sim.w.objects[lamp].parent)
                if not sim.w.goal_reached():
                    sim.do(f"use {lamp}")
            plans.append(_attempt(world, script))
    return plans
