"""Stage `collect`: roll a policy out on a split and keep the episodes as training data.

A collect stage is an evaluation (`stages/eval.py`, resumable episode by episode) whose episodes file
becomes `stages/NN-<id>/trajectories.jsonl` when it is complete: one Trajectory JSON line per episode,
successes and failures alike (choosing among them is the consuming stage's job). `summary.json` beside it
says how well the collecting policy did.

    turnforge run recipes/quickstart.toml --out runs/qs      # stage 01-collect: expert episodes on train
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from turnforge.rundir import EPISODES_FILE
from turnforge.stages.config import STAGE_NAME, RolloutStage
from turnforge.stages.context import RunContext
from turnforge.stages.eval import run_rollouts
from turnforge.stages.registry import register_stage

TRAJECTORIES_FILE = "trajectories.jsonl"


class CollectStage(RolloutStage):
    """`kind = "collect"`: rollouts whose episodes become training data (stages/NN-<id>/trajectories.jsonl)."""

    kind: Literal["collect"] = "collect"
    name: str = Field(default="collect", pattern=STAGE_NAME)
    policy: Literal["expert", "random", "hf"] = "expert"
    split: str = "train"
    noise: float = Field(default=0.0, ge=0.0, lt=1.0)
    """policy expert: the probability per turn of a deliberate mistake (DART), followed by the expert's recovery;
    the mistakes stay in the episodes as context and carry no SFT loss (`policies.scripted.ExpertPolicy`)."""

    @model_validator(mode="after")
    def _noise_needs_expert(self) -> CollectStage:
        if self.noise and self.policy != "expert":
            raise ValueError(f"noise perturbs the expert's demonstrations; policy {self.policy!r} takes none")
        return self


def run_collect(stage: CollectStage, index: int, stage_dir: Path, ctx: RunContext) -> dict[str, Any]:
    episodes, trajectories = stage_dir / EPISODES_FILE, stage_dir / TRAJECTORIES_FILE
    if trajectories.exists() and not episodes.exists():
        os.replace(trajectories, episodes)  # killed after the rename, before done.json: resume from it
    summary = run_rollouts(stage, index, stage_dir, ctx, {"noise": stage.noise} if stage.noise else None)
    os.replace(episodes, trajectories)
    return {
        "trajectories": ctx.relative(trajectories),
        "episodes": summary["n_episodes"],
        "success": summary["success"],
    }


register_stage(CollectStage, run_collect)
