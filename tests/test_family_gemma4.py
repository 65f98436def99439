"""Gemma 4 as a model family (issue 63): a tool call ends the reply on `<|tool_response>`, the tool's answer follows in
the same model turn (`<|tool_response>response:act{value:...}<tool_response|>`) and the model goes on there with no new
header. Read from all five of TRL's Gemma 4 templates, token-exact, non-thinking only, end to end on `tiny:gemma4`
(gemma4_v5.jinja), and `turnforge serve`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from test_families import assert_serves, assert_token_exact, run_family_recipe
from turnforge.envs.base import load_tasks, make_env, with_family_format
from turnforge.formats import get_format
from turnforge.formats.chat_template import (
    ChatTemplateRenderer,
    check_prefix_preserving,
    template_name,
    trl_chat_template,
)
from turnforge.formats.families import detect_family, get_family
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.types import Message, StopReason

GEMMA4_TEMPLATES = ["gemma4.jinja", "gemma4_v2.jinja", "gemma4_v3.jinja", "gemma4_v4.jinja", "gemma4_v5.jinja"]
CALL = '<|tool_call>call:act{action:<|"|>look<|"|>}<tool_call|>'


@pytest.fixture(scope="module")
def gemma4_dir(build_tiny, tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("gemma4") / "tiny-gemma4", family="gemma4")


@pytest.fixture
def gemma4(gemma4_dir):
    return AutoTokenizer.from_pretrained(gemma4_dir)


@pytest.mark.parametrize("template", GEMMA4_TEMPLATES)
def test_gemma4_is_read_from_each_of_its_templates_and_each_passes_the_start_up_check(gemma4, template):
    assert detect_family(trl_chat_template(template)).name == "gemma4"
    assert detect_family(trl_chat_template("gemma3.jinja")).name == "gemma3"
    gemma4.chat_template = trl_chat_template(template)
    renderer = ChatTemplateRenderer(gemma4)
    assert renderer.template is None and renderer.turn_ends == ("<turn|>", "<|tool_response>")  # its own template


def test_gemma4_runs_in_non_thinking_mode_only(gemma4):
    """Every Gemma 4 template strips a `<|channel>...<channel|>` thought from a reply's text and TRL ships no training
    variant: a reply that thinks cannot render verbatim, so the start-up check refuses it in one line. The renderer
    never sets `enable_thinking` (no `<|think|>` in the prompt)."""
    renderer = ChatTemplateRenderer(gemma4)
    assert renderer.family.reasoning is None
    assert "<|think|>" not in gemma4.decode(renderer.prompt_ids([Message("system", "s"), Message("user", "go")], None))
    thinking = replace(get_family("gemma4"), name="gemma4-thinking", reasoning=("<|channel>thought", "<channel|>"))
    with pytest.raises(ValueError, match="does not render an assistant reply verbatim between the generation prompt"):
        check_prefix_preserving(gemma4, thinking)


def test_a_call_ends_on_tool_response_and_the_model_goes_on_in_its_turn(gemma4):
    """By hand on one call:

        head  = <bos><|turn>system\\ns<turn|>\\n<|turn>user\\ngo<turn|>\\n<|turn>model\\n
        reply = <|tool_call>call:act{action:<|"|>look<|"|>}<tool_call|>
        delta = <|tool_response>response:act{value:<|"|>O<|"|>}<tool_response|>          (no header after it)

    A model that stopped on <|tool_response> gets the delta without it; one that stopped on <turn|> keeps that id and
    gets the delta whole, as one cut by length."""
    renderer = ChatTemplateRenderer(gemma4)
    response, turn_end = gemma4.convert_tokens_to_ids(["<|tool_response>", "<turn|>"])
    messages = [Message("system", "s"), Message("user", "go"), Message("assistant", CALL)]
    result = [Message("tool", "O", name="act")]
    delta = 'response:act{value:<|"|>O<|"|>}<tool_response|>'
    reply = gemma4.encode(CALL, add_special_tokens=False)
    assert renderer.observation_ids(messages, result, None, [*reply, response], "stop") == gemma4.encode(delta)
    assert renderer.observation_ids(messages, result, None, [*reply, turn_end], "stop") == gemma4.encode(
        "<|tool_response>" + delta)
    assert renderer.observation_ids(messages, result, None, reply, "length") == gemma4.encode("<|tool_response>" + delta)
    # SFT: a call's ids end on <|tool_response>, a text reply's on <turn|>
    assert renderer.completion_ids(messages, None, following=result) == [*reply, response]
    answer = [*messages[:2], Message("assistant", "ACTION: look")]
    assert renderer.completion_ids(answer, None, following=[Message("user", "O")]) == [
        *gemma4.encode("ACTION: look", add_special_tokens=False), turn_end]
    # The env's answer to a reply it could not read (a tool message answering no call, which the template would drop)
    # comes as a user turn
    broken = [*messages[:2], Message("assistant", "call act")]
    assert gemma4.decode(renderer.observation_ids(broken, [Message("tool", "Invalid tool call", name="act")], None,
                                                  [5, turn_end], "stop")) == (
        "\n<|turn>user\nInvalid tool call<turn|>\n<|turn>model\n")


class Gemma4ExpertTokens:
    """The expert's replies as Gemma 4 writes them, as canonical ids + the token the reply stops on (`<|tool_response>`
    after a call, `<turn|>` after text); it checks every prompt against the template's rendering of the conversation
    with each reply's calls given as `tool_calls` (read back by tool_call:gemma4)."""

    name = "gemma4-expert-tokens"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.renderer = ChatTemplateRenderer(tokenizer)
        self.expert = ExpertPolicy()

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            assert p.ids == self.reference(p.messages, p.tools)
        out = []
        for g in self.expert.generate(prompts, params):
            end = "<|tool_response>" if g.text.startswith("<|tool_call>") else "<turn|>"
            ids = self.tokenizer.encode(g.text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids(end)]
            out.append(Generation(g.text, ids, [0.0] * len(ids), "stop"))
        return out

    def reference(self, messages, tools) -> list[int]:
        fmt = get_format("tool_call:gemma4")
        structured = [fmt.parse(m.content) if m.role == "assistant" and tools else m for m in messages]
        return self.tokenizer.apply_chat_template([m.to_dict() for m in structured], tools=tools,
                                                  add_generation_prompt=True)["input_ids"]


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_rollout_ids_are_the_gemma4_templates_rendering_and_grpo_trains_the_sampled_ids(gemma4, fmt):
    policy = Gemma4ExpertTokens(gemma4)
    assert template_name(gemma4) == "chat template trl/chat_templates/gemma4_v5.jinja"
    options = with_family_format("household", {"format": fmt}, policy.renderer.family)
    assert options["format"] == ("tool_call:gemma4" if fmt == "tool_call" else "act_line")
    trajs = run_episodes(policy, lambda: make_env("household", **options), load_tasks("household", "train", limit=4), 1,
                         renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2
        assert all(turn.parse_ok for turn in traj.turns)
        ids = assert_token_exact(traj, policy.reference(traj.messages, traj.tools))
        # with tool calls the whole episode is one model turn: calls and responses, no header after the first
        assert gemma4.decode(ids).count("<|turn>model") == (1 if fmt == "tool_call" else len(traj.turns) + 1)


def test_gemma4_collects_trains_and_evaluates_in_its_own_format(tmp_path):
    collected, evaluated = run_family_recipe(tmp_path, "gemma4", "tool_call")
    assert all(t["text"].startswith('<|tool_call>call:act{action:<|"|>') for e in collected for t in e["turns"])
    assert evaluated["tool_calls"]["format"] == "tool_call:gemma4"


def test_serve_answers_gemma4_calls_with_tool_results_in_the_history(gemma4_dir):
    from turnforge.policies.serve import ServedModel, _reply

    message, finish = _reply(Generation(text=CALL, ids=[1]), [], True, False, get_family("gemma4"),
                             get_format("tool_call:gemma4"))
    assert finish == "tool_calls" and message["tool_calls"][0]["function"] == {"name": "act",
                                                                               "arguments": '{"action": "look"}'}
    served = ServedModel(str(gemma4_dir), name="gemma4", device="cpu")
    assert served.tool_format.name == "tool_call:gemma4"
    tools = [{"type": "function", "function": {"name": "act", "description": "Act.", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}}}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "act", "arguments": '{"action": "look"}'}}
    history = [{"role": "user", "content": "look around"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "You see a desk 1."}]
    assert_serves(served, {"model": "gemma4", "messages": history, "tools": tools, "max_tokens": 8, "temperature": 0})
