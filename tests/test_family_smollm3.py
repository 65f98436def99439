"""SmolLM3 as a model family (issue 63), what is its own: the template is read as SmolLM3's before Qwen3 thinking's
(it holds their markers too); the tools reach a template that reads them only from `xml_tools` (SmolLM3's release
revision); the "Today Date" its template reads from the clock is the renderer's day; its `<think>` reasoning is kept in
the context and trained but never sent to the env. Token-exact episodes, `tiny:smollm3` end to end and `turnforge
serve`: the shared tests in tests/test_families.py (TOOL_FAMILIES)."""

from __future__ import annotations

import pytest

from turnforge.formats.chat_template import (
    ChatTemplateRenderer,
    check_renders_tools,
    render,
    trl_chat_template,
)
from turnforge.formats.families import detect_family, get_family, visible_reply
from turnforge.tiny_model import train_tokenizer
from turnforge.types import Message

TOOL = {"type": "function", "function": {"name": "act", "description": "Perform one command.", "parameters": {
    "type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}}}


@pytest.fixture(scope="module")
def tokenizer():
    """A SmolLM3 tokenizer (its template and added tokens) on a few words: enough to render, in well under a second."""
    return train_tokenizer(iter(["You see a desk 1. ACTION: look"]), get_family("smollm3"), vocab_size=300)


def test_the_template_is_read_as_smollm3_before_qwen3_thinking(tokenizer):
    own = trl_chat_template("turnforge/smollm3.jinja")
    assert all(marker in own for marker in get_family("qwen3_thinking").markers)  # <|im_start|>, <tool_call>, <think>
    assert detect_family(own).name == "smollm3"
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token) == ("<|im_end|>", "<|finetune_right_pad_id|>",
                                                                              None)
    assert {"<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>"} <= set(tokenizer.get_added_vocab())


def test_the_tools_reach_a_template_that_reads_them_only_from_xml_tools(tokenizer):
    """SmolLM3's release template reads the tools from `xml_tools` alone (its current revision, and turnforge's
    rendition, from `tools` too): the renderer gives them there, and the rendition writes them the same either way."""
    messages = [Message("user", "task")]
    release_like = "{#- <|im_start|> Reasoning Mode: -#}{% for tool in xml_tools or [] %}{{ tool.function.name }}{% endfor %}"
    tokenizer_of_release = train_tokenizer(iter(["x"]), get_family("smollm3"), vocab_size=300)
    tokenizer_of_release.chat_template = release_like
    assert render(tokenizer_of_release, messages, [TOOL], True) == "act"
    check_renders_tools(tokenizer_of_release)  # would raise had the tools gone in `tools`
    given_tools = tokenizer.apply_chat_template([m.to_dict() for m in messages], tools=[TOOL], tokenize=False,
                                                add_generation_prompt=True)
    assert render(tokenizer, messages, [TOOL], True) == given_tools
    assert "<tools>\n{'type': 'function', 'function': {'name': 'act'" in given_tools  # each tool as Python writes it


def test_the_renderer_writes_its_day_where_the_template_reads_the_clock(tokenizer):
    """The template's "Today Date" is `strftime_now`'s: the renderer writes the day it was made instead, so an episode
    that crosses midnight stays one prefix-preserving sequence."""
    renderer = ChatTemplateRenderer(tokenizer)
    renderer.date_string = "31 Dec 1999"  # as if made that day
    messages = [Message("system", "You are an agent."), Message("user", "go")]
    prompt = tokenizer.decode(renderer.prompt_ids(messages, [TOOL]))
    assert "Today Date: 31 December 1999\nReasoning Mode: /think\n\n## Custom Instructions\n\nYou are an agent.\n\n" \
        "### Tools\n\n" in prompt
    reply = Message("assistant", "<think>\nI look.\n</think>\nACTION: look")
    delta = renderer.observation_ids([*messages, reply], [Message("tool", "You see a desk 1.")], [TOOL],
                                     tokenizer.encode(reply.content, add_special_tokens=False), "stop")
    assert tokenizer.decode(delta) == "<|im_end|>\n<|im_start|>user\nYou see a desk 1.<|im_end|>\n<|im_start|>assistant\n"


def test_reasoning_stays_in_the_context_and_never_reaches_the_env(tokenizer):
    """The own template keeps every reply verbatim in /think mode, reasoning included (prefix-preserving: no training
    variant); the generation prompt leaves the `<think>` to the reply, and the env reads the reply without it."""
    renderer = ChatTemplateRenderer(tokenizer)
    assert renderer.template is None and renderer.family.prompt_reasoning is None
    messages = [Message("user", "go"), Message("assistant", "<think>\nR1\n</think>\nACTION: look"), Message("user", "o")]
    assert "<|im_start|>assistant\n<think>\nR1\n</think>\nACTION: look<|im_end|>" in tokenizer.decode(
        renderer.prompt_ids(messages, None))
    assert visible_reply(renderer.family, "<think>\nI look.\n</think>\nACTION: look").strip() == "ACTION: look"
    assert visible_reply(renderer.family, "<think>\ncut off while thinking") == ""


def test_a_no_think_system_prompt_closes_an_empty_block_before_each_reply(tokenizer):
    """`/no_think` in the system message (left out of the instructions): the template writes `<think>\\n\\n</think>\\n`
    after every assistant header, the generation prompt's included; a reply then has no reasoning to split off."""
    system, user = {"role": "system", "content": "You are an agent. /no_think"}, {"role": "user", "content": "go"}
    head = render(tokenizer, [system, user], None, True)
    assert "Reasoning Mode: /no_think\n\n## Custom Instructions\n\nYou are an agent.\n\n<|im_start|>user" in head
    assert head.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    reply = {"role": "assistant", "content": "ACTION: look"}
    assert render(tokenizer, [system, user, reply, user], None, True).startswith(head + "ACTION: look<|im_end|>\n")
    family = get_family("smollm3").with_prompt_reasoning(head)
    assert family.prompt_reasoning is False and visible_reply(family, "ACTION: look") == "ACTION: look"
