"""The tau2 agent recipe (SFT -> RFT -> GRPO on the service env): the full one follows the seed's settings, the
tiny one runs end to end on the built-in desk domain, its rollout stages against the tiny base model as the user."""

from __future__ import annotations

import json

import pytest

from run_documents import assert_documented
from turnforge.recipes import load_recipe


def test_full_recipe_follows_the_seed():
    """The seed's settings end to end (seed 002's eval config and training details)."""
    recipe = load_recipe("tau_sft_rft_grpo")
    grpo = recipe.stage("grpo")
    options = recipe.env_options()
    assert recipe.env.name == "service" and options["max_steps"] == 100
    assert options["user"] == "base" and options["user_temperature"] == 0.7  # a model user in every stage
    assert (grpo.epsilon, grpo.epsilon_high) == (0.2, 0.28)
    assert grpo.rewards.outcome == 1.0 and grpo.rewards.progress == 0.25
    for name in ("eval-base", "eval-grpo"):
        final = recipe.stage(name)
        assert (final.temperature, final.top_p, final.top_k, final.samples) == (0.8, 1.0, 20, 4)
        assert recipe.stage_env(final)[1].get("on_bad_call", "end") == "end"  # tau2's rule where it is scored
    assert all(stage.top_k == 20 for stage in recipe.stages if hasattr(stage, "top_k"))
    assert recipe.stage("collect").policy == "expert" and recipe.stage("rft").keep == "success"


def test_a_base_user_is_the_base_model_in_every_stage_that_plays(tmp_path, monkeypatch):
    from turnforge.formats.families import get_family
    from turnforge.stages.context import RunContext

    recipe = load_recipe("tau_sft_rft_grpo")
    ctx = RunContext(recipe, tmp_path)
    # A real run reads Qwen3-4B-Instruct-2507's family from its tokenizer on the Hub; no network here.
    monkeypatch.setattr("turnforge.stages.context.model_family", lambda path: get_family("qwen3"))
    playing = [s for s in recipe.stages if s.kind != "sft"]
    assert [s.id for s in playing] == ["eval-base", "collect", "rft", "grpo", "eval-grpo"]
    assert {ctx.stage_env(s)[1]["user"] for s in playing} == {"hf:Qwen/Qwen3-4B-Instruct-2507"}
    assert recipe.stage_env(recipe.stage("grpo"))[1]["user"] == "base"  # as written: the run dir's hash stays put


def test_user_base_outside_a_recipe_is_one_clear_line():
    from turnforge.envs.service import model_roles

    with pytest.raises(ValueError, match="user=base names a recipe's base model.*hf:PATH"):
        model_roles({"user": "base"})


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
    desk = final["env_metrics"]["desk"]
    assert set(desk["pass^k"]) == {"1", "2"}
    assert desk["user_tokens"] > 0  # the user was the tiny base model (user = "base"), not the scripted user
    assert desk["user_faults"]["failed"] == 4 - round(4 * final["success"])
    assert "## Failures attributed to the user simulator" in (tmp_path / "report.md").read_text()


def test_grpo_dataset_prompts_of_a_model_user_env_need_no_user_role():
    """GRPO's dataset prompts only carry task ids; building them used to reset the env without the `user` role
    (KeyError 'user' before the first step of a grpo stage with a model user)."""
    from turnforge.envs.base import load_tasks
    from turnforge.train.grpo import task_dataset

    tasks = load_tasks("service", "train", domain="desk")[:2]
    dataset = task_dataset("service", {"domain": "desk", "user": "hf:not-loaded"}, tasks)
    assert [p[-1]["task_id"] for p in dataset["prompt"]] == [t.id for t in tasks]
