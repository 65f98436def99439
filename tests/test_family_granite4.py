"""IBM Granite 4.0 as a model family (issue 63). TRL ships no Granite template, so the family's template is turnforge's
rendition of IBM's (formats/templates/granite4.jinja). What is Granite's own, by hand here: the system turn (the caller's
text, then the tools section `tool_call:granite4` writes; a fallback prompt without either), calls written as that
format writes them, and a run of tool results as one user turn of `<tool_response>` blocks. Token-exact episodes,
`tiny:granite4` end to end and `turnforge serve`: the shared tests of test_families.py (TOOL_FAMILIES)."""

from __future__ import annotations

import pytest

from turnforge.envs.household.env import ACTION_TOOL
from turnforge.formats import get_format
from turnforge.formats.chat_template import (
    ChatTemplateRenderer,
    render,
    trl_chat_template,
    trl_template_names,
)
from turnforge.formats.families import detect_family, get_family
from turnforge.tiny_model import train_tokenizer
from turnforge.types import Message, ToolCall

HEAD = "<|start_of_role|>system<|end_of_role|>"
PROMPT = "<|start_of_role|>assistant<|end_of_role|>"
CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
granite4_format = get_format("tool_call:granite4")


@pytest.fixture(scope="module")
def granite4():
    """A tokenizer with Granite 4.0's added tokens and template (its BPE trained on one line: no tiny model needed)."""
    return train_tokenizer(iter(["You see a desk 1. I look."]), get_family("granite4"))


def test_granite4_is_read_from_its_template_and_from_no_template_trl_ships():
    assert detect_family(trl_chat_template("turnforge/granite4.jinja")).name == "granite4"
    assert [name for text, name in trl_template_names().items()
            if (found := detect_family(text)) is not None and found.name == "granite4"] == []


def test_the_system_turn_is_the_callers_text_then_the_tools_section(granite4):
    """Granite 4.0's template writes the system text, a blank line, the tools section (`tool_call:granite4`'s
    `system_prompt`: its header, one JSON line per tool, how to call); the section alone without a system message; a
    fallback system prompt without either; no date anywhere."""
    tools = [ACTION_TOOL]
    section = granite4_format.system_prompt(tools)
    assert render(granite4, [Message("system", "S"), Message("user", "go")], tools, True) == (
        f"{HEAD}S\n\n{section}<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>go<|end_of_text|>\n{PROMPT}")
    assert render(granite4, [Message("user", "go")], tools, False).startswith(f"{HEAD}{section}<|end_of_text|>\n")
    assert render(granite4, [Message("user", "go")], None, False) == (
        f"{HEAD}You are a helpful assistant. Please ensure responses are professional, accurate, and safe."
        "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>go<|end_of_text|>\n")


def test_structured_calls_render_as_tool_call_granite4_writes_them(granite4):
    """A request's `tool_calls` (`turnforge serve` passes them to the template) render as the raw reply the format
    writes: the text, then each call on its own lines, no newline before a call that opens the reply."""
    for message in (Message("assistant", "I look.", tool_calls=[ToolCall("act", {"q": "東京", "n": 1}), ToolCall("pwd", {})]),
                    Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look"})])):
        text = render(granite4, [Message("user", "go"), message], None, False)
        assert text.endswith(f"{PROMPT}{granite4_format.render(message)}<|end_of_text|>\n")
    assert granite4_format.render(Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look"})])) == CALL


def test_a_run_of_tool_results_is_one_user_turn_and_the_delta_starts_at_end_of_text(granite4):
    """By hand on one call answered by two results:

        head  = <|start_of_role|>system<|end_of_role|>s<|end_of_text|>\\n<|start_of_role|>user<|end_of_role|>go<|end_of_text|>\\n
                <|start_of_role|>assistant<|end_of_role|>
        reply = <tool_call>\\n{"name": "act", "arguments": {"action": "look"}}\\n</tool_call>
        delta = <|end_of_text|>\\n<|start_of_role|>user<|end_of_role|>\\n<tool_response>\\nO1\\n</tool_response>
                \\n<tool_response>\\nO2\\n</tool_response><|end_of_text|>\\n<|start_of_role|>assistant<|end_of_role|>

    A reply that stopped on <|end_of_text|> (the eos) gets the delta without it; one cut by length gets it from the delta."""
    renderer = ChatTemplateRenderer(granite4)
    assert renderer.template is None and renderer.turn_ends == ("<|end_of_text|>",)  # its own template passes the check
    messages = [Message("system", "s"), Message("user", "go"), Message("assistant", CALL)]
    results = [Message("tool", "O1", name="act"), Message("tool", "O2", name="act")]
    delta = ("<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>\n<tool_response>\nO1\n</tool_response>"
             f"\n<tool_response>\nO2\n</tool_response><|end_of_text|>\n{PROMPT}")
    reply = granite4.encode(CALL, add_special_tokens=False)
    encoded = granite4.encode(delta, add_special_tokens=False)
    assert renderer.observation_ids(messages, results, None, [*reply, granite4.eos_token_id], "stop") == encoded[1:]
    assert renderer.observation_ids(messages, results, None, reply, "length") == encoded
    assert granite4.decode(renderer.prompt_ids([*messages, *results], None)).endswith(CALL + delta)
