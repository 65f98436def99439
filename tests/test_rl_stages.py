"""rft, grpo and envtune stages in a recipe on the tiny model: each trains (parameters change) and reports."""

from __future__ import annotations

import json

import pytest
import torch

from turnforge.models import load_model
from turnforge.pipeline import run_recipe
from turnforge.recipes import RecipeError, load_recipe

# Rewards that differ within a group for a briefly trained model: some replies parse, some do not.
GRPO = """
tasks_per_step = 2
num_generations = 4
max_new_tokens = 12
learning_rate = 1e-2
rewards = { outcome = 1.0, format = 1.0, tool_call = 1.0, progress = 0.0 }
"""


def recipe_text(model_dir) -> str:
    return f"""
name = "rl-smoke"
[model]
name = "{model_dir}"
[env]
name = "household"
format = "act_line"
[env.options]
max_steps = 3

[[stages]]
kind = "rft"
tasks = 4
samples = 2
max_new_tokens = 12
keep = "best"
min_progress = 0.0
train = {{ max_steps = 2, learning_rate = 1e-2, batch_size = 2, max_length = 1024 }}

[[stages]]
kind = "grpo"
steps = 2
tasks = 4
{GRPO}

[[stages]]
kind = "envtune"
model = "rft"          # the grpo stage's lr 1e-2 may leave a model whose groups are all alike
tasks = 4
{GRPO}
[[stages.phases]]
name = "hints"
steps = 1
env = {{ hints = true }}
[[stages.phases]]
name = "plain"
steps = 1

[[stages]]
kind = "eval"
tasks = 2
max_new_tokens = 12
"""


