"""Recipes: one TOML file per pipeline, parsed into typed, validated configs (design.md §7).

The recipes shipped with turnforge live next to this file (`quickstart.toml`, `alfworld_sft.toml`) and are
found by bare name: `turnforge run quickstart`, `turnforge run recipes/quickstart.toml`. A recipe:

    name = "quickstart"                  # optional; description = "..." too
    [model]                              # the base model: "tiny" | a path | a hub id; dtype; device
    name = "tiny"
    [env]                                # see `turnforge envs`
    name = "household"
    format = "act_line"
    [env.options]
    grammar = "0.3"
    [[stages]]                           # run in order; kinds: collect | sft | rft | dpo | grpo | envtune | eval
    kind = "collect"                     # expert episodes on train -> stages/01-collect/trajectories.jsonl
    tasks = 1500
    [[stages]]
    kind = "sft"                         # every field of turnforge.train.settings.SFTSettings
    data = ["collect"]
    learning_rate = 1e-3
    [stages.lora]                        # optional LoRA for this stage (turnforge.models.LoraSpec)
    r = 16
    [[stages]]
    kind = "eval"                        # -> eval/<name>/{episodes.jsonl,summary.json}
    name = "sft"
    model = "latest"                     # "base" | "latest" | an earlier sft stage

    trl = { max_grad_norm = 0.5 }        # any other field of TRL's SFTConfig / DPOConfig / GRPOConfig

Every field, its default and meaning: `[model]`/`[env]` in `turnforge.recipes.schema`, each stage kind's in its
file `turnforge.stages.<kind>` (config class and run, registered once).
"""

from __future__ import annotations

import importlib
from typing import Any

from turnforge.recipes.packaged import packaged_recipes

# The names below load on first use (PEP 562): reading a recipe imports every stage kind, and with them the training
# libraries (torch, TRL, PEFT: ~4 s), which `turnforge run --help` (it lists `packaged_recipes()`) must not wait for.
_HOMES = {
    "turnforge.recipes.loading": ("RecipeError", "find_recipe", "load_recipe", "parse_recipe"),
    "turnforge.recipes.recipe": ("Recipe",),
    "turnforge.recipes.schema": ("EnvConfig", "ModelConfig"),
    "turnforge.stages.collect": ("CollectStage",),
    "turnforge.stages.config": ("PlaysEnv", "RolloutStage", "StageConfig", "TrainStage"),
    "turnforge.stages.dpo": ("DPOStageConfig",),
    "turnforge.stages.envtune": ("EnvTuneStageConfig",),
    "turnforge.stages.eval": ("EvalStage",),
    "turnforge.stages.grpo": ("GRPOStageConfig",),
    "turnforge.stages.rft": ("RFTStageConfig",),
    "turnforge.stages.sft": ("SFTStageConfig",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME_OF[name]), name)


__all__ = [
    "CollectStage",
    "DPOStageConfig",
    "EnvConfig",
    "EnvTuneStageConfig",
    "EvalStage",
    "GRPOStageConfig",
    "ModelConfig",
    "PlaysEnv",
    "RFTStageConfig",
    "Recipe",
    "RecipeError",
    "RolloutStage",
    "SFTStageConfig",
    "StageConfig",
    "TrainStage",
    "find_recipe",
    "load_recipe",
    "packaged_recipes",
    "parse_recipe",
]
