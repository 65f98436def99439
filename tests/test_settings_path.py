"""One path for a setting (issue 41, point 3): a stage's typed config is its trainer's settings and its policy's
sampling group, declared once; env options are declared once per family and read where the env is made.

Before: each training stage's fields were copied from a settings dataclass into a pydantic model built with
`create_model`, then copied back into a dataclass for the trainer (`settings()`, `settings_of`, rft's untyped
`train` table); the sampling group was declared in five places; household's options had a second set of defaults
in its constructor, and a stage's `env = { grammar = 0.4 }` passed the recipe check but crashed the env."""

from __future__ import annotations

import inspect
import json
import tomllib
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.envs.base import get_env_spec, make_env
from turnforge.envs.household import HouseholdEnv
from turnforge.pipeline import plan_stages
from turnforge.recipes import load_recipe
from turnforge.recipes.loading import RecipeError, packaged_recipes, parse_recipe
from turnforge.stages import stage_kind
from turnforge.stages.config import RolloutStage, TrainStage
from turnforge.stages.context import ModelRef, RunContext
from turnforge.train.settings import DPOSettings, GRPOSettings, SFTSettings, TrainerSettings
from turnforge.types import SamplingParams

HASHES = Path(__file__).with_name("stage_hashes.json")

EVERY_KIND = """
name = "synth"
[model]
name = "tiny"
lora = { r = 4, alpha = 8 }
[env]
name = "household"
[env.options]
grammar = "0.4"
[[stages]]
kind = "collect"
tasks = 4
noise = 0.1
stop = ["X"]
top_k = 5
[[stages]]
kind = "sft"
data = ["collect"]
epochs = 2
max_length = 512
packing = "batch"
[[stages]]
kind = "rft"
samples = 2
top_p = 0.5
[stages.train]
epochs = 1
max_steps = 3
warmup_ratio = 0
[[stages]]
kind = "dpo"
data = ["collect"]
beta = 0.2
sft_weight = 1
[[stages]]
kind = "grpo"
steps = 3
temperature = 1
top_k = 3
explore = 0.5
[stages.rewards]
progress = 0.5
[[stages]]
kind = "envtune"
steps = 2
[[stages.phases]]
name = "hints"
steps = 1
env = { hints = true }
rewards = { progress = 1 }
[[stages.phases]]
name = "plain"
steps = 1
[[stages]]
kind = "eval"
name = "final"
tasks = 3
max_new_tokens = 32
"""
"""A recipe with every stage kind and settings away from their defaults (rft's `epochs = 1` written as an int)."""


def _hashes(recipe, tmp_path: Path) -> dict[str, str]:
    return {plan.stage.id: plan.hash for plan in plan_stages(recipe, tmp_path)}


def test_stage_hashes_are_those_runs_were_made_with(tmp_path):
    """A finished run must not redo its stages after an upgrade: the packaged recipes' stage hashes (and those of a
    recipe with every kind) are the ones computed before the settings path changed. A recipe edited on purpose
    changes its own: update tests/stage_hashes.json with it."""
    expected = json.loads(HASHES.read_text(encoding="utf-8"))
    now = {name: _hashes(load_recipe(path), tmp_path) for name, path in packaged_recipes().items()}
    now["synth"] = _hashes(parse_recipe(tomllib.loads(EVERY_KIND)), tmp_path)
    assert now == expected


@pytest.mark.parametrize(("kind", "settings"), [
    ("sft", SFTSettings), ("dpo", DPOSettings), ("grpo", GRPOSettings), ("envtune", GRPOSettings)])
def test_a_training_stage_is_its_trainers_settings(kind, settings):
    """Each field is declared once, in train/settings.py: the stage's table has it, with its type, default and
    documentation (the recipe schema), and no copy of the class is built."""
    config = stage_kind(kind).config
    assert issubclass(config, settings) and issubclass(config, TrainStage)
    schema = config.model_json_schema()["properties"]
    for name, field in settings.model_fields.items():
        assert config.model_fields[name].default == field.default, name
        assert schema[name].get("description") == field.description, name
    assert schema["learning_rate"]["description"].startswith(("Peak learning rate", "AdamW peak learning rate"))


