"""The tiny offline model and tokenizer (`turnforge.tiny_model`): a small Qwen3, a BPE trained on the envs' text
with Qwen3's chat tokens and template, built once per run (`resolve_model`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.household.scene import entity_names
from turnforge.formats.chat_template import trl_chat_template
from turnforge.formats.families import QWEN3_TOKENS
from turnforge.models import load_model
from turnforge.recipes import load_recipe
from turnforge.stages.context import RunContext
from turnforge.tiny_model import HOUSEHOLD, SIZES, build_tiny_model, resolve_model, tiny_config


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_tiny_model_is_a_small_qwen3_with_qwen3s_chat_tokens_and_template(tiny_model_dir, tokenizer):
    model, loaded = load_model(tiny_model_dir, device="cpu")
    assert isinstance(model, Qwen3ForCausalLM) and model.dtype == torch.float32
    assert 1_000_000 <= model.num_parameters() <= 4_000_000
    assert model.config.vocab_size == len(tokenizer) and model.config.tie_word_embeddings
    assert loaded.chat_template == trl_chat_template("qwen3_instruct_2507.jinja")
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert loaded.padding_side == "left"
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    # Qwen3's added tokens are single ids; the <|...|> ones are special, the tool/think tags are not (as in Qwen3)
    for token, special in QWEN3_TOKENS:
        [token_id] = tokenizer.encode(token)
        assert (tokenizer.decode([token_id], skip_special_tokens=True) == "") == special, token
    info = json.loads((tiny_model_dir / "turnforge_tiny.json").read_text())
    assert info["size"] == "tiny" and info["parameters"] == model.num_parameters()
    # the household's words are whole tokens: the BPE learned from the env's text
    assert tokenizer.tokenize(" countertop") == ["Ġcountertop"]


def test_tiny_tokenizer_holds_every_household_name_as_one_token(tokenizer):
    """A name and its number are one token (`TINY_SPLIT`), the rare ones too (`EnvSpec.vocabulary`)."""
    names = entity_names()
    assert {"cabinet 7", "apple 11", "sinkbasin 1", "loc 63"} <= set(names)
    assert [n for n in names if len(tokenizer.tokenize(" " + n)) != 1] == []
    text = "You arrive at loc 11. On the cabinet 12, you see a kettle 1, and a soapbottle 2."
    assert tokenizer.tokenize(text)[:7] == ["You", "Ġarrive", "Ġat", "ĠlocĠ11", ".", "ĠOn", "Ġthe"]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    # a word and number the corpus never had is pieces, and the text still round-trips
    assert tokenizer.decode(tokenizer.encode("LIMIT 12;")) == "LIMIT 12;"


def test_tiny_tokenizer_renders_tools_and_tool_calls_like_qwen3(tokenizer):
    messages = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "act", "arguments": {"action": "look"}}}]},
        {"role": "tool", "content": "You see a desk 1."},
    ]
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nLook.<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nYou see a desk 1.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)["input_ids"]
    assert tokenizer.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_level_bpe_round_trips_any_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_sizes():
    counts = {}
    for size in SIZES:
        with torch.device("meta"):
            counts[size] = Qwen3ForCausalLM(tiny_config(size, vocab_size=3072)).num_parameters()
    assert 2_000_000 <= counts["tiny"] <= 4_000_000 and 8_000_000 <= counts["small"] <= 10_500_000, counts
    with pytest.raises(ValueError, match="unknown tiny model size 'huge'; choose one of: tiny, small"):
        build_tiny_model("unused", size="huge")


def test_a_build_is_deterministic(tiny_model_dir, tmp_path):
    """Two builds with the same arguments are the same model, file for file (what lets the suite build each tiny
    model once, conftest's `build_tiny`, and a tiny model built on any day equal the one measured)."""
    again = build_tiny_model(tmp_path / "tiny")
    files = sorted(p.name for p in tiny_model_dir.iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    for name in files:
        assert (tiny_model_dir / name).read_bytes() == (again / name).read_bytes(), name


def test_resolve_model_builds_tiny_once(tmp_path, monkeypatch):
    built = []

    def fake_build(out_dir, envs, family):
        built.append((out_dir, envs, family))
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        return out_dir

    monkeypatch.setattr("turnforge.tiny_model.build_tiny_model", fake_build)
    assert resolve_model("Qwen/Qwen3-4B-Instruct-2507", tmp_path) == "Qwen/Qwen3-4B-Instruct-2507"
    assert resolve_model("tiny", tmp_path, [("sql", {})]) == str(tmp_path / "tiny")
    assert resolve_model("tiny", tmp_path) == str(tmp_path / "tiny")  # kept: its run was trained with it
    assert resolve_model("tiny:llama3", tmp_path) == str(tmp_path / "tiny-llama3")  # another family: its own folder
    assert built == [(tmp_path / "tiny", [("sql", {})], "qwen3"), (tmp_path / "tiny-llama3", HOUSEHOLD, "llama3")]
    with pytest.raises(ValueError, match="unknown model family 'gpt2'; choose one of: "):
        resolve_model("tiny:gpt2", tmp_path)


TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
needs_tau2 = pytest.mark.skipif(not (TAU2 / "retail" / "db.json").is_file(), reason="../shared/data/tau2 absent")


@pytest.mark.parametrize("domain", ["desk", pytest.param("retail", marks=needs_tau2)])
def test_a_service_recipes_tiny_model_holds_its_first_prompt_well_inside_its_context(domain, tmp_path):
    """Issue 40 (9): the tiny tokenizer was trained on household text whatever the recipe's env: tau2 retail's first
    prompt (policy + tool schemas, 20,205 characters) was 9,637 tokens, past the model's 4,096 positions; desk's
    (8,042 characters) 3,663. Now each is trained on its domain: ~4.2 characters a token."""
    options = [f"env.options.domain={domain}"] + ([f"env.options.data_dir={TAU2 / domain}"] if domain != "desk" else [])
    recipe = load_recipe("tau_sft_rft_grpo_tiny", options)
    model_dir = Path(RunContext(recipe, tmp_path).base_model().path)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    options = {**recipe.env_options(), "user": "scripted"}  # (the recipe's model user needs a role; the prompt is the same)
    env = make_env("service", **options)
    messages = [m.to_dict() for m in env.reset(load_tasks("service", "train", limit=1, **options)[0])]
    text = tokenizer.apply_chat_template(messages, tools=env.tools(), tokenize=False, add_generation_prompt=True)
    tokens = len(tokenizer(text)["input_ids"])
    assert len(text) / tokens > 3.5, (len(text), tokens)  # the household tokenizer: 2.1-2.2 characters a token
    assert tokens < Qwen3Config.from_pretrained(model_dir).max_position_embeddings / 2
    name = "get_order_details" if domain == "retail" else "get_appointment_details"
    assert len(tokenizer.tokenize(f" {name}")) == 3  # " get", "_order", "_details": the tool names (EnvSpec.vocabulary)


def test_every_household_recipe_gets_the_tokenizer_the_quickstart_was_measured_with():
    """Only the options that choose an env's text reach the corpus (`EnvSpec.corpus_options`): household has
    none, so the quickstart's options (small rooms, act_line, goal thoughts) leave its tokenizer as it was."""
    from turnforge.tiny_model import HOUSEHOLD, corpus_envs

    assert corpus_envs(load_recipe("quickstart").envs()) == list(HOUSEHOLD) == [("household", {})]
    assert corpus_envs([("sql", {"format": "react_sql", "max_rounds": 3}), ("sql", {"format": "react_sql"})]) == [
        ("sql", {"format": "react_sql"})]
