"""Stage `eval`: evaluate a policy on a split; writes OUT/eval/<name>/{episodes.jsonl,summary.json}.

The episodes run through `turnforge.rollouts_file.run_eval`, so an eval stage is exactly
`turnforge eval ... --out OUT/eval/<name>` and resumes the same way (finished episodes are kept).
With `policy = "hf"` the model is the one the stage's `model` names (base, latest, or an sft stage), with
the stage's sampling settings and history window.

    turnforge run recipes/quickstart.toml --out runs/qs      # stages 03-eval-base and 04-eval-sft
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from turnforge.rollout import RolloutLimits
from turnforge.rollouts_file import run_eval
from turnforge.rundir import SUMMARY_FILE
from turnforge.stages.config import STAGE_NAME, RolloutStage
from turnforge.stages.context import RunContext
from turnforge.stages.registry import register_stage
from turnforge.types import EVAL_TEMPERATURE, Temperature

EVAL_DIR = "eval"


class EvalStage(RolloutStage):
    """`kind = "eval"`: an evaluation, written to eval/<name>/{episodes.jsonl,summary.json}."""

    kind: Literal["eval"] = "eval"
    name: str = Field(default="eval", pattern=STAGE_NAME)
    policy: Literal["expert", "random", "hf"] = "hf"
    split: str = "test"
    temperature: Temperature = EVAL_TEMPERATURE
    """Sampling temperature; 0 = greedy (an evaluation plays the greedy policy unless told otherwise)."""


def run_eval_stage(stage: EvalStage, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    out = ctx.out_dir / EVAL_DIR / stage.name
    summary = run_rollouts(stage, index, out, ctx)
    return {
        "summary": ctx.relative(out / SUMMARY_FILE),
        "success": summary["success"],
        "n_episodes": summary["n_episodes"],
    }


def run_rollouts(
    stage: RolloutStage, index: int, out: Path, ctx: RunContext, scripted_options: dict[str, Any] | None = None,
    task_ids: Collection[str] | None = None,
) -> dict[str, Any]:
    """Episodes of `stage.policy` on `stage.split` into `out` (resumable); returns the eval summary.

    `scripted_options` go to a scripted policy (collect's expert `noise`); `task_ids` keeps only those of the
    split's first `stage.tasks`
    (rft's sampling of what its greedy play failed). With the recipe's `[scale] ray` set
    they run on Ray workers (collect, eval and rft's sampling alike)."""
    # Scripted policies ignore the sampling settings; a model user simulator (env option `user`) samples with them.
    model_path, model_options = None, {"params": stage.sampling()}
    if scripted_options:
        model_options["policy_options"] = scripted_options
    if stage.policy == "hf":  # scripted policies take no model
        model = ctx.model(ctx.recipe.model_source(index))
        model_path = model.path
        policy_options = {
            "adapter": model.adapter,
            "window": stage.window,
            "device": ctx.recipe.model.device,
            "dtype": ctx.recipe.model.dtype,
            "batch_size": stage.batch_size,
        }
        model_options = {"params": stage.sampling(), "policy_options": policy_options}
    env, env_options = ctx.stage_env(stage)
    return run_eval(
        env=env,
        env_options=env_options,
        policy_spec=stage.policy,
        split=stage.split,
        n_tasks=stage.tasks,
        samples=stage.samples,
        seed=stage.seed,
        out_dir=out,
        model=model_path,
        limits=RolloutLimits(max_turns=stage.max_turns, max_open=stage.batch_size),
        scale=ctx.recipe.scale,
        task_ids=task_ids,
        **model_options,
    )


register_stage(EvalStage, run_eval_stage)
