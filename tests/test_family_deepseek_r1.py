"""DeepSeek-R1-distill as a model family (issue 63): its `<think>` reasoning split off as vLLM's `deepseek_r1` parser
splits it (the generation prompt opens it, so a reply starts inside it), kept and trained but never sent to the env;
episodes token-exact through TRL's `deepseek_r1_distill_training.jinja`, which keeps earlier turns' reasoning, each
reply given to it after the `<think>\\n` the prompt wrote (`Family.verbatim_replies`); its template renders no tools,
so text formats only; and `tiny:deepseek_r1` end to end: collect -> SFT 2 steps -> GRPO 2 steps -> eval, and
`turnforge serve`. vLLM's parser itself: tests/test_vllm_reasoning_deepseek_r1.py."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from test_families import RECIPE, FamilyExpertTokens, assert_serves, assert_token_exact, run_family_recipe
from turnforge.envs.base import load_tasks, make_env, with_family_format
from turnforge.formats.chat_template import (
    ChatTemplateRenderer,
    template_messages,
    template_name,
    trl_chat_template,
)
from turnforge.formats.families import detect_family, get_family, visible_reply
from turnforge.policies.base import Generation
from turnforge.rollout import run_episodes
from turnforge.types import Message, StopReason

PROMPT_END = "<｜Assistant｜><think>\n"
"""How R1-distill's generation prompt ends: the reply starts inside the reasoning."""


@pytest.fixture(scope="module")
def r1_dir(build_tiny, tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("r1") / "tiny-deepseek_r1", family="deepseek_r1")


@pytest.fixture(scope="module")
def r1_renderer(r1_dir):
    return ChatTemplateRenderer(AutoTokenizer.from_pretrained(r1_dir))


# ---- reading the family and a reply -------------------------------------------------------------------------------

@pytest.mark.parametrize(("template", "family"), [
    ("deepseek_r1_distill.jinja", "deepseek_r1"), ("deepseek_r1_distill_training.jinja", "deepseek_r1"),
    ("deepseekv3.jinja", None),  # DeepSeek-V3 / R1 (671B): the same prompt, other tool-output text; not this family
    ("qwen3.jinja", "qwen3_thinking"),
])
def test_the_family_is_read_from_r1_distills_templates(template, family):
    found = detect_family(trl_chat_template(template))
    assert (found.name if found else None) == family


def test_reasoning_is_split_as_vllms_deepseek_r1_parser_splits_it():
    """By hand, as vLLM's `BaseThinkingReasoningParser.extract_reasoning`: drop everything up to a first `<think>`,
    then the reasoning ends at the first `</think>`; without one the whole reply is reasoning."""
    family = get_family("deepseek_r1").with_prompt_reasoning("<｜User｜>go" + PROMPT_END)
    assert family.prompt_reasoning is True
    assert family.split_reasoning("I plan.\n</think>\n\nACTION: look") == ("I plan.\n", "\n\nACTION: look")
    assert family.split_reasoning("still thinking, cut off") == ("still thinking, cut off", "")
    assert family.split_reasoning("</think>ACTION: look") == ("", "ACTION: look")  # empty reasoning
    assert family.split_reasoning("<think>\nagain</think>ACTION: look") == ("\nagain", "ACTION: look")  # stray open
    assert family.split_reasoning("a<think>b</think>c</think>d") == ("b", "c</think>d")  # "a" goes, as in vLLM
    assert visible_reply(family, "Zoë 東京\n</think>\n\nACTION: look") == "\n\nACTION: look"
    assert visible_reply(family, "no close tag: all reasoning") == ""


# ---- rendering ---------------------------------------------------------------------------------------------------

def test_the_renderer_renders_with_trls_training_variant_each_reply_after_the_prompts_think(r1_dir, r1_renderer):
    """The own template drops a reply's reasoning once it is history; TRL's training variant keeps it, given each reply
    after the `<think>\\n` the prompt wrote; a demonstration without reasoning gets an empty block."""
    tokenizer = r1_renderer.tokenizer
    assert template_name(tokenizer) == "chat template trl/chat_templates/deepseek_r1_distill.jinja"
    assert template_name(tokenizer, r1_renderer.template) == \
        "chat template trl/chat_templates/deepseek_r1_distill_training.jinja"
    assert r1_renderer.family.name == "deepseek_r1" and r1_renderer.family.prompt_reasoning is True
    messages = [Message("system", "S"), Message("user", "go"), Message("assistant", "R1\n</think>\n\nA1"),
                Message("user", "obs")]
    assert tokenizer.decode(r1_renderer.prompt_ids(messages, None)) == (
        "<｜begin▁of▁sentence｜>S<｜User｜>go<｜Assistant｜><think>\nR1\n</think>\n\nA1<｜end▁of▁sentence｜>"
        "<｜User｜>obs" + PROMPT_END)
    assert "R1" not in tokenizer.apply_chat_template([m.to_dict() for m in messages], tokenize=False,
                                                     add_generation_prompt=True)
    demo = [Message("user", "go"), Message("assistant", "ACTION: look")]
    assert tokenizer.decode(r1_renderer.completion_ids(demo, None)) == "\n</think>\n\nACTION: look<｜end▁of▁sentence｜>"
    assert template_messages([Message("user", "go"), Message("assistant", "<think>\nR</think>A")], r1_renderer.family)[
        1]["content"] == "<think>\nR</think>A"  # a dataset's reply with its whole block: as it is


