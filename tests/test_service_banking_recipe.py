"""The tau2 recipes on banking_knowledge: the tiny one (collect -> SFT -> eval on a CPU) and the seed-style GPU one
with `domain = "banking_knowledge"`, validated and their env built; the tiny one run whole (slow: its SFT on the
domain's long episodes takes about a minute on 2 loaded cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnforge.envs.base import make_env
from turnforge.recipes import load_recipe

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2" / "banking_knowledge"
pytestmark = pytest.mark.skipif(not (DATA / "db.json").is_file(), reason="../shared/data/tau2/banking_knowledge absent")
DATA_DIR = f'env.options.data_dir="{DATA}"'


def test_the_tiny_recipe_and_the_gpu_recipe_take_the_domain():
    tiny = load_recipe("tau_banking_tiny", [DATA_DIR])
    assert [s.kind for s in tiny.stages] == ["collect", "sft", "eval"]
    assert tiny.env_options()["retrieval"] == "bm25"
    gpu = load_recipe("tau_sft_rft_grpo", ['env.options.domain="banking_knowledge"', DATA_DIR,
                                           'env.options.retrieval="bm25_grep"'])
    for recipe in (tiny, gpu):
        options = {k: v for k, v in recipe.env_options().items() if k != "user"}
        env = make_env("service", **options)
        assert {s["function"]["name"] for s in env.tools()} >= {"KB_search", "unlock_discoverable_agent_tool"}


@pytest.mark.slow  # ~80 s on 2 loaded cores, the SFT stage most of it
def test_the_tiny_recipe_runs_collect_sft_eval(tmp_path):
    from rich.console import Console

    from turnforge.pipeline import run_recipe

    summary = run_recipe(load_recipe("tau_banking_tiny", [DATA_DIR]), tmp_path, console=Console(quiet=True))
    assert list(summary["stages"]) == ["collect", "sft", "eval-sft"]
    collected = [json.loads(x) for x in (tmp_path / "stages/01-collect/trajectories.jsonl").read_text().splitlines()]
    assert len(collected) == 3 and all(e["score"]["reward"] == 1.0 for e in collected)
    assert summary["eval"]["sft"]["n_episodes"] == 2 and "banking_knowledge" in summary["eval"]["sft"]["env_metrics"]
