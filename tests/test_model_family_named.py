"""A recipe names its model's family (`[model] family`): the template then names it, for every process and every model
trained from it (`families.named_template`, `models.loading.family_folder`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from transformers import AutoTokenizer

from turnforge.formats.chat_template import ChatTemplateRenderer, trl_chat_template
from turnforge.formats.families import detect_family, get_family, named_template
from turnforge.models.loading import FAMILY_FILE
from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe
from turnforge.tiny_model import resolve_model

RECIPE = """\
name = "named-family"

[model]
name = "{model}"
family = "{family}"

[env]
name = "household"
format = "tool_call"

[[stages]]
kind = "collect"
tasks = 4

[[stages]]
kind = "sft"
data = ["collect"]
max_steps = 2
batch_size = 2
max_length = 2048
learning_rate = 1e-3
"""


def test_a_named_template_reads_as_its_family_and_renders_the_same_text(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "look"}, {"role": "assistant", "content": "ACTION: look"}]
    own = tokenizer.apply_chat_template(messages, tokenize=False)
    tokenizer.chat_template = named_template(tokenizer.chat_template, get_family("qwen3_thinking"))
    assert detect_family(tokenizer.chat_template).name == "qwen3_thinking"  # before the markers (qwen3's)
    assert tokenizer.apply_chat_template(messages, tokenize=False) == own
    renamed = named_template(tokenizer.chat_template, get_family("llama3"))  # named again: one name, the last
    assert detect_family(renamed).name == "llama3" and renamed.count("turnforge family") == 1


def test_an_unknown_family_or_a_tiny_model_of_another_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown model family 'qwen4'; choose one of: deepseek_r1"):
        load_recipe(_recipe(tmp_path, "tiny", "qwen4"))
    with pytest.raises(ValueError, match=r"'tiny:llama3' is a tiny llama3 model, not of family 'qwen3'"):
        resolve_model("tiny:llama3", tmp_path, family="qwen3")
    assert not list(tmp_path.glob("tiny*"))  # refused before anything was built


def test_a_model_without_a_chat_template_trains_as_the_family_the_recipe_names(tiny_model_dir, tmp_path):
    """A base model without a chat template (the tiny model's, its template taken out) with `family = "qwen3"`: the
    run's base model is a folder of links to it, its template Qwen3's, naming the family; the collect and SFT stages
    run on it and the trained model keeps the name."""
    base = tmp_path / "base-lm"
    shutil.copytree(tiny_model_dir, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    assert AutoTokenizer.from_pretrained(base).chat_template is None
    with pytest.raises(ValueError, match=r"has no chat template; name the model's family in the recipe \(\[model\] family"):
        ChatTemplateRenderer(AutoTokenizer.from_pretrained(base))

    out = tmp_path / "run"
    run_recipe(_recipe(tmp_path, base, "qwen3"), out, console=Console(quiet=True))
    folder = out / "models" / "base-lm-as-qwen3"
    assert json.loads((folder / FAMILY_FILE).read_text()) == {
        "model": str(base), "family": "qwen3", "template_read_as": None,
        "template": "the family's (qwen3_instruct_2507.jinja)"}
    assert (folder / "model.safetensors").resolve() == (base / "model.safetensors").resolve()  # a link, not a copy
    assert AutoTokenizer.from_pretrained(base).chat_template is None  # the model itself untouched
    trained = AutoTokenizer.from_pretrained(out / "stages" / "02-sft" / "model").chat_template
    assert detect_family(trained).name == "qwen3"
    assert trained == named_template(trl_chat_template("qwen3_instruct_2507.jinja"), get_family("qwen3"))
    episodes = (out / "stages" / "01-collect" / "trajectories.jsonl").read_text().splitlines()
    assert len(episodes) == 4 and all('<tool_call>\n{"name": ' in json.loads(e)["turns"][0]["text"] for e in episodes)


def test_a_model_whose_template_reads_as_the_named_family_is_used_as_it_is(tiny_model_dir, tmp_path):
    assert resolve_model(str(tiny_model_dir), tmp_path, family="qwen3") == str(tiny_model_dir)
    assert not list(tmp_path.iterdir())


def _recipe(tmp_path: Path, model, family: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(model=model, family=family))
    return path