def test_a_tool_env_is_refused_in_one_line(r1_renderer):
    """R1-distill's template renders no `tools` (and drops `tool_calls` whenever a reply has content): text formats."""
    assert r1_renderer.family.tool_format is None
    env = make_env("household", **with_family_format("household", {"format": "tool_call"}, r1_renderer.family))
    messages = env.reset(load_tasks("household", "train", limit=1)[0])
    with pytest.raises(ValueError, match=r"deepseek_r1_distill_training\.jinja does not render tools.*act_line"):
        r1_renderer.prompt_ids(messages, env.tools())


# ---- token-exact episodes ------------------------------------------------------------------------------------------

class R1ExpertTokens(FamilyExpertTokens):
    """The expert's actions after R1's prompt: `I act.\\n</think>\\n\\n` + the action; every prompt checked against
    the training template rendering the conversation as it is given it (each reply after the prompt's `<think>\\n`)."""

    def reference(self, messages, tools) -> list[int]:
        given = template_messages(messages, self.renderer.family)
        return self.tokenizer.apply_chat_template(given, tools=tools, add_generation_prompt=True,
                                                  chat_template=self.renderer.template)["input_ids"]


def test_rollout_ids_are_the_training_templates_rendering_and_grpo_trains_the_sampled_ids(r1_dir):
    tokenizer = AutoTokenizer.from_pretrained(r1_dir)
    policy = R1ExpertTokens(tokenizer)
    options = with_family_format("household", {"format": "act_line"}, policy.renderer.family)
    trajs = run_episodes(policy, lambda: make_env("household", **options), load_tasks("household", "train", limit=4), 1,
                         renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2  # the env never saw the reasoning
        assert all(turn.parse_ok and turn.text.startswith("I act.\n</think>\n\nACTION: ") for turn in traj.turns)
        ids = assert_token_exact(traj, policy.reference(traj.messages, traj.tools))
        text = tokenizer.decode(ids)
        assert text.count("<｜Assistant｜><think>\nI act.\n</think>\n\nACTION: ") == len(traj.turns)  # every turn's kept


# ---- end to end ----------------------------------------------------------------------------------------------------

def test_r1_distill_collects_trains_and_evaluates_in_act_line(tmp_path):
    # An R1 reply closes `</think>` before its action: a 2-step SFT model at the shared recipe's settings never ends a
    # turn within 24 tokens, so every GRPO group's episodes were equally long and equally unparsed (no advantage, no
    # update). A larger SFT step and room to end a turn give the groups lengths and format rewards that differ.
    recipe = (RECIPE.format(family="deepseek_r1", format="act_line")
              .replace("learning_rate = 1e-3", "learning_rate = 3e-2").replace("max_new_tokens = 24", "max_new_tokens = 64"))
    run_family_recipe(tmp_path, "deepseek_r1", "act_line", recipe)


def test_serve_answers_with_the_reasoning_apart(r1_dir):
    from turnforge.formats import get_format
    from turnforge.policies.serve import ServedModel, _reply

    served = ServedModel(str(r1_dir), name="r1", device="cpu")
    assert served.family.name == "deepseek_r1" and served.family.prompt_reasoning is True
    message, finish = _reply(Generation(text="I look.\n</think>\n\nACTION: look", ids=[1], finish_reason="stop"), [],
                             False, False, served.family, get_format("tool_call"))
    assert message == {"role": "assistant", "reasoning": "I look.", "content": "\n\nACTION: look"} and finish == "stop"
    message, _ = _reply(Generation(text="cut off while thinking", ids=[1], finish_reason="length"), [], False, False,
                        served.family, get_format("tool_call"))
    assert message["reasoning"] == "cut off while thinking" and message["content"] == ""
    body = {"model": "r1", "messages": [{"role": "user", "content": "look around"},
                                        {"role": "assistant", "content": "ACTION: look", "reasoning": "I look."},
                                        {"role": "user", "content": "You see a desk 1."}],
            "max_tokens": 8, "temperature": 0}
    assert "reasoning" in assert_serves(served, body)
