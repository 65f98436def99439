"""The GRPO-TCR code agent recipe: the full one follows the seed's settings, the tiny one runs end to end on
generated problems (~20 s on 2 CPU cores)."""

from __future__ import annotations

import json

from run_documents import assert_documented
from turnforge.recipes import load_recipe


def test_full_recipe_follows_the_seed():
    recipe = load_recipe("code_grpo_tcr")
    grpo = recipe.stage("grpo")
    assert recipe.model.name == "Qwen/Qwen3-4B-Instruct-2507" and recipe.env.name == "code"
    assert recipe.env_options()["max_turns"] == 16 and grpo.max_turns == 16
    assert (grpo.learning_rate, grpo.tasks_per_step, grpo.num_generations) == (1e-6, 4, 8)
    assert (grpo.epsilon, grpo.epsilon_high, grpo.beta, grpo.loss_type) == (0.2, 0.28, 0.0, "dapo")
    assert grpo.max_completion_length == 10480
    rewards = grpo.rewards
    assert rewards.signed_outcome and rewards.tool_call > 0 and rewards.overlong == 1.0
    assert rewards.overlong_buffer == 3000
    assert [s.kind for s in recipe.stages] == ["eval", "collect", "sft", "grpo", "eval"]


def test_tiny_recipe_runs_every_stage(tmp_path):
    from rich.console import Console

    from turnforge.pipeline import run_recipe

    summary = run_recipe(load_recipe("code_grpo_tcr_tiny"), tmp_path, console=Console(quiet=True))
    assert_documented(tmp_path)
    assert list(summary["stages"]) == ["collect", "sft", "grpo", "eval-grpo"]
    collected = [json.loads(x) for x in (tmp_path / "stages/01-collect/trajectories.jsonl").read_text().splitlines()]
    assert len(collected) == 4 and all(e["score"]["success"] for e in collected)
    assert all(any(m.get("role") == "tool" for m in e["messages"]) for e in collected)  # the expert used the tool
    metrics = [json.loads(x) for x in (tmp_path / "stages/03-grpo/metrics.jsonl").read_text().splitlines()]
    assert any("rewards/tool_call/mean" in m for m in metrics)
    assert summary["eval"]["grpo"]["n_episodes"] == 4
