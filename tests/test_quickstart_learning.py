"""The shipped quickstart recipe learns: a reduced budget of it, end to end (slow: ~10 minutes on 2 cores).

The full budget's figures are in the README (regenerated from the run) and docs/quickstart.md."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from turnforge.eval.curves import quarter_means
from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe

REDUCED = [
    "stages.collect.tasks=2000",
    "stages.sft.max_steps=500",
    *(f"stages.{e}.tasks=60" for e in ("eval-base", "eval-sft", "eval-rft", "eval-grpo")),
    "stages.rft.tasks=40",
    "stages.grpo.steps=8",
]


@pytest.mark.slow
def test_the_quickstart_recipe_on_a_reduced_budget_beats_the_base_model_and_grpo_reward_rises(tmp_path):
    out = tmp_path / "qs"
    summary = run_recipe(load_recipe("quickstart", overrides=REDUCED), out, console=Console(quiet=True))
    base, sft = summary["eval"]["base"], summary["eval"]["sft"]
    assert sft["success"] >= base["success"]
    assert sft["mean_progress"] > base["mean_progress"] + 0.1, (base["mean_progress"], sft["mean_progress"])
    grpo_dir = out / summary["stages"]["grpo"]["dir"]
    # The reward of the tasks each step drew, before dynamic sampling swapped the groups that all succeeded alike
    # (the trained batch's `reward` leaves out more of those as the policy improves).
    rewards = [json.loads(line)["drawn_reward"] for line in (grpo_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rewards) == 8
    first, last = quarter_means(rewards)
    assert last > first, rewards
    assert summary["stages"]["grpo"]["result"]["drawn_reward_quarters"] == [round(first, 4), round(last, 4)]


TINY = [
    "stages.collect.tasks=200",
    "stages.sft.max_steps=12",
    *(f"stages.{e}.tasks=8" for e in ("eval-base", "eval-sft", "eval-rft", "eval-grpo")),
    "stages.rft.tasks=4",
    "stages.rft.train.max_steps=2",
    "stages.grpo.steps=2",
]


def _eval_episodes(out, summary) -> dict[str, list]:
    """Each evaluation's episodes (task, sample, every message), in file order."""
    episodes = {}
    for name in summary["eval"]:
        lines = (out / "eval" / name / "episodes.jsonl").read_text().splitlines()
        episodes[name] = [(e["task_id"], e["sample"], e["messages"]) for e in map(json.loads, lines)]
    return episodes


@pytest.mark.slow
def test_the_quickstart_recipe_run_twice_gives_the_same_table_and_episodes(tmp_path):
    """Determinism on a CPU: the same recipe and seeds, run twice, give the same results (the README's table)
    and the same evaluation episodes, message for message (a tiny budget of the shipped recipe, ~4 minutes)."""
    runs = []
    for name in ("a", "b"):
        out = tmp_path / name
        summary = run_recipe(load_recipe("quickstart", overrides=TINY), out, console=Console(quiet=True))
        table = {k: (v["success"], v["mean_progress"], v["n_episodes"]) for k, v in summary["eval"].items()}
        runs.append((table, _eval_episodes(out, summary)))
    assert set(runs[0][0]) == {"base", "sft", "rft", "grpo"}
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
