"""The Environment Tuning recipe on BFCL, shrunk to the tiny model: every phase runs, hints on then off."""

from __future__ import annotations

import importlib.util
import json

import pytest

from run_documents import assert_documented
from turnforge.recipes import load_recipe

needs_bfcl = pytest.mark.skipif(
    importlib.util.find_spec("bfcl_eval") is None, reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval)"
)

TINY = [
    'model.dtype="auto"',
    "model.lora.r=4",
    "model.lora.alpha=8",
    *(f"stages.eval-{e}.{k}" for e in ("base", "envtune") for k in ("tasks=1", "max_turns=2", "max_new_tokens=8")),
    "stages.envtune.tasks=2",
    "stages.envtune.tasks_per_step=1",
    "stages.envtune.num_generations=2",
    "stages.envtune.micro_batch_size=2",
    "stages.envtune.max_new_tokens=8",
    "stages.envtune.max_turns=2",
    "stages.envtune.max_completion_length=256",
    "stages.envtune.learning_rate=1e-3",
    "stages.envtune.dynamic_sampling=false",
    *(f"stages.envtune.phases.{i}.steps=1" for i in range(3)),
]


def test_recipe_follows_the_protocol():
    recipe = load_recipe("bfcl_envtuning")
    envtune = recipe.stage("envtune")
    assert recipe.env.name == "bfcl" and envtune.split == "train" and recipe.stage("eval-envtune").split == "heldout"
    assert [p.env.get("hints") for p in envtune.phases] == [True, True, False]
    assert envtune.rewards.progress > 0 and envtune.lora.r == 64 and envtune.beta == 0.0


@needs_bfcl
def test_tiny_variant_runs_every_phase(tmp_path):  # ~1 min: BFCL prompts carry the function docs
    from rich.console import Console

    from turnforge.pipeline import run_recipe

    summary = run_recipe(load_recipe("bfcl_envtuning", overrides=TINY, model="tiny"), tmp_path, console=Console(quiet=True))
    assert_documented(tmp_path)
    phases = summary["stages"]["envtune"]["result"]["phases"]
    assert [(p["phase"], p["hints"], p["steps"]) for p in phases] == [
        ("base-hints", True, 1), ("all-hints", True, 1), ("all-plain", False, 1)]
    assert phases[0]["tasks"] == 2 and summary["eval"]["envtune"]["n_episodes"] == 1
    batches = [json.loads(x) for x in (tmp_path / "stages/02-envtune/01-base-hints/rollouts.jsonl").read_text().splitlines()]
    assert batches[0]["episodes"] == 2
