"""What exists in a household: receptacle and object types, their properties, and where objects occur.

Type names are ALFRED's (CamelCase, as in ALFWorld's PDDL `...Type` constants); the text the agent
sees is their lower-cased form ("CounterTop" -> "countertop 1"). `CAN_CONTAIN` is both the
placement table of the scene generator and the `canContain` facts of the exported PDDL, so "move X
to Y" is valid in exactly the same cases in both engines; it is also the plausibility table that
DPO mining uses to spot searches in implausible places (`is_plausible`).
"""

from __future__ import annotations

from dataclasses import dataclass

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

# The appliance each transformation needs (ALFWorld's PDDL: CleanObject needs SinkBasinType, ...).
TRANSFORM_APPLIANCE = {"clean": "SinkBasin", "heat": "Microwave", "cool": "Fridge"}
# The object state each transformation sets (PDDL isClean / isHot / isCool).
TRANSFORM_STATE = {"clean": "clean", "heat": "hot", "cool": "cool"}
TASK_TRANSFORM = {
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
}


@dataclass(frozen=True)
class ObjectKind:
    name: str
    cleanable: bool = False
    heatable: bool = False
    coolable: bool = False
    sliceable: bool = False
    receptacle_object: bool = False  # mugs, bowls...: ALFWorld's examine says "This is a normal mug 1. In it, ..."
    toggleable: bool = False
    pickupable: bool = True


def _kinds(*specs: tuple[str, str]) -> dict[str, ObjectKind]:
    flags = {"c": "cleanable", "h": "heatable", "k": "coolable", "s": "sliceable", "r": "receptacle_object"}
    return {name: ObjectKind(name, **{flags[f]: True for f in letters}) for name, letters in specs}


OBJECTS: dict[str, ObjectKind] = {
    **_kinds(
        ("Apple", "chks"), ("Bread", "hks"), ("Egg", "hk"), ("Potato", "chks"), ("Tomato", "chks"),
        ("Lettuce", "cks"), ("Mug", "chkr"), ("Cup", "chkr"), ("Bowl", "chkr"), ("Plate", "chkr"),
        ("Pot", "ckr"), ("Pan", "ckr"), ("Knife", "c"), ("ButterKnife", "c"), ("Fork", "c"),
        ("Spoon", "c"), ("Spatula", "c"), ("Ladle", "c"), ("DishSponge", "c"), ("Kettle", "c"),
        ("SaltShaker", ""), ("PepperShaker", ""), ("SoapBottle", ""), ("WineBottle", "k"),
        ("Book", ""), ("CellPhone", ""), ("CreditCard", ""), ("KeyChain", ""), ("RemoteControl", ""),
        ("Pillow", ""), ("Laptop", ""), ("Pen", ""), ("Pencil", ""), ("CD", ""), ("AlarmClock", ""),
        ("Vase", ""), ("Statue", ""), ("Watch", ""), ("Newspaper", ""), ("Box", ""), ("TissueBox", ""),
        ("SoapBar", "c"), ("Cloth", "c"), ("HandTowel", ""), ("Towel", ""), ("ToiletPaper", ""),
        ("SprayBottle", ""), ("Candle", ""), ("Plunger", ""), ("ScrubBrush", ""),
    ),
    "DeskLamp": ObjectKind("DeskLamp", toggleable=True, pickupable=False),
}

_FOOD = {"Apple", "Bread", "Egg", "Potato", "Tomato", "Lettuce"}
_DISHES = {"Mug", "Cup", "Bowl", "Plate"}
_COOKWARE = {"Pot", "Pan", "Kettle"}
_CUTLERY = {"Knife", "ButterKnife", "Fork", "Spoon", "Spatula", "Ladle"}
_CONDIMENTS = {"SaltShaker", "PepperShaker"}
_SMALL_THINGS = {"CellPhone", "CreditCard", "KeyChain", "RemoteControl", "Pen", "Pencil", "CD", "Watch"}
_DECOR = {"Vase", "Statue", "Candle", "Box", "TissueBox"}
_BATH = {"SoapBar", "SoapBottle", "Cloth", "HandTowel", "Towel", "ToiletPaper", "SprayBottle", "Candle"}

