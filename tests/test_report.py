"""The report (Markdown + self-contained HTML) and the model card, written from a real tiny run's files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from run_documents import assert_documented
from turnforge.cli import app
from turnforge.eval.curves import quarter_means
from turnforge.eval.failures import episode_failures
from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe
from turnforge.report import write_report
from turnforge.types import Message, Score, StopReason, Trajectory, Turn

SCRIPTED = """\
name = "scripted"

[env]
name = "household"

[[stages]]
kind = "eval"
name = "random"
policy = "random"
tasks = 4
samples = 2
"""


def test_the_run_report_has_every_section_and_its_html_needs_no_other_file(quickstart_run):
    out, summary = quickstart_run
    write_report(out)
    md = (out / "report.md").read_text()
    for section in ("## Evaluation", "## Per category (95% Wilson intervals)", "## Stop reasons", "## Failure modes",
                    "## Stages", "## Stage settings", "## Training curves", "## Recipe (resolved)"):
        assert section in md
    # per category, evaluation after evaluation, with the Wilson interval of 0/1
    assert "| pick_and_place_simple | grpo | 0.0% (0–79, n=1) | pass@1 0.0% | pass^1 0.0% | 0.000 |" in md
    assert f"| max_turns | {summary['eval']['base']['stop_reasons']['max_turns']} (100%) |" in md
    assert "| `stages/02-sft` | sft | " in md and f"{summary['stages']['sft']['result']['tokens']} trained" in md
    assert "![grpo reward per step](plots/grpo_reward.png)" in md and (out / "plots/grpo_reward.png").exists()
    assert (out / "plots/grpo_drawn_reward.png").exists()
    drawn = [json.loads(x)["drawn_reward"] for x in (out / summary["stages"]["grpo"]["dir"] / "rollouts.jsonl").read_text().splitlines()]
    first, last = quarter_means(drawn)
    assert summary["stages"]["grpo"]["result"]["drawn_reward_quarters"] == [round(first, 4), round(last, 4)]
    assert f"reward on the drawn tasks {first:.2f} → {last:.2f} (first → last quarter)" in md
    loop = next(line for line in md.splitlines() if line.startswith("| loop |"))
    assert "](eval/base/episodes.jsonl) line 1" in loop  # one linked example
    html = (out / "report.html").read_text()
    assert "<table>" in html and html.count("data:image/png;base64,") == md.count("](plots/")
    assert not re.search(r'(src|href)="(https?:)?//', html)  # no external asset


def test_quarter_means_by_hand():
    assert quarter_means([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == (1.5, 7.5)  # quarters of 2
    assert quarter_means([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]) == (1.5, 8.5)  # 9 // 4 = 2
    assert quarter_means([2.0, 4.0]) == (2.0, 4.0)  # fewer than 4: the first and the last value
    assert quarter_means([]) is None


def test_failure_modes_of_one_episode_by_hand():
    replies = ["ACTION: look", "ACTION: look", "I think the task is done", "ACTION: go to desk 1"]
    messages = [Message("user", "task")]
    for reply in replies:
        messages += [Message("assistant", reply), Message("user", "same room")]
    turns = [Turn(r, parse_ok=k != 2, progress=0.0) for k, r in enumerate(replies)]
    traj = Trajectory("t", "household", "c", messages, turns, Score(False, 0.0, 0.0, {"invalid_actions": 1, "tool_errors": 1}),
                      StopReason.max_turns)
    assert episode_failures(traj) == {"loop": 1, "invalid_action": 1, "premature_success": 1, "format_error": 1}


def test_compare_puts_two_runs_side_by_side(quickstart_run, tmp_path):
    scripted = tmp_path / "scripted"
    recipe = tmp_path / "scripted.toml"
    recipe.write_text(SCRIPTED)
    run_recipe(load_recipe(recipe), scripted, console=Console(quiet=True))
    result = CliRunner().invoke(app, ["report", str(quickstart_run[0]), str(scripted), "--compare", "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "cmp/report.md").read_text()
    assert "| metric | qs:base | qs:sft | qs:rft | qs:grpo | scripted:random |" in md
    assert "| pick_and_place_simple | scripted:random |" in md
    assert (tmp_path / "cmp/report.html").exists()
    assert not (scripted / "stages/01-eval-random/model").exists()  # no training: no model card either


def _front_matter(text: str) -> tuple[dict, str]:
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert match, text[:200]
    return yaml.safe_load(match.group(1)), match.group(2)


def test_the_model_card_parses_and_its_model_index_equals_summary_json(quickstart_run, tmp_path):
    out, _ = quickstart_run
    card_path = out / "stages/07-grpo/model/README.md"  # written by the run, next to the final model
    meta, body = _front_matter(card_path.read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert meta["license"] == "apache-2.0" and {"turnforge", "household", "sft", "grpo"} <= set(meta["tags"])
    (index,) = meta["model-index"]
    values = {}
    for result in index["results"]:
        assert result["dataset"]["split"] == "test" and result["task"]["type"] == "text-generation"
        values |= {m["name"]: m["value"] for m in result["metrics"]}
    grpo = summary["eval"]["grpo"]  # the final model's evaluation, and only it
    assert values == {"success (grpo)": grpo["success"], "mean reward (grpo)": grpo["mean_reward"],
                      "mean progress (grpo)": grpo["mean_progress"]}
    for heading in ("## Training pipeline", "## Data", "## Evaluation", "## Prompt and action format", "## Usage",
                    "## Limitations"):
        assert heading in body
    assert "AutoModelForCausalLM.from_pretrained" in body and "PeftModel" not in body
    assert "12 episodes of policy `expert` on household / train" in body
    assert "splits not evaluated: train, valid_seen" in body

    result = CliRunner().invoke(app, ["card", str(out), "--out", str(tmp_path / "card.md")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "card.md").read_text() == card_path.read_text()


def test_an_adapter_card_shows_peft_usage_and_a_run_without_a_model_has_no_card(quickstart_run, tmp_path):
    from turnforge.card import usage_section, write_card

    text = "\n".join(usage_section(Path("m"), True, "Qwen/Qwen3-4B-Instruct-2507", "household"))
    assert "PeftModel.from_pretrained(base, 'm')" in text and "'Qwen/Qwen3-4B-Instruct-2507'" in text
    recipe = tmp_path / "scripted.toml"
    recipe.write_text(SCRIPTED)
    run_recipe(load_recipe(recipe), tmp_path / "run", console=Console(quiet=True))
    with pytest.raises(ValueError, match="no training stage saved a model"):
        write_card(tmp_path / "run")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "not a finished run directory" in result.output


ALFWORLD_SFT_TINY = [
    "env.options.receptacles=0.3", "env.options.distractors=0", "stages.collect.tasks=4", "stages.sft.max_steps=2",
    "stages.sft.grad_accum=1", "stages.sft.max_length=512", "stages.sft.logging_steps=1", "stages.sft.lora.r=8",
    *(f"stages.{e}.{k}" for e in ("base", "eval-sft") for k in ("tasks=2", "max_turns=2", "max_new_tokens=16")),
]


@pytest.mark.slow  # ~40 s: the one recipe no other test runs on the tiny model
def test_the_alfworld_sft_recipe_on_the_tiny_model_writes_its_report_and_card(tmp_path):
    run_recipe(load_recipe("alfworld_sft", overrides=ALFWORLD_SFT_TINY, model="tiny"), tmp_path, console=Console(quiet=True))
    assert_documented(tmp_path)


def test_the_readme_results_block_is_filled_from_the_run(quickstart_run, tmp_path):
    out, summary = quickstart_run
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- turnforge results: begin -->\nstale table\n<!-- turnforge results: end -->\nafter\n")
    result = CliRunner().invoke(app, ["report", str(out), "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    text = readme.read_text()
    assert text.startswith("intro\n<!-- turnforge results: begin -->\n| model |") and text.endswith("<!-- turnforge results: end -->\nafter\n")
    assert "stale table" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "**" in line]
    assert len(rows) == len(summary["eval"]) == 4  # base, sft, rft, grpo: one row each, in recipe order
    assert rows[0].startswith("| untrained ")
    for row, (name, ev) in zip(rows, summary["eval"].items(), strict=True):
        assert f"**{100 * ev['success']:.1f} %**" in row and f"n = {ev['n_episodes']}" in row, (name, row)
    assert rows[1].startswith(f"| sft: {summary['stages']['sft']['result']['steps']} steps")
    machine = summary["machine"]
    assert f"on {machine['cpu']}, {machine['cores']} cores" in text
    readme.write_text("no block here\n")
    result = CliRunner().invoke(app, ["report", str(out), "--readme", str(readme)])
    assert result.exit_code != 0 and "has no <!-- turnforge results: begin -->" in result.output


def test_compare_shows_the_do_nothing_floor_where_the_env_computes_it():
    from turnforge.report import comparison_rows

    def summary(floor):
        return {"success": 0.5, "success_ci": [0.3, 0.7], "pass@k": {}, "pass^k": {}, "mean_reward": 0.5,
                "mean_progress": 0.5, "mean_turns": 3, "n_episodes": 4, "by_category": {},
                "env_metrics": {"retail": {"do_nothing_floor": floor}} if floor is not None else {}}

    rows = {row.label: row.values for row in comparison_rows({"a": summary(0.25), "b": summary(0.25)})}
    assert rows["do-nothing floor"] == [0.25, 0.25]
    assert "do-nothing floor" not in {row.label for row in comparison_rows({"a": summary(None)})}
