"""The bfcl environment: BFCL V3 multi-turn (data, function docs and executable classes from bfcl-eval).

    turnforge eval --env bfcl --env-opt category=multi_turn_base --policy expert --out runs/bfcl-gt
    turnforge eval --env bfcl --env-opt category=all --env-opt format=bfcl_python --policy replay:FILE --out runs/x

Tasks: one per BFCL entry; `Task.id` is BFCL's id (`multi_turn_base_0`), `Task.category` its category,
`Task.data` the entry with its `ground_truth`, `difficulty` (the number of user turns, for curricula) and
the bfcl-eval `version` it came from. Needs `pip install 'turnforge[bfcl]'` (bfcl-eval without its
dependencies, plus mpmath); without it the env is listed but building or loading it says how to install.
"""

from __future__ import annotations

from turnforge.envs.base import EnvOption, EnvSpec, register_env
from turnforge.envs.bfcl.data import (
    CATEGORIES,
    FUNC_DOC_FILES,
    PINNED_VERSION,
    SPLITS,
    function_docs,
    load_category,
    split_ids,
)
from turnforge.types import Task

__all__ = ["CATEGORIES", "load_tasks", "make_bfcl_env"]


def load_tasks(
    split: str,
    limit: int | None = None,
    *,
    category: str,
    version: str,
    split_seed: int,
    **_env_options,
) -> list[Task]:
    """The entries of `category` (or all four) in `split`, in BFCL's order (category, then id number)."""
    categories = CATEGORIES if category == "all" else (category,)
    tasks = []
    for name in categories:
        entries = load_category(name, version)
        chosen = split_ids(entries, split, split_seed)
        for entry in entries:
            if entry["id"] in chosen:
                data = {**entry, "difficulty": len(entry["question"]), "version": version}
                tasks.append(Task(id=entry["id"], env="bfcl", split=split, category=name, data=data))
    return tasks[:limit]


def make_bfcl_env(**options):
    from turnforge.envs.bfcl.env import BfclEnv

    return BfclEnv(**options)


def vocabulary(options: dict) -> list[str]:
    """The function names of every BFCL class (`ls`, `get_stock_info`, `book_flight`...): the words of the tool
    schemas, whole tokens in a tokenizer trained on the env (the tiny model's), also those of classes that no
    sampled entry involves."""
    return sorted({doc["name"] for cls in FUNC_DOC_FILES for doc in function_docs(cls, options["version"])})


SPEC = register_env(
    EnvSpec(
        name="bfcl",
        description="BFCL V3 multi-turn: function calling over bfcl-eval's executable classes; needs turnforge[bfcl]",
        factory=make_bfcl_env,
        load_tasks=load_tasks,
        categories=CATEGORIES,
        splits=SPLITS,
        vocabulary=vocabulary,
        corpus_options=("format", "category", "version"),
        options=[
            EnvOption("category", str, "all", "BFCL category, or all four", (*CATEGORIES, "all")),
            EnvOption("format", str, "tool_call", "tool_call (Qwen3 <tool_call> JSON) or bfcl_python ([f(a=1)])",
                      ("tool_call", "bfcl_python")),
            EnvOption("hints", bool, False, "on a failed call, append an actionable hint (Environment Tuning)"),
            EnvOption("max_steps_per_turn", int, 20, "steps with calls per user turn; one more force-quits (BFCL: "
                      "bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT = 20)", at_least=1),
            EnvOption("version", str, PINNED_VERSION, "bfcl-eval release the data must come from, or 'installed'"),
            EnvOption("split_seed", int, 0, "seed of the train/heldout halves of each category"),
            EnvOption("call_timeout", float, 5.0, "CPU seconds a MathAPI call may use (in a checker child capped at "
                      "1 GiB; RLIMIT_CPU counts whole seconds); past it the episode ends with stop reason "
                      "timeout, on an idle or a loaded machine alike", at_least=0.1),
        ],
    )
)