def _load(text: str, tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(text, encoding="utf-8")
    return load_recipe(path)


def _params(path) -> dict[str, torch.Tensor]:
    model, _ = load_model(str(path), dtype="float32", device="cpu")
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _changed(before, after) -> bool:
    return all(not torch.equal(before[n], after[n]) for n in before)


def test_rft_grpo_envtune_stages_train_and_report(household_sft_model_dir, tmp_path):
    recipe = _load(recipe_text(household_sft_model_dir), tmp_path)
    out = tmp_path / "run"
    summary = run_recipe(recipe, out)
    stages = summary["stages"]

    rft = stages["rft"]["result"]
    assert rft["yield"]["sampled"] == 8 and 1 <= rft["yield"]["kept"] <= 8
    assert (out / "stages/01-rft/kept.jsonl").exists() and rft["steps"] == 2

    grpo, envtune = stages["grpo"]["result"], stages["envtune"]["result"]
    assert grpo["steps"] == 2 and grpo["episodes"] == 16
    assert [(p["phase"], p["hints"]) for p in envtune["phases"]] == [("hints", True), ("plain", False)]
    steps = [json.loads(line)["step"] for line in (out / "stages/03-envtune/metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the phases' logs, one after the other

    start = _params(household_sft_model_dir)
    models = [_params(out / f"stages/{d}/model") for d in ("01-rft", "02-grpo", "03-envtune")]
    assert _changed(start, models[0]) and _changed(models[0], models[1]) and _changed(models[0], models[2])
    assert summary["eval"]["eval"]["n_episodes"] == 2
    assert (out / "plots/grpo_reward.png").stat().st_size > 0
    assert "grpo reward per step" in (out / "report.md").read_text()


def test_envtune_last_phase_must_drop_hints(tmp_path):
    text = recipe_text("tiny").replace('name = "plain"\nsteps = 1', 'name = "plain"\nsteps = 1\nenv = { hints = true }')
    with pytest.raises(RecipeError, match="without hints"):
        _load(text, tmp_path)


def test_grpo_settings_errors_name_the_key(tmp_path):
    text = recipe_text("tiny").replace("num_generations = 4", "num_generations = 1", 1)
    with pytest.raises(RecipeError, match="num_generations"):
        _load(text, tmp_path)
    text = recipe_text("tiny").replace("train = { max_steps = 2", "train = { max_stepz = 2")
    with pytest.raises(RecipeError, match="max_stepz"):
        _load(text, tmp_path)


def _rft_recipe(model_dir, rft_fields: str, after: str = "") -> str:
    """An rft stage (2 tasks x 2 samples, 2 turns) of the untrained model with `rft_fields` added, then `after`."""
    return f"""
name = "rft-untrained"
[model]
name = "{model_dir}"
[env]
name = "household"
[env.options]
max_steps = 2
[[stages]]
kind = "rft"
tasks = 2
samples = 2
max_new_tokens = 4
{rft_fields}
{after}
"""


def test_rft_with_nothing_to_keep_passes_the_model_on(tiny_model_dir, tmp_path):
    """The untrained model succeeds nowhere: the rft stage trains nothing, says so, and later stages go on."""
    text = _rft_recipe(tiny_model_dir, "", '[[stages]]\nkind = "eval"\ntasks = 1\nmax_new_tokens = 4')
    summary = run_recipe(_load(text, tmp_path), tmp_path / "run")
    rft = summary["stages"]["rft"]["result"]
    assert rft["steps"] == 0 and rft["yield"]["kept"] == 0 and rft["yield"]["sampled"] == 4
    assert rft["model"] == str(tiny_model_dir) and summary["eval"]["eval"]["n_episodes"] == 1


def test_rft_whose_kept_replies_are_all_slips_passes_the_model_on(tiny_model_dir, tmp_path):
    """keep = "best" keeps one episode per task of the untrained model, but none of its replies parses: with
    `mask_defects` every reply is context, nothing is left to learn, and the stage passes the model on."""
    text = _rft_recipe(tiny_model_dir, 'keep = "best"\nmin_progress = 0.0\nmask_defects = true')
    summary = run_recipe(_load(text, tmp_path), tmp_path / "run")
    rft = summary["stages"]["rft"]["result"]
    assert rft["yield"]["kept"] == 2 and rft["steps"] == 0 and rft["model"] == str(tiny_model_dir)
    masked = rft["yield"]["masked"]
    assert masked["episodes"] == 2 and masked["masked"] >= 2 and masked["left"] == 0 and masked["not_replayable"] == 0
    assert not (tmp_path / "run/stages/01-rft/kept.jsonl").exists()


def test_grpo_and_envtune_inputs_include_the_env(tmp_path):
    """Issue 11: a finished grpo/envtune stage trained under other env options (hints) is not reused."""
    from turnforge.pipeline import plan_stages

    before = _load(recipe_text("tiny"), tmp_path)
    after = _load(recipe_text("tiny").replace("max_steps = 3", "max_steps = 3\nhints = true"), tmp_path)
    for stage_id in ("grpo", "envtune"):
        plan = {p.stage.id: p for p in plan_stages(before, tmp_path / "run")}[stage_id]
        changed = {p.stage.id: p for p in plan_stages(after, tmp_path / "run")}[stage_id]
        assert plan.inputs["env"] == {"name": "household", "options": {"max_steps": 3, "format": "act_line"}}
        assert changed.inputs["env"]["options"]["hints"] is True and changed.hash != plan.hash


def test_grpo_and_envtune_split_and_env_options_are_checked(tmp_path):
    """Issue 11: an unknown split or env option of a grpo/envtune stage fails `--check`, as an eval stage's does."""
    text = recipe_text("tiny").replace("kind = \"grpo\"\nsteps = 2", "kind = \"grpo\"\nsteps = 2\nsplit = \"no_such_split\"")
    text = text.replace("kind = \"envtune\"", "kind = \"envtune\"\nenv = { no_such_option = 1 }")
    with pytest.raises(RecipeError) as info:
        _load(text, tmp_path)
    message = str(info.value)
    assert "stages.grpo.split: env 'household' has no split 'no_such_split'" in message
    assert "stages.envtune.env: env 'household' has no option 'no_such_option'" in message


def test_rft_guided_sampling_keeps_episodes_the_expert_helped_the_untrained_model_finish(tiny_model_dir, tmp_path):
    """`guide = 0.9`: the env's expert writes most replies, so the untrained model's episodes can succeed; they
    are kept and trained on, and the sampling's run.json records the guidance (a rerun without it is another run)."""
    text = _rft_recipe(tiny_model_dir, "guide = 0.9\ntrain = { max_steps = 2 }").replace(
        "max_steps = 2\n[[stages]]", 'max_steps = 20\nexpert = "explorer"\n[[stages]]')
    summary = run_recipe(_load(text, tmp_path), tmp_path / "run")
    rft = summary["stages"]["rft"]["result"]
    assert rft["yield"]["kept"] >= 1 and rft["steps"] == 2
    run = json.loads((tmp_path / "run/stages/01-rft/samples/run.json").read_text())
    assert run["policy_options"]["guide"] == 0.9
    with pytest.raises(RecipeError, match="guide"):
        _load(_rft_recipe(tiny_model_dir, "guide = 1.0"), tmp_path)


def test_guide_is_for_model_policies():
    from turnforge.policies import make_policy

    with pytest.raises(ValueError, match="guide .*model policies"):
        make_policy("expert", guide=0.5)