# Which object types can be (and are generated) in which receptacle types.
CAN_CONTAIN: dict[str, frozenset[str]] = {
    k: frozenset(v)
    for k, v in {
        "Fridge": _FOOD | _DISHES | _COOKWARE - {"Kettle"} | {"WineBottle"},
        "Microwave": (_FOOD - {"Lettuce"}) | _DISHES,
        "SinkBasin": _FOOD | _DISHES | _COOKWARE | _CUTLERY | {"DishSponge", "SoapBar", "Cloth"},
        "CounterTop": _FOOD | _DISHES | _COOKWARE | _CUTLERY | _CONDIMENTS
        | {"DishSponge", "SoapBottle", "WineBottle", "SoapBar", "Cloth", "SprayBottle", "Candle",
           "TissueBox", "ToiletPaper", "CellPhone", "CreditCard", "KeyChain", "Book", "Newspaper"},
        "DiningTable": _FOOD | _DISHES | _COOKWARE | _CUTLERY | _CONDIMENTS | _SMALL_THINGS | _DECOR
        | {"DishSponge", "SoapBottle", "WineBottle", "Book", "Laptop", "Newspaper"},
        "Cabinet": _DISHES | _COOKWARE | _CONDIMENTS | {"DishSponge", "SoapBottle", "WineBottle", "SoapBar",
                                                       "Cloth", "ToiletPaper", "SprayBottle", "Candle", "Box",
                                                       "TissueBox", "Vase", "Book"},
        "Drawer": _CUTLERY | _SMALL_THINGS | {"DishSponge", "Cloth", "SoapBar", "Book", "Box", "Candle",
                                              "ToiletPaper", "HandTowel", "Newspaper", "TissueBox"},
        "StoveBurner": _COOKWARE,
        "CoffeeMachine": {"Mug", "Cup"},
        "Toaster": set(),
        "GarbageCan": {"Apple", "Bread", "Egg", "Potato", "Tomato", "Lettuce", "DishSponge", "SoapBar",
                       "SoapBottle", "SprayBottle", "ToiletPaper", "Newspaper", "Pen", "Pencil", "CD",
                       "TissueBox", "Cloth", "WineBottle"},
        "Shelf": _DISHES | _CONDIMENTS | _SMALL_THINGS | _DECOR | _BATH - {"Towel", "HandTowel"}
        | {"Book", "Kettle", "SoapBottle", "AlarmClock", "WineBottle", "Laptop"},
        "Sofa": {"Pillow", "Book", "CellPhone", "CreditCard", "KeyChain", "RemoteControl", "Laptop", "Newspaper",
                 "Box"},
        "ArmChair": {"Pillow", "Book", "CellPhone", "CreditCard", "KeyChain", "RemoteControl", "Laptop",
                     "Newspaper", "Box"},
        "Ottoman": {"Pillow", "Book", "CellPhone", "CreditCard", "KeyChain", "RemoteControl", "Laptop",
                    "Newspaper", "Box"},
        "CoffeeTable": _SMALL_THINGS | _DECOR | {"Book", "Laptop", "Newspaper", "Mug", "Bowl", "Plate",
                                                 "Pillow", "AlarmClock"},
        "SideTable": _SMALL_THINGS | _DECOR | {"Book", "Laptop", "Newspaper", "Mug", "Cup", "Bowl",
                                               "AlarmClock", "DeskLamp"},
        "TVStand": _SMALL_THINGS | _DECOR | {"Book", "Laptop", "Newspaper"},
        "Dresser": _SMALL_THINGS | _DECOR | {"Book", "Laptop", "Newspaper", "Mug", "Bowl", "AlarmClock",
                                             "DeskLamp", "Cloth"},
        "Desk": _SMALL_THINGS | _DECOR | {"Book", "Laptop", "Newspaper", "Mug", "Cup", "Bowl", "AlarmClock",
                                          "DeskLamp"},
        "Bed": {"Pillow", "Book", "CellPhone", "Laptop", "Newspaper", "CreditCard", "KeyChain", "RemoteControl"},
        "Safe": {"CellPhone", "CreditCard", "KeyChain", "Watch", "CD", "Box", "Statue", "Vase"},
        "LaundryHamper": {"Cloth", "Towel", "HandTowel"},
        "Toilet": {"SoapBar", "SoapBottle", "SprayBottle", "ToiletPaper", "Candle", "Cloth", "TissueBox"},
        "BathtubBasin": {"SoapBar", "SoapBottle", "Cloth", "Candle", "Towel", "HandTowel"},
        "TowelHolder": {"Towel"},
        "HandTowelHolder": {"HandTowel"},
        "ToiletPaperHanger": {"ToiletPaper"},
    }.items()
}

