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
    [[stages]]                           # run in order; kinds: collect | sft | dpo | eval
    kind = "collect"                     # expert episodes on train -> stages/01-collect/trajectories.jsonl
    tasks = 1500
    [[stages]]
    kind = "sft"                         # every field of turnforge.train.sft.SFTSettings
    data = ["collect"]
    learning_rate = 1e-3
    [stages.lora]                        # optional LoRA for this stage (turnforge.models.LoraSpec)
    r = 16
    [[stages]]
    kind = "eval"                        # -> eval/<name>/{episodes.jsonl,summary.json}
    name = "sft"
    model = "latest"                     # "base" | "latest" | an earlier sft stage

Every field, its default and meaning: `turnforge.recipes.schema`.
"""

from turnforge.recipes.loading import (
    Recipe,
    RecipeError,
    find_recipe,
    load_recipe,
    packaged_recipes,
    parse_recipe,
)
from turnforge.recipes.schema import (
    CollectStage,
    DPOStageConfig,
    EnvConfig,
    EvalStage,
    ModelConfig,
    RolloutStage,
    SFTStageConfig,
    StageConfig,
    TrainStage,
)

__all__ = [
    "CollectStage",
    "DPOStageConfig",
    "EnvConfig",
    "EvalStage",
    "ModelConfig",
    "Recipe",
    "RecipeError",
    "RolloutStage",
    "SFTStageConfig",
    "TrainStage",
    "StageConfig",
    "find_recipe",
    "load_recipe",
    "packaged_recipes",
    "parse_recipe",
]
