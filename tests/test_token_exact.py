"""Token-exact rollouts: the ids an episode accumulates equal the chat template's rendering of its conversation.

The peers' most-reported bug is drift between the ids a model generated from and a re-rendering of the same
conversation. Here the household expert's replies are "generated" as canonical ids (text tokens + <|im_end|>)
through the real rollout loop, with Qwen3-4B-Instruct-2507's chat template as TRL ships it (and its training
variant) on the tiny tokenizer, in both the text (act_line) and the tool-call format (tools=, tool messages).
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from turnforge.envs.base import load_tasks, make_env
from turnforge.envs.household.env import ACTION_TOOL
from turnforge.formats.chat_template import ChatTemplateRenderer, trl_chat_template, window_messages
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Message, StopReason

TEMPLATES = ["qwen3_instruct_2507.jinja", "qwen3_instruct_2507_training.jinja"]
FORMATS = ["act_line", "tool_call"]


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=6)


def tokenizer_with(tiny_model_dir, template: str):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = trl_chat_template(template) if template.endswith(".jinja") else template
    return tokenizer


def chat_ids(tokenizer, messages, tools, generation_prompt=True) -> list[int]:
    """The reference: HF's own `apply_chat_template`, tokenized."""
    return tokenizer.apply_chat_template(
        [m.to_dict() for m in messages], tools=tools, add_generation_prompt=generation_prompt
    )["input_ids"]


class ExpertTokenPolicy:
    """The expert's replies as canonical ids (+ <|im_end|> unless `end_of_turn=False`, as a length cut leaves it).

    It also checks every prompt it is given against `apply_chat_template` of the (windowed) conversation so far.
    """

    name = "expert-tokens"

    def __init__(self, tokenizer, window=None, end_of_turn=True):
        self.tokenizer = tokenizer
        self.renderer = ChatTemplateRenderer(tokenizer, window=window)
        self.expert = ExpertPolicy()
        self.end_of_turn = end_of_turn

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            assert p.ids == chat_ids(self.tokenizer, window_messages(p.messages, self.renderer.window), p.tools)
        out = []
        for g in self.expert.generate(prompts, params):
            ids = self.tokenizer.encode(g.text, add_special_tokens=False)
            if self.end_of_turn:
                out.append(Generation(g.text, ids + [self.tokenizer.eos_token_id], [0.0] * (len(ids) + 1), "stop"))
            else:
                out.append(Generation(g.text, ids, [0.0] * len(ids), "length"))
        return out