OPENABLE = frozenset({"Fridge", "Microwave", "Cabinet", "Drawer", "Safe"})

# Scene -> receptacle type -> (min, max) count. Kitchens hold the appliances the transform tasks need.
SCENES: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {
        "Cabinet": (2, 7), "Drawer": (1, 4), "CounterTop": (1, 3), "Fridge": (1, 1), "Microwave": (1, 1),
        "SinkBasin": (1, 1), "StoveBurner": (2, 4), "DiningTable": (0, 1), "CoffeeMachine": (1, 1),
        "Toaster": (0, 1), "GarbageCan": (1, 1), "Shelf": (0, 2),
    },
    "livingroom": {
        "Sofa": (1, 1), "ArmChair": (0, 2), "CoffeeTable": (1, 1), "SideTable": (1, 2), "TVStand": (0, 1),
        "Shelf": (1, 3), "Drawer": (1, 4), "Cabinet": (0, 2), "Dresser": (0, 1), "GarbageCan": (1, 1),
        "DiningTable": (0, 1), "Ottoman": (0, 1),
    },
    "bedroom": {
        "Bed": (1, 1), "Desk": (1, 1), "SideTable": (1, 2), "Dresser": (1, 1), "Drawer": (2, 6),
        "Shelf": (1, 3), "GarbageCan": (1, 1), "LaundryHamper": (0, 1), "Safe": (0, 1), "ArmChair": (0, 1),
    },
    "bathroom": {
        "Toilet": (1, 1), "SinkBasin": (1, 2), "BathtubBasin": (0, 1), "CounterTop": (1, 1),
        "Cabinet": (2, 4), "Drawer": (0, 2), "TowelHolder": (1, 1), "HandTowelHolder": (1, 1),
        "ToiletPaperHanger": (1, 1), "GarbageCan": (1, 1), "Shelf": (0, 2),
    },
}

# Receptacles a lamp stands on in look_at_obj_in_light tasks.
LAMP_HOLDERS = ("Desk", "SideTable", "Dresser")


def is_plausible(object_type: str, receptacle_type: str) -> bool:
    """True when objects of this type occur in receptacles of that type (names in either case).

    >>> is_plausible("knife", "drawer"), is_plausible("Knife", "Toilet")
    (True, False)
    """
    canon_r = {k.lower(): k for k in CAN_CONTAIN}.get(receptacle_type.lower())
    canon_o = {k.lower(): k for k in OBJECTS}.get(object_type.lower())
    return canon_r is not None and canon_o is not None and canon_o in CAN_CONTAIN[canon_r]


def scene_object_types(scene: str) -> set[str]:
    """Object types that can be placed somewhere in a scene of this kind."""
    return {o for r in SCENES[scene] for o in CAN_CONTAIN[r]}
