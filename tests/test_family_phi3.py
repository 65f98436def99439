"""Phi-3.5-mini and Phi-4-mini as the `phi3` model family (issue 63): read from Phi-3's, Phi-3.5's and Phi-4-mini's
templates and from no other of TRL's; none of them renders `tools=` (text formats only, a tool env refused in one
line); a reply ends on `<|end|>` while the tokenizer's eos is `<|endoftext|>`; Phi-3.5's role and end tokens swallow
the newline its template writes after them, and the observation delta is tokenized as the whole conversation is.
The end to end run, token-exact episodes and `turnforge serve` on `tiny:phi3` are the shared ones
(tests/test_families.py)."""

from __future__ import annotations

import pytest

from turnforge.formats.chat_template import (
    ChatTemplateRenderer,
    check_prefix_preserving,
    trl_chat_template,
    trl_template_names,
)
from turnforge.formats.families import detect_family, get_family
from turnforge.tiny_model import tiny_model, train_tokenizer
from turnforge.types import Message

PHI4_MINI = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}"
    "{% if m['role'] == 'system' and 'tools' in m and m['tools'] is not none %}{{ '<|tool|>' + m['tools'] + '<|/tool|>' }}"
    "{% endif %}{{ '<|end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}"
    "{% endif %}"
)
"""microsoft/Phi-4-mini-instruct's template, written here from what it renders: every message `<|ROLE|>` + content +
`<|end|>` with no newline (a system message's own `tools` field, a JSON string, inside `<|tool|>...<|/tool|>`), the
prompt `<|assistant|>`, the eos after a conversation without one. `tools=` is not read."""

MESSAGES = [Message("system", "You are an agent."), Message("user", "Your task is to: look."),
            Message("assistant", "ACTION: look")]
OBSERVATION = [Message("user", "You see a desk 1.")]


@pytest.fixture(scope="module")
def phi3():
    """A tokenizer with tiny:phi3's tokens, flags and template, its BPE trained on two lines (no env corpus)."""
    return train_tokenizer(iter([m.content for m in MESSAGES + OBSERVATION]), get_family("phi3"))


def test_phi3_is_read_from_phi_3_phi_3_5_and_phi_4_minis_templates_and_from_no_other_trl_template():
    read = {name: detect_family(text) for text, name in trl_template_names().items()}
    assert sorted(name for name, family in read.items() if family and family.name == "phi3") == [
        "phi3.jinja", "phi3_5.jinja", "phi3_5_training.jinja", "phi3_training.jinja"]
    assert detect_family(PHI4_MINI).name == "phi3"


@pytest.mark.parametrize("template", ["phi3_5.jinja", "phi3.jinja", "phi4_mini"])
def test_each_template_renders_with_itself_and_a_tool_env_is_refused_in_one_line(phi3, template):
    """Each is prefix-preserving as it is (so is TRL's `phi3_5_training.jinja`, which only marks the replies for
    assistant-only loss): the renderer uses the model's own. None renders `tools=`."""
    phi3.chat_template = PHI4_MINI if template == "phi4_mini" else trl_chat_template(template)
    renderer = ChatTemplateRenderer(phi3)
    assert renderer.template is None and renderer.family.name == "phi3" and renderer.family.tool_format is None
    check_prefix_preserving(phi3, renderer.family, trl_chat_template("phi3_5_training.jinja"))
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(ValueError, match=r"does not render tools.*format=react, or act_line"):
        renderer.prompt_ids(MESSAGES[:2], tools)


def test_a_reply_ends_on_end_and_the_model_stops_there_though_the_eos_is_endoftext(phi3):
    phi3.chat_template = trl_chat_template("phi3_5.jinja")
    renderer = ChatTemplateRenderer(phi3)
    end, eos = phi3.convert_tokens_to_ids(["<|end|>", "<|endoftext|>"])
    assert phi3.eos_token == "<|endoftext|>" and renderer.turn_ends == ("<|end|>",)
    assert renderer.completion_ids(MESSAGES, None)[-1] == end
    rendered = phi3.apply_chat_template([m.to_dict() for m in MESSAGES], tokenize=False)
    assert rendered.endswith("ACTION: look<|end|>\n<|endoftext|>")  # the eos only closes a whole conversation
    # As Phi-3.5-mini's generation_config (eos_token_id [32007, 32001, 32000]; the tiny model leaves out <|assistant|>)
    assert set(tiny_model(phi3, "tiny", 0, get_family("phi3")).generation_config.eos_token_id) == {end, eos}


def test_the_newline_after_end_is_swallowed_in_the_delta_as_in_the_whole_conversation(phi3):
    phi3.chat_template = trl_chat_template("phi3_5.jinja")
    renderer = ChatTemplateRenderer(phi3)
    end, user = phi3.convert_tokens_to_ids(["<|end|>", "<|user|>"])
    assert phi3.encode("<|end|>\n<|user|>\n", add_special_tokens=False) == [end, user]
    reply = renderer.completion_ids(MESSAGES, None)
    delta = renderer.observation_ids(MESSAGES, OBSERVATION, None, reply, "stop")
    assert delta[0] == user  # not the newline's id
    assert renderer.prompt_ids(MESSAGES[:2], None) + reply + delta == renderer.prompt_ids(MESSAGES + OBSERVATION, None)
