"""Export household tasks as ALFWorld games: `<out>/<task_id>/game.tw-pddl` + `traj_data.json`.

The game file is what ALFWorld's `AlfredTWEnv` loads: JSON with the PDDL domain and text grammar of
the installed `alfworld` package (grammar 0.4.x: "move X to Y"), the goal sentence substituted for
"UNKNOWN GOAL", the PDDL problem written from the task, and `solvable: true`. `traj_data.json` carries
`task_type` and `pddl_params` as ALFRED's do, so the official loaders and task filters accept it.
"""

from __future__ import annotations

import json
from pathlib import Path

from turnforge.envs.household.catalog import CAN_CONTAIN, OBJECTS
from turnforge.types import Task

_START = "loc_bar_0_bar_0_bar_0_bar_0"
_FLAGS = ("cleanable", "heatable", "coolable", "sliceable", "toggleable", "pickupable")
# Type constants the ALFRED domain names in its preconditions; declared even when absent from a scene.
_DOMAIN_TYPES = {"otype": {"KnifeType", "ButterKnifeType"}, "rtype": {"SinkBasinType", "MicrowaveType", "FridgeType"}}


def _loc(n: int) -> str:
    return f"loc_bar_{n}_bar_0_bar_0_bar_0"


def pddl_problem(task: Task) -> str:
    """The PDDL problem of a household task, in ALFWorld's `alfred` domain."""
    d = task.data
    recs, objs = d["receptacles"], d["objects"]
    rec_loc = {r["id"]: _loc(r["loc"]) for r in recs}
    otypes = sorted({f"{o['type']}Type" for o in objs} | {f"{d['goal']['object']}Type"} | _DOMAIN_TYPES["otype"])
    rtypes = sorted({f"{r['type']}Type" for r in recs} | _DOMAIN_TYPES["rtype"])
    init = [f"(atLocation agent1 {_START})"]
    for r in recs:
        init.append(f"(receptacleAtLocation {r['id']} {rec_loc[r['id']]})")
        init.append(f"(receptacleType {r['id']} {r['type']}Type)")
        if r["openable"]:
            init.append(f"(openable {r['id']})")
        if r["opened"]:
            init.append(f"(opened {r['id']})")
    for o in objs:
        kind = OBJECTS[o["type"]]
        init.append(f"(objectType {o['id']} {o['type']}Type)")
        init += [f"({flag} {o['id']})" for flag in _FLAGS if getattr(kind, flag)]
        if kind.receptacle_object:
            init.append(f"(isReceptacleObject {o['id']})")
        init.append(f"(inReceptacle {o['id']} {o['in']})")
        init.append(f"(objectAtLocation {o['id']} {rec_loc[o['in']]})")
    for rtype in sorted({r["type"] for r in recs}):
        init += [f"(canContain {rtype}Type {otype}Type)" for otype in sorted(CAN_CONTAIN[rtype])
                 if f"{otype}Type" in otypes]
    locations = " ".join([_START] + sorted(set(rec_loc.values())))
    return (
        f"(define (problem plan_trial_{task.id.replace('-', '_')})\n(:domain alfred)\n(:objects\n"
        f" agent1 - agent\n {' '.join(otypes)} - otype\n {' '.join(rtypes)} - rtype\n"
        f" {' '.join(o['id'] for o in objs)} - object\n {' '.join(r['id'] for r in recs)} - receptacle\n"
        f" {locations} - location\n)\n(:init\n " + "\n ".join(init) + "\n)\n"
        f"(:goal {_goal(d['goal'])})\n)\n"
    )


def _goal(g: dict) -> str:
    """ALFWorld's goal formulas (alfworld/gen/goal_library.py) for the six task types."""
    o, r = f"{g['object']}Type", f"{g['receptacle']}Type"
    if g["toggle"]:
        return (
            f"(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and (objectType ?ot {g['toggle']}Type)"
            " (toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))"
            f" (exists (?o - object ?a - agent) (and (objectType ?o {o}) (holds ?a ?o))))"
        )
    if g["count"] == 2:
        return (
            f"(and (exists (?r - receptacle) (exists (?o1 - object) (and (objectType ?o1 {o}) (receptacleType ?r {r})"
            f" (inReceptacle ?o1 ?r) (exists (?o2 - object) (and (not (= ?o1 ?o2)) (objectType ?o2 {o})"
            f" (receptacleType ?r {r}) (inReceptacle ?o2 ?r)))))))"
        )
    state = {"clean": " (cleanable ?o) (isClean ?o)", "heat": " (heatable ?o) (isHot ?o)",
             "cool": " (coolable ?o) (isCool ?o)", None: ""}[g["transform"]]
    return (
        f"(and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o {o})"
        f" (receptacleType ?r {r}){state}))))"
    )


def traj_data(task: Task) -> dict:
    g = task.data["goal"]
    return {
        "task_id": task.id,
        "task_type": task.category,
        "scene": {"scene_type": task.data["scene"]},
        "pddl_params": {
            "object_target": g["object"],
            "parent_target": g["receptacle"] or "",
            "toggle_target": g["toggle"] or "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": task.data["goal_text"]}]},
    }


def export_games(tasks: list[Task], out_dir: str | Path) -> list[Path]:
    """Write each task as an ALFWorld game folder named by its task id; returns the game files."""
    try:
        from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH
    except ImportError as e:
        raise RuntimeError("export needs the real ALFWorld package: pip install 'turnforge[alfworld]'") from e
    domain = Path(ALFRED_PDDL_PATH).read_text()
    grammar = Path(ALFRED_TWL2_PATH).read_text()
    paths = []
    for task in tasks:
        folder = Path(out_dir) / task.id
        folder.mkdir(parents=True, exist_ok=True)
        game = {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", task.data["goal_text"]),
            "pddl_problem": pddl_problem(task),
            "solvable": True,
        }
        (folder / "game.tw-pddl").write_text(json.dumps(game))
        (folder / "traj_data.json").write_text(json.dumps(traj_data(task), indent=2))
        paths.append(folder / "game.tw-pddl")
    return paths