def rollout_ids(traj) -> list[int]:
    ids = list(traj.prompt_ids)
    for turn in traj.turns:
        ids += turn.generated_ids + turn.observation_ids
    return ids


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_rollout_ids_equal_the_rendered_conversation(tiny_model_dir, tasks, template, fmt):
    tokenizer = tokenizer_with(tiny_model_dir, template)
    policy = ExpertTokenPolicy(tokenizer)
    trajs = run_episodes(policy, lambda: make_env("household", format=fmt, grammar="0.4"), tasks, 1, renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2
        assert traj.tools == ([ACTION_TOOL] if fmt == "tool_call" else None)
        assert ("tool" in {m.role for m in traj.messages}) == (fmt == "tool_call")
        assert rollout_ids(traj) == chat_ids(tokenizer, traj.messages, traj.tools)
        for turn in traj.turns:  # each delta starts right after the generated <|im_end|>, at the template's "\n"
            assert turn.generated_ids[-1] == tokenizer.eos_token_id and turn.prompt_ids == []
            assert tokenizer.decode(turn.observation_ids).startswith("\n<|im_start|>user\n")
            assert tokenizer.decode(turn.observation_ids).endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_generation_without_end_of_turn_gets_it_from_the_delta(tiny_model_dir, tasks, fmt):
    tokenizer = tokenizer_with(tiny_model_dir, TEMPLATES[0])
    policy = ExpertTokenPolicy(tokenizer, end_of_turn=False)  # as if every reply hit max_new_tokens
    trajs = run_episodes(policy, lambda: make_env("household", format=fmt), tasks[:3], 1, renderer=policy.renderer)
    for traj in trajs:
        assert rollout_ids(traj) == chat_ids(tokenizer, traj.messages, traj.tools)
        assert all(turn.observation_ids[0] == tokenizer.eos_token_id for turn in traj.turns)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("template", TEMPLATES)
def test_with_a_window_every_turn_is_a_token_exact_prompt_completion_pair(tiny_model_dir, tasks, template, fmt):
    tokenizer = tokenizer_with(tiny_model_dir, template)
    policy = ExpertTokenPolicy(tokenizer, window=2)
    trajs = run_episodes(policy, lambda: make_env("household", format=fmt), tasks, 1, renderer=policy.renderer)
    shortened = 0
    for traj in trajs:
        assert traj.stop_reason is StopReason.success
        assistant_at = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        assert traj.turns[0].prompt_ids == traj.prompt_ids
        for turn, i in zip(traj.turns, assistant_at, strict=True):
            before = window_messages(traj.messages[:i], 2)
            assert turn.prompt_ids == chat_ids(tokenizer, before, traj.tools) and turn.observation_ids == []
            # prompt + completion is exactly the template's rendering of the windowed turn (then its "\n")
            pair = turn.prompt_ids + turn.generated_ids
            rendered = chat_ids(tokenizer, [*before, traj.messages[i]], traj.tools, generation_prompt=False)
            assert rendered[: len(pair)] == pair and tokenizer.decode(rendered[len(pair) :]) == "\n"
            shortened += len(before) < i
    assert shortened > 0  # the window did cut some histories


def test_window_messages_keeps_the_head_and_the_last_turns():
    head = [Message("system", "s"), Message("user", "task")]
    turns = [
        [Message("assistant", "a1"), Message("user", "o1")],
        [Message("assistant", "a2"), Message("tool", "o2a"), Message("tool", "o2b")],
        [Message("assistant", "a3"), Message("user", "o3")],
    ]
    messages = head + [m for turn in turns for m in turn]
    assert window_messages(messages, None) == messages
    assert window_messages(messages, 3) == messages and window_messages(messages, 9) == messages
    assert window_messages(messages, 2) == head + turns[1] + turns[2]
    assert window_messages(messages, 1) == head + turns[2]
    assert window_messages(head, 1) == head
    with pytest.raises(ValueError, match="at least 1"):
        window_messages(messages, 0)


# Like Qwen3's thinking template, which rewrites earlier turns: here it drops the content of earlier replies.
DROPS_EARLIER_REPLIES = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and not loop.last %}{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Writes a newline between the reply and <|im_end|>: the model never generated it.
NEWLINE_BEFORE_END = DROPS_EARLIER_REPLIES.replace(
    "{%- if m.role == 'assistant' and not loop.last %}{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}",
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' + m.content + '\\n<|im_end|>\\n' }}",
)


@pytest.mark.parametrize(
    "template, message",
    [
        (DROPS_EARLIER_REPLIES, r"is not prefix-preserving: appending the observation after assistant turn 1"),
        (NEWLINE_BEFORE_END, r"does not render an assistant reply verbatim"),
        # on a tokenizer whose end-of-turn is not DeepSeek's: its training variant, tried in its place, is refused
        ("deepseek_r1_distill.jinja",
         r"chat template trl/chat_templates/deepseek_r1_distill_training\.jinja cannot be used for token-exact rollouts"),
    ],
    ids=["drops-earlier-replies", "newline-before-end", "trl-deepseek-r1-distill"],
)
def test_a_template_that_would_drift_is_refused_at_startup(tiny_model_dir, template, message):
    tokenizer = tokenizer_with(tiny_model_dir, template)
    with pytest.raises(ValueError, match=message):
        ChatTemplateRenderer(tokenizer)
    with pytest.raises(ValueError, match=message):  # and so is a policy built on it, before any episode runs
        ExpertTokenPolicy(tokenizer)


def test_the_end_of_turn_must_be_an_added_token(tiny_model_dir):
    tokenizer = tokenizer_with(tiny_model_dir, TEMPLATES[0])
    tokenizer.eos_token = "assistant"
    with pytest.raises(ValueError, match="must be an added/special token"):
        ChatTemplateRenderer(tokenizer)
    tokenizer = tokenizer_with(tiny_model_dir, TEMPLATES[0])
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatTemplateRenderer(tokenizer)


def test_max_total_tokens_with_a_window_counts_the_windowed_prompt(tiny_model_dir, tasks):
    tokenizer = tokenizer_with(tiny_model_dir, TEMPLATES[0])
    windowed = run_episodes(w := ExpertTokenPolicy(tokenizer, window=1), make_env_household, tasks, 1, renderer=w.renderer)
    cap = RolloutLimits(max_total_tokens=1 + max(len(t.prompt_ids) for traj in windowed for t in traj.turns))
    # every windowed prompt fits under the cap; the growing full-history sequences do not
    windowed = run_episodes(w := ExpertTokenPolicy(tokenizer, window=1), make_env_household, tasks, 1, cap, renderer=w.renderer)
    assert all(traj.stop_reason is StopReason.success for traj in windowed)
    full = run_episodes(f := ExpertTokenPolicy(tokenizer), make_env_household, tasks, 1, cap, renderer=f.renderer)
    assert any(traj.stop_reason is StopReason.max_tokens for traj in full)


def make_env_household():
    return make_env("household")


# ChatML without tool support (as many base templates): prefix-preserving, but `tools` never reach the prompt.
NO_TOOLS = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_without_tools_is_refused_for_a_tool_format_in_one_line(tiny_model_dir, tasks):
    """An env played in a tool-call format on a template that leaves the tools out: one line naming the text formats
    that work instead, before any reply; the same template plays the env's text format."""
    tokenizer = tokenizer_with(tiny_model_dir, NO_TOOLS)
    policy = ExpertTokenPolicy(tokenizer)
    with pytest.raises(ValueError, match=r"does not render tools, so the model would never see the env's tools: "
                                         r"play the env in a text format instead \(--env-opt format=react, or act_line"):
        run_episodes(policy, lambda: make_env("household", format="tool_call"), tasks[:1], 1, renderer=policy.renderer)
    trajs = run_episodes(policy, lambda: make_env("household", format="act_line"), tasks[:1], 1,
                         renderer=policy.renderer)
    assert trajs[0].stop_reason is StopReason.success
