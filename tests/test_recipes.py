"""Recipes: TOML -> typed configs; every bad key or value is an error naming the file, line and key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.recipes import (
    CollectStage,
    EvalStage,
    RecipeError,
    find_recipe,
    load_recipe,
    packaged_recipes,
    parse_recipe,
)
from turnforge.recipes.toml_text import dump_toml, key_line

SCRIPTED = """\
name = "scripted"

[env]
name = "household"
format = "act_line"

[env.options]
grammar = "0.3"

[[stages]]
kind = "collect"
tasks = 6

[[stages]]
kind = "eval"
name = "random"
policy = "random"
tasks = 6
samples = 2

[[stages]]
kind = "eval"
name = "expert"
policy = "expert"
tasks = 6
"""


def _write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _line(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if fragment in line)


def _error(path: Path, **kw) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, **kw)
    return str(info.value)


def test_a_scripted_recipe_parses_with_defaults_and_ids(tmp_path):
    recipe = load_recipe(_write(tmp_path, SCRIPTED))
    assert recipe.name == "scripted" and recipe.model.name == "tiny"
    assert [s.id for s in recipe.stages] == ["collect", "eval-random", "eval-expert"]
    collect, random, _ = recipe.stages
    assert isinstance(collect, CollectStage) and isinstance(random, EvalStage)
    assert (collect.policy, collect.split, collect.tasks, collect.temperature) == ("expert", "train", 6, 1.0)
    assert (random.split, random.samples, random.temperature) == ("test", 2, 0.0)
    assert recipe.env_options() == {"grammar": "0.3", "format": "act_line"}


def test_an_unknown_key_names_the_file_the_line_and_the_key(tmp_path):
    path = _write(tmp_path, SCRIPTED.replace("samples = 2", "sampels = 2"))
    message = _error(path)
    assert f"{path}:{_line(SCRIPTED, 'samples = 2')}: stages.eval-random.sampels: unknown key" in message
    assert "samples" in message.split("sampels: unknown key")[1]  # the keys it accepts


def test_a_bad_value_names_the_key_and_the_value(tmp_path):
    text = SCRIPTED.replace("tasks = 6", 'tasks = "many"', 1)
    message = _error(_write(tmp_path, text))
    assert (
        f"recipe.toml:{_line(text, 'many')}: stages.collect.tasks:" in message and "(got 'many')" in message
    )


def test_every_problem_is_reported_at_once(tmp_path):
    text = SCRIPTED.replace('grammar = "0.3"', 'grammar = "0.5"\ngrammer = 1').replace(
        'policy = "expert"\ntasks = 6', 'policy = "expert"\ntasks = 6\nsplit = "dev"\nmodel = "nowhere"'
    )
    path = _write(tmp_path, text)
    lines = _error(path).splitlines()[1:]
    assert len(lines) == 4, lines
    grammar = _line(text, "grammar =")
    assert any(f":{grammar}: env.options.grammar:" in line and "0.3, 0.4" in line for line in lines)
    assert any(
        f":{grammar + 1}: env.options.grammer:" in line and "no option 'grammer'" in line for line in lines
    )
    assert any("stages.eval-expert.split:" in line and "no split 'dev'" in line for line in lines)
    assert any("stages.eval-expert.model:" in line and "'nowhere'" in line for line in lines)


def test_unknown_stage_kind_and_top_level_key(tmp_path):
    path = _write(tmp_path, "seed = 1\n" + SCRIPTED.replace('kind = "collect"', 'kind = "colect"'))
    message = _error(path)
    assert f"{path}:1: seed: unknown key" in message
    assert "stages[0].kind: unknown stage kind 'colect'; kinds are collect, sft, " in message and "eval" in message


def test_duplicate_stage_ids_are_an_error(tmp_path):
    path = _write(tmp_path, SCRIPTED.replace('name = "expert"', 'name = "random"'))
    assert "stage id 'eval-random' is already used by stages[1]" in _error(path)


def test_set_addresses_stages_by_id_name_or_position_and_reads_toml_values(tmp_path):
    path = _write(tmp_path, SCRIPTED)
    recipe = load_recipe(
        path,
        overrides=[
            "stages.eval-random.samples=4",  # id
            "stages.expert.max_turns=7",  # name
            "stages.0.tasks=3",  # position
            "env.options.hints=true",
            "stages.random.temperature=0.7",
        ],
        model="Qwen/Qwen3-4B-Instruct-2507",  # not TOML: kept as a string
    )
    collect, random, expert = recipe.stages
    assert (collect.tasks, random.samples, random.temperature, expert.max_turns) == (3, 4, 0.7, 7)
    assert recipe.env.options["hints"] is True
    assert recipe.model.name == "Qwen/Qwen3-4B-Instruct-2507"


def test_a_bad_set_value_points_at_the_set_option(tmp_path):
    path = _write(tmp_path, SCRIPTED)
    message = _error(path, overrides=["stages.random.samples=0"])
    assert "--set stages.random.samples=0: stages.eval-random.samples:" in message
    assert "greater than or equal to 1" in message
    assert "no stage 'nope'; stages are collect, eval-random, eval-expert" in _error(
        path, overrides=["stages.nope.tasks=1"]
    )
    assert "is not KEY.PATH=VALUE" in _error(path, overrides=["stages.random.tasks"])


def test_the_resolved_recipe_round_trips_through_toml(tmp_path):
    recipe = load_recipe(_write(tmp_path, SCRIPTED), overrides=["stages.random.top_p=0.9"])
    again = parse_recipe(tomllib.loads(recipe.to_toml()))
    assert again.to_dict() == recipe.to_dict()


def test_packaged_recipes_are_found_by_bare_name():
    assert {"quickstart", "alfworld_sft"} <= set(packaged_recipes())
    path = packaged_recipes()["quickstart"]
    assert (
        find_recipe("quickstart")
        == find_recipe("quickstart.toml")
        == find_recipe("recipes/quickstart.toml")
        == path
    )
    with pytest.raises(FileNotFoundError, match="no recipe 'nope'.*quickstart"):
        find_recipe("nope")


def test_key_line_finds_keys_in_arrays_of_tables_and_their_sub_tables():
    text = '[model]\nname = "x"\n\n[[stages]]\nkind = "a"\n\n[[stages]]\nkind = "sft"\n[stages.lora]\nr = 4\n'
    assert key_line(text, ("model", "name")) == 2
    assert key_line(text, ("stages", 1, "kind")) == 8
    assert key_line(text, ("stages", 1, "lora", "r")) == 10
    assert key_line(text, ("stages", 1, "lora", "alpha")) == 9  # missing: its table
    assert key_line(text, ("stages", 0, "tasks")) == 4
    assert key_line(text, ("env", "name")) is None


def test_dump_toml_writes_tables_arrays_of_tables_and_sub_tables():
    data = {
        "name": "x",
        "model": {"name": "tiny", "lora": None},
        "stages": [{"kind": "a", "data": ["p", "q"]}, {"kind": "sft", "lora": {"r": 4, "t": "all-linear"}}],
    }
    expected = {**data, "model": {"name": "tiny"}}
    assert tomllib.loads(dump_toml(data)) == expected


def test_cli_run_reports_a_bad_recipe_without_a_traceback(tmp_path):
    path = _write(tmp_path, SCRIPTED.replace("samples = 2", "samples = -2"))
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert (
        "error:" in result.output
        and f"{path}:" in result.output
        and "stages.eval-random.samples" in result.output
    )
    assert not (tmp_path / "run").exists()


def test_cli_run_check_prints_the_resolved_recipe(tmp_path):
    path = _write(tmp_path, SCRIPTED)
    result = CliRunner().invoke(
        app, ["run", str(path), "--out", str(tmp_path / "run"), "--check", "--set", "stages.0.tasks=2"]
    )
    assert result.exit_code == 0, result.output
    assert tomllib.loads(result.output)["stages"][0]["tasks"] == 2
    assert not (tmp_path / "run").exists()


# The SFT stage's fields are SFTSettings' own: these need the training code.


def test_sft_stage_fields_are_the_sft_settings(tmp_path):
    sft = pytest.importorskip("turnforge.train.sft")
    models = pytest.importorskip("turnforge.models")
    text = (
        SCRIPTED
        + '\n[[stages]]\nkind = "sft"\ndata = ["collect"]\nmax_steps = 3\nwindow = 2\n[stages.lora]\nr = 4\n'
    )
    text += '\n[[stages]]\nkind = "eval"\nname = "sft"\nmodel = "sft"\n'
    recipe = load_recipe(_write(tmp_path, text))
    stage = recipe.stages[3]
    settings = stage  # the stage is its trainer's settings
    assert isinstance(settings, sft.SFTSettings) and settings.max_steps == 3 and settings.window == 2
    assert settings.lora == models.LoraSpec(r=4)
    assert recipe.stages[4].window == 2  # an hf eval of an sft model uses the window it was trained with
    assert recipe.model_source(4) == "sft" and recipe.data_sources(3) == ["collect"]

    message = _error(_write(tmp_path, text.replace("max_steps = 3", "max_step = 3"), "bad.toml"))
    assert "stages.sft.max_step: unknown key" in message and "learning_rate" in message


def test_model_lora_is_the_default_of_sft_stages(tmp_path):
    pytest.importorskip("turnforge.train.sft")
    text = '[model]\nname = "tiny"\n[model.lora]\nr = 8\n' + SCRIPTED.split("\n", 1)[1]
    text += '\n[[stages]]\nkind = "sft"\ndata = ["collect"]\n'
    recipe = load_recipe(_write(tmp_path, text))
    assert recipe.stages[3].lora.r == 8


def test_the_packaged_recipes_parse():
    pytest.importorskip("turnforge.train.sft")
    quick = load_recipe("quickstart")
    assert [s.id for s in quick.stages] == [
        "collect", "sft", "eval-base", "eval-sft", "rft", "eval-rft", "grpo", "eval-grpo"]
    assert quick.model_source(5) == "rft" and quick.model_source(6) == "rft" and quick.model_source(7) == "grpo"
    assert quick.model.name == "tiny" and quick.env_options()["format"] == "act_line"
    assert quick.model_source(2) is None and quick.model_source(3) == "sft"
    assert (
        quick.stages[2].window == quick.stages[3].window == quick.stages[1].window
    )  # base and sft: same prompts
    alf = load_recipe("alfworld_sft")
    lora = alf.stages[1].lora
    assert alf.model.name == "Qwen/Qwen3-4B-Instruct-2507" and (lora.r, lora.alpha, lora.dropout) == (
        64,
        128,
        0.0,
    )
    assert alf.stages[1].max_length == 2048 and alf.stages[0].tasks == 3000 and alf.stages[3].tasks == 200


def test_a_trl_table_passes_trls_own_fields_through(tmp_path):
    pytest.importorskip("trl")
    from turnforge.train.sft import sft_config

    text = SCRIPTED + '\n[[stages]]\nkind = "sft"\ndata = ["collect"]\ntrl = { max_grad_norm = 0.5, optim = "adamw_torch" }\n'
    settings = load_recipe(_write(tmp_path, text)).stages[3]
    assert settings.trl == {"max_grad_norm": 0.5, "optim": "adamw_torch"}
    config = sft_config(tmp_path / "out", settings)
    assert config.max_grad_norm == 0.5 and config.optim == "adamw_torch" and config.completion_only_loss


def test_a_trl_table_names_unknown_and_already_set_fields_with_the_other_errors(tmp_path):
    pytest.importorskip("trl")
    text = SCRIPTED.replace("samples = 2", "sampels = 2")
    text += '\n[[stages]]\nkind = "sft"\ndata = ["collect"]\ntrl = { max_grad_nrom = 0.5, learning_rate = 1.0 }\n'
    text += '\n[[stages]]\nkind = "grpo"\ntrl = { bogus = 1 }\n'
    path = _write(tmp_path, text)
    message = _error(path)
    lines = message.splitlines()[1:]
    assert len(lines) == 3, lines
    assert f"{path}:{_line(text, 'sampels')}: stages.eval-random.sampels: unknown key" in message
    sft_line = _line(text, "max_grad_nrom")
    assert f"{path}:{sft_line}: stages.sft.trl: unknown field(s) of TRL's SFTConfig" in message
    assert "max_grad_nrom" in lines[1] and "learning_rate set by this stage's own settings" in lines[1]
    assert f"{path}:{_line(text, 'bogus')}: stages.grpo.trl: unknown field(s) of TRL's GRPOConfig" in message


def test_check_reports_every_bad_training_value_at_its_own_key():
    """Issue 17: learning_rate=-1, weight_decay=-3, epochs=-2 passed --check and failed minutes into the run, and
    warmup_ratio=7 was blamed on the learning_rate flag. Now each is reported, all at once, against its own --set."""
    from turnforge.recipes import load_recipe
    from turnforge.recipes.loading import RecipeError

    bad = ["stages.sft.learning_rate=-1", "stages.sft.weight_decay=-3", "stages.sft.epochs=-2",
           "stages.sft.warmup_ratio=7", "stages.rft.train.learning_rate=-2", "stages.grpo.learning_rate=0"]
    with pytest.raises(RecipeError) as caught:
        load_recipe("quickstart", overrides=bad)
    lines = str(caught.value).splitlines()[1:]
    assert len(lines) == len(bad)
    for pair in bad:
        key = pair.split("=")[0]
        [line] = [x for x in lines if x.strip().startswith(f"--set {pair}:")]
        assert f": {key}: " in line and "expected" in line
