"""The tau2 agent recipe (SFT -> RFT -> GRPO on the service env): the full one follows the seed's settings, the
tiny one runs end to end on the built-in desk domain (~1 min on 2 CPU cores)."""

from __future__ import annotations

import json

from run_documents import assert_documented
from turnforge.recipes import load_recipe


def test_full_recipe_follows_the_seed():
    recipe = load_recipe("tau_sft_rft_grpo")
    grpo = recipe.stage("grpo")
    assert recipe.env.name == "service" and recipe.env_options()["max_steps"] == 100
    assert (grpo.epsilon, grpo.epsilon_high) == (0.2, 0.28)
    assert grpo.rewards.outcome == 1.0 and grpo.rewards.progress == 0.25
    final = recipe.stage("eval-grpo")
    assert (final.temperature, final.top_p, final.samples) == (0.8, 1.0, 4)
    assert recipe.stage("collect").policy == "expert" and recipe.stage("rft").keep == "success"


def test_tiny_recipe_runs_every_stage(tmp_path):
    from rich.console import Console

    from turnforge.pipeline import run_recipe

    summary = run_recipe(load_recipe("tau_sft_rft_grpo_tiny"), tmp_path, console=Console(quiet=True))
    assert_documented(tmp_path)
    assert list(summary["stages"]) == ["collect", "sft", "rft", "grpo", "eval-grpo"]
    collected = [json.loads(x) for x in (tmp_path / "stages/01-collect/trajectories.jsonl").read_text().splitlines()]
    assert len(collected) == 4 and all(e["score"]["reward"] == 1.0 for e in collected)  # expert + scripted user
    final = summary["eval"]["grpo"]
    assert final["n_episodes"] == 4 and "desk" in final["env_metrics"]
    assert set(final["env_metrics"]["desk"]["pass^k"]) == {"1", "2"}