def test_grpo_settings_derive_from_the_shared_trainer_settings_and_the_sampling_group():
    assert issubclass(GRPOSettings, TrainerSettings) and issubclass(GRPOSettings, SamplingParams)
    own = {name for name in GRPOSettings.__annotations__ if not name.isupper()}
    redeclared = own & (set(TrainerSettings.model_fields) | set(SamplingParams.model_fields))
    assert redeclared == {"learning_rate", "logging_steps"}  # their GRPO defaults only
    settings = GRPOSettings(temperature=0.7, top_k=4, explore=0.5, seed=3)
    assert settings.sampling() == SamplingParams(temperature=0.7, top_k=4, explore=0.5, seed=3)
    assert settings.trl_kwargs()["top_k"] == 4 and settings.trl_kwargs()["learning_rate"] == 1e-5


def test_the_stage_object_is_what_the_trainer_gets(tmp_path, monkeypatch):
    """A setting written in a recipe reaches `run_sft` / `run_grpo` as the stage object itself, no rebuilt copy."""
    sft = pytest.importorskip("turnforge.train.sft")
    grpo = pytest.importorskip("turnforge.train.grpo")
    recipe = parse_recipe(tomllib.loads(EVERY_KIND))
    received = []
    monkeypatch.setattr(sft, "run_sft", lambda *args: received.append(args[3]) or {})
    monkeypatch.setattr(grpo, "run_grpo", lambda *args: received.append(args[5]) or {})
    monkeypatch.setattr(RunContext, "model", lambda self, source: ModelRef("base", None))
    ctx = RunContext(recipe, tmp_path)
    for index in (1, 4):
        stage = recipe.stages[index]
        stage_kind(stage.kind).run(stage, index, tmp_path / stage.id, ctx)
    sft_stage, grpo_stage = recipe.stages[1], recipe.stages[4]
    assert received[0] is sft_stage and received[0].packing == "batch" and received[0].lora.r == 4
    assert received[1] is grpo_stage and received[1].sampling().explore == 0.5


def test_rfts_train_table_is_an_sft_settings_hashed_as_written(tmp_path):
    recipe = parse_recipe(tomllib.loads(EVERY_KIND))
    rft = recipe.stages[2]
    assert isinstance(rft.train, SFTSettings) and rft.train.epochs == 1.0 and rft.train.max_steps == 3
    assert rft.hash_inputs()["train"] == {"epochs": 1, "max_steps": 3, "warmup_ratio": 0}  # as the recipe wrote it
    for bad, message in (("max_steps = 0", "stages.rft.train.max_steps: max_steps=0: expected -1 (run `epochs`) or "
                          "at least 1"), ("learnig_rate = 1e-3", "stages.rft.train.learnig_rate: unknown key")):
        with pytest.raises(RecipeError) as caught:
            parse_recipe(tomllib.loads(EVERY_KIND.replace("max_steps = 3", bad)))
        assert message in str(caught.value)


@pytest.mark.parametrize("kind", ["collect", "eval", "rft"])
def test_rollout_stages_sample_with_the_one_sampling_group(kind):
    config = stage_kind(kind).config
    assert issubclass(config, RolloutStage) and issubclass(config, SamplingParams)
    def declared(field):
        return field.annotation, field.metadata, field.description, field.get_default(call_default_factory=True)

    for name in ("top_p", "top_k", "max_new_tokens", "stop", "seed", "explore"):
        assert declared(config.model_fields[name]) == declared(SamplingParams.model_fields[name]), name
    assert config.model_fields["temperature"].metadata == SamplingParams.model_fields["temperature"].metadata


