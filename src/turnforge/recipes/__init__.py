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

from turnforge.recipes.loading import RecipeError, find_recipe, load_recipe, packaged_recipes, parse_recipe
from turnforge.recipes.recipe import Recipe
from turnforge.recipes.schema import EnvConfig, ModelConfig
from turnforge.stages.collect import CollectStage
from turnforge.stages.config import PlaysEnv, RolloutStage, StageConfig, TrainStage
from turnforge.stages.dpo import DPOStageConfig
from turnforge.stages.envtune import EnvTuneStageConfig
from turnforge.stages.eval import EvalStage
from turnforge.stages.grpo import GRPOStageConfig
from turnforge.stages.rft import RFTStageConfig
from turnforge.stages.sft import SFTStageConfig

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
