"""The household environment: ALFWorld-compatible text household (native engine, planner, splits)."""

from __future__ import annotations

from turnforge.envs.base import EnvOption, EnvSpec, register_env
from turnforge.envs.household.catalog import TASK_TYPES, is_plausible
from turnforge.envs.household.env import THOUGHTS, HouseholdEnv
from turnforge.envs.household.scene import SPLIT_SIZES, SPLITS, Knobs, entity_names, generate_split
from turnforge.formats import list_formats
from turnforge.types import Task

__all__ = ["HouseholdEnv", "load_tasks", "is_plausible", "TASK_TYPES"]


def load_tasks(
    split: str,
    limit: int | None = None,
    *,
    seed: int,
    receptacles: float,
    distractors: int,
    closed: float,
    **_env_options,
) -> list[Task]:
    """Generated tasks of `split` in a stable order (task types cycle, so any prefix covers all six).

    The options come resolved by `envs.base.load_tasks` (their defaults are the `EnvOption`s' below)."""
    knobs = Knobs(receptacles=receptacles, distractors=distractors, closed=closed)
    return [
        Task(id=f"{split}-{i:05d}", env="household", split=split, category=d["task_type"], data=d)
        for i, d in enumerate(generate_split(split, limit, seed, knobs))
    ]


def _make(**options) -> HouseholdEnv:
    return HouseholdEnv(**options)


def _vocabulary(options: dict) -> list[str]:
    return entity_names(Knobs(receptacles=options["receptacles"], distractors=options["distractors"]))


SPEC = register_env(
    EnvSpec(
        name="household",
        description="ALFWorld-compatible text household (native engine, 6 task types, expert planner)",
        factory=_make,
        load_tasks=load_tasks,
        categories=TASK_TYPES,
        splits=SPLITS,
        split_size=lambda split, _options: SPLIT_SIZES[split],
        vocabulary=_vocabulary,
        options=[
            EnvOption("grammar", str, "0.3", "ALFWorld grammar: 0.3 (put X in/on Y) or 0.4 (move X to Y)", ("0.3", "0.4")),
            EnvOption("hints", bool, False, "replace 'Nothing happens.' by an actionable correction"),
            EnvOption("admissible", bool, False, "append the admissible commands to each observation"),
            EnvOption("format", str, "act_line", "how the agent writes actions", tuple(list_formats())),
            EnvOption("max_steps", int, 50, "steps before the episode ends (max_turns)", at_least=1),
            EnvOption("expert", str, "oracle", "scripted solver: oracle (knows where things are) or explorer "
                      "(searches like an agent; learnable by imitation)", ("oracle", "explorer")),
            EnvOption("thoughts", str, "none", "what the expert writes as its THOUGHT before each action: none, or "
                      "goal (the goal restated in one canonical line), or search (also where the explorer's search is)",
                      THOUGHTS),
            EnvOption("seed", int, 0, "generator seed of the task splits"),
            EnvOption("step_delay_ms", int, 0, "each step sleeps this long: stands in for a slow env (a sandbox, "
                      "a simulated user) in benchmarks and tests of the rollout engine", at_least=0),
            EnvOption("receptacles", float, Knobs.receptacles, "scale of the number of receptacles per room",
                      at_least=0.1),
            EnvOption("distractors", int, Knobs.distractors, "objects per room that are not part of the goal",
                      at_least=0),
            EnvOption("closed", float, Knobs.closed, "fraction of openable receptacles that start closed",
                      at_least=0, at_most=1),
        ],
    )
)


def _make_alfworld(**options):
    from turnforge.envs.household.alfworld_engine import AlfWorldEnv

    return AlfWorldEnv(**options)


def _load_alfworld(split: str, **options) -> list[Task]:
    from turnforge.envs.household.alfworld_engine import load_tasks as load_games

    return load_games(split, **options)


ALFWORLD_SPEC = register_env(
    EnvSpec(
        name="alfworld",
        description="the real ALFWorld engine (TextWorld+PDDL) on official or exported games; needs turnforge[alfworld]",
        factory=_make_alfworld,
        load_tasks=_load_alfworld,
        categories=TASK_TYPES,
        splits=("train", "valid_seen", "valid_unseen", "test"),
        options=[
            EnvOption("data_dir", str, "", "folder of ALFWorld games (json_2.1.1/<split>/...) or an export"),
            EnvOption("format", str, "act_line", "how the agent writes actions", tuple(list_formats())),
            EnvOption("max_steps", int, 50, "steps before the episode ends (max_turns)", at_least=1),
            EnvOption("planner", bool, True, "run ALFWorld's PDDL planner each step (needed by --policy expert)"),
        ],
    )
)