def test_a_bad_sampling_value_is_one_line_at_its_key_in_every_stage_kind():
    bad = EVERY_KIND.replace("top_k = 5", "top_k = -1").replace("top_k = 3", "top_p = 0")
    with pytest.raises(RecipeError) as caught:
        parse_recipe(tomllib.loads(bad))
    lines = str(caught.value).splitlines()[1:]
    assert [line.split(": ")[1] for line in lines] == ["stages.collect.top_k", "stages.grpo.top_p"], lines


def test_a_sampling_field_new_to_a_kind_enters_its_hash_only_when_set(tmp_path):
    """Rollout stages gained `explore` and grpo `stop` (the group is one type): at their default they leave
    the stage's hash as it was; set, they change it."""
    base = _hashes(parse_recipe(tomllib.loads(EVERY_KIND)), tmp_path)
    grpo = 'kind = "grpo"\n'
    at_default = EVERY_KIND.replace("max_new_tokens = 32", "max_new_tokens = 32\nexplore = 1.0").replace(
        grpo, grpo + "stop = []\n")
    assert _hashes(parse_recipe(tomllib.loads(at_default)), tmp_path) == base
    text = EVERY_KIND.replace("max_new_tokens = 32", "max_new_tokens = 32\ntemperature = 1.0\nexplore = 0.5").replace(
        grpo, grpo + 'stop = ["Observation:"]\n')
    changed = _hashes(parse_recipe(tomllib.loads(text)), tmp_path)
    assert changed["eval-final"] != base["eval-final"] and changed["grpo"] != base["grpo"]


def test_the_eval_commands_sampling_options_are_the_sampling_groups():
    command = next(c for c in app.registered_commands if c.name == "eval").callback
    parameters, hints = inspect.signature(command).parameters, typing.get_type_hints(command, include_extras=True)
    defaults = SamplingParams()
    for name in ("top_p", "top_k", "max_new_tokens", "seed", "stop"):
        assert parameters[name].default in (getattr(defaults, name), None), name
        assert hints[name].__metadata__[0].help == SamplingParams.model_fields[name].description, name
    assert parameters["temperature"].default == stage_kind("eval").config.model_fields["temperature"].default == 0.0


def test_the_eval_command_refuses_bad_sampling_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--env", "household", "--top-p", "0", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: SamplingParams: top_p: Input should be greater than 0"), result.output


def test_serve_checks_a_requests_sampling_with_the_sampling_group():
    fastapi = pytest.importorskip("fastapi")  # noqa: F841 — serve's own dependency
    from turnforge.policies.serve import APIError, ChatRequest, _sampling

    ok = _sampling(ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_k=-1, stop="."), 8)
    assert (ok.temperature, ok.top_k, ok.max_new_tokens, ok.stop) == (1.0, 0, 8, ["."])
    with pytest.raises(APIError) as caught:
        _sampling(ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_p=0), 8)
    assert caught.value.status == 400 and caught.value.param == "top_p"


def test_an_env_option_given_as_a_toml_number_reaches_the_env_as_its_text():
    """A stage's `env = { grammar = 0.4 }` passed the recipe check (which read it as "0.4") but reached the env as
    the float 0.4, and every episode failed at reset ("grammar must be one of ('0.3', '0.4'), got 0.4")."""
    env = make_env("household", grammar=0.4, hints=1)
    assert env.grammar == "0.4" and env.hints is True


def test_household_declares_each_option_once():
    """Its constructor has no defaults of its own: make_env gives it every option, defaults from its EnvOptions."""
    spec = get_env_spec("household")
    signature = inspect.signature(HouseholdEnv)
    assert all(p.default is inspect.Parameter.empty for p in signature.parameters.values())
    env = make_env("household")
    assert (env.grammar, env.hints, env.max_steps, env.expert) == tuple(
        spec.defaults()[name] for name in ("grammar", "hints", "max_steps", "expert"))
