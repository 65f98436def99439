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
model = "base"         # rft's lr 1e-2 may leave a model whose groups are all alike (every reply unparsed)
tasks = 4
{GRPO}

[[stages]]
kind = "envtune"
model = "base"
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
    assert all(_changed(start, m) for m in models)  # each stage trained the model it started from
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


@pytest.mark.parametrize("field", ["guide = 0.5", "mask_defects = true"])
def test_removed_rft_options_are_refused_by_name(tiny_model_dir, tmp_path, field):
    """guide and mask_defects were removed (docs/quickstart.md measured no gain); a recipe that sets one is told."""
    with pytest.raises(RecipeError, match=field.split(" ")[0]):
        _load(_rft_recipe(tiny_model_dir, field), tmp_path)


@pytest.mark.parametrize("field", ['restarts = "failures"', "guide = 0.25"])
def test_removed_grpo_options_are_refused_by_name(tmp_path, field):
    """restarts and guide were removed (docs/quickstart.md measured no gain); a recipe that sets one is told."""
    text = recipe_text("tiny").replace('kind = "grpo"\nsteps = 2', f'kind = "grpo"\nsteps = 2\n{field}')
    with pytest.raises(RecipeError, match=f"stages.grpo.*{field.split(' ')[0]}"):
        _load(text, tmp_path)


def test_aim_at_failures_returns_the_failed_tasks_and_draws_replay_from_the_successes():
    """The expert plays four tasks to the end (successes) and two for one turn only (failures)."""
    from turnforge.envs.base import load_tasks, make_env
    from turnforge.policies import make_policy
    from turnforge.rollout import RolloutLimits, run_episodes
    from turnforge.stages.rft import aim_at_failures

    tasks = load_tasks("household", "train", limit=6)
    env = lambda: make_env("household")  # noqa: E731
    won = run_episodes(make_policy("expert"), env, tasks[:4], 1, progress=False)
    cut = run_episodes(make_policy("expert"), env, tasks[4:], 1, RolloutLimits(max_turns=1), progress=False)
    played = [*won[:2], *cut, *won[2:]]
    assert all(t.score.success for t in won) and not any(t.score.success for t in cut)
    failed, replay = aim_at_failures(played, 2, seed=0)
    assert failed == [tasks[4].id, tasks[5].id]
    assert len(replay) == 2 and all(t.score.success for t in replay)
    order = [t.task_id for t in played]
    assert [order.index(t.task_id) for t in replay] == sorted(order.index(t.task_id) for t in replay)  # play order
    assert aim_at_failures(played, 2, seed=0)[1] == replay  # the same seed draws the same
    assert {t.task_id for t in aim_at_failures(played, 9, seed=0)[1]} == {t.id for t in tasks[:4]}  # capped


def test_rft_aimed_at_greedy_failures_samples_only_them_and_repeats_the_kept(tiny_model_dir, tmp_path):
    """aim = "greedy_failures": the stage plays its tasks greedily first (stages/NN-rft/greedy) and samples only
    those it failed (here all: the untrained model solves none; keep = "best" keeps an episode of each);
    repeat_kept = 2 trains on each kept episode twice."""
    fields = 'aim = "greedy_failures"\nreplay = 3\nrepeat_kept = 2\nkeep = "best"\nmin_progress = 0.0\ntrain = { max_steps = 2 }'
    text = _rft_recipe(tiny_model_dir, fields).replace("max_steps = 2\n[[stages]]", 'max_steps = 20\nexpert = "explorer"\n[[stages]]')
    summary = run_recipe(_load(text, tmp_path), tmp_path / "run")
    rft = summary["stages"]["rft"]["result"]
    stage_dir = tmp_path / "run/stages/01-rft"
    greedy = [json.loads(line) for line in (stage_dir / "greedy/episodes.jsonl").read_text().splitlines()]
    assert len(greedy) == 2 and not any(e["score"]["success"] for e in greedy)
    greedy_run = json.loads((stage_dir / "greedy/run.json").read_text())
    assert greedy_run["samples"] == 1 and greedy_run["sampling"]["temperature"] == 0.0
    sampled = json.loads((stage_dir / "samples/run.json").read_text())
    assert sampled["task_ids"] == sorted(e["task_id"] for e in greedy) and sampled["samples"] == 2
    report = rft["yield"]
    assert report["greedy_failures"] == 2 and report["replay"] == 0 and report["kept"] >= 1
    assert rft["records"] == 2 * report["kept"] and rft["steps"] == 2
    assert not (stage_dir / "replay.jsonl").exists()
    with pytest.raises(RecipeError, match="replay"):
        _load(_rft_recipe(tiny_model_dir, "replay = 3"), tmp_path)


def test_run_eval_plays_only_the_task_ids_given(tmp_path):
    from turnforge.envs.base import load_tasks
    from turnforge.rollouts_file import run_eval

    ids = [t.id for t in load_tasks("household", "test", limit=5)]
    summary = run_eval("household", {}, "expert", "test", 5, 1, 0, tmp_path / "e", task_ids=[ids[3], ids[1]])
    episodes = [json.loads(line)["task_id"] for line in (tmp_path / "e/episodes.jsonl").read_text().splitlines()]
    assert sorted(episodes) == sorted([ids[1], ids[3]]) and summary["n_episodes"] == 2
    assert json.loads((tmp_path / "e/run.json").read_text())["task_ids"] == sorted([ids[1], ids[3]])
