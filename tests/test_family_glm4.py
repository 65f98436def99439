"""GLM-4.5 as a model family (issue 63): its template writes no end-of-turn token after a reply, the next role's token
ends it (`<|observation|>` before tool results, `<|user|>` before a user message), and keeps a turn's reasoning only
until a user message follows. Read from the template, token-exact, end to end on `tiny:glm4`, and `turnforge serve`."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from test_families import (
    RECIPE,
    assert_continues_from_written_ids,
    assert_serves,
    assert_token_exact,
    run_family_recipe,
)
from turnforge.envs.base import load_tasks, make_env, with_family_format
from turnforge.formats.chat_template import ChatTemplateRenderer, template_name, trl_chat_template
from turnforge.formats.families import detect_family, get_family
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.types import Message, StopReason

CALL = "<tool_call>act\n<arg_key>action</arg_key>\n<arg_value>look</arg_value>\n</tool_call>"


@pytest.fixture(scope="module")
def glm4_dir(build_tiny, tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("glm4") / "tiny-glm4", family="glm4")


@pytest.fixture(scope="module")
def glm4(glm4_dir):
    return AutoTokenizer.from_pretrained(glm4_dir)


@pytest.mark.parametrize("template", ["glm4moe.jinja", "glm4moe_training.jinja"])
def test_glm_is_read_from_its_template(template):
    assert detect_family(trl_chat_template(template)).name == "glm4"


def test_the_renderer_ends_a_reply_at_the_first_of_the_familys_end_tokens(glm4):
    """GLM's template writes `\\n<think>R</think>\\n` + the reply and nothing after it; the next message's role token
    ends it. By hand on one tool call:

        head = [gMASK]<sop><|system|>...<|user|>\\ngo<|assistant|>
        rest = \\n<think>R</think>\\n<tool_call>act...</tool_call>  <|observation|>\\n<tool_response>\\nO\\n</tool_response><|assistant|>
               '-------------------- reply --------------------'  '------------------- delta -------------------------------'

    A model that stopped on <|observation|> (the template's) gets the delta without it; one that stopped on <|user|>
    keeps it and gets the delta whole; one cut by length gets it from the delta."""
    renderer = ChatTemplateRenderer(glm4)
    assert template_name(glm4, renderer.template) == "chat template trl/chat_templates/glm4moe.jinja"
    assert renderer.turn_ends == ("<|user|>", "<|observation|>")
    user, observation = glm4.convert_tokens_to_ids(["<|user|>", "<|observation|>"])
    reply = "\n<think>R</think>\n" + CALL
    messages = [Message("system", "s"), Message("user", "go"), Message("assistant", reply)]
    result = [Message("tool", "O", name="act")]
    delta = "\n<tool_response>\nO\n</tool_response><|assistant|>"
    reply_ids = glm4.encode(reply, add_special_tokens=False)
    assert renderer.observation_ids(messages, result, None, [*reply_ids, observation], "stop") == glm4.encode(delta)
    assert renderer.observation_ids(messages, result, None, [*reply_ids, user], "stop") == glm4.encode(
        "<|observation|>" + delta)
    assert renderer.observation_ids(messages, result, None, reply_ids, "length") == glm4.encode("<|observation|>" + delta)
    # a user message after it: <|user|> ends the reply
    assert renderer.observation_ids(messages, [Message("user", "O")], None, [*reply_ids, user], "stop") == glm4.encode(
        "\nO<|assistant|>")
    # SFT: the reply's ids (its reasoning kept, as generated, though the template empties it before a user message)
    # and the end the template writes before what follows; nothing follows: <|user|>
    assert renderer.completion_ids(messages, None, following=result) == [*reply_ids, observation]
    assert renderer.completion_ids(messages, None, following=[Message("user", "O")]) == [*reply_ids, user]
    assert renderer.completion_ids(messages, None) == [*reply_ids, user]
    # the template's rendering of a reply without reasoning is what SFT trains: its empty block first
    bare = [*messages[:2], Message("assistant", "ACTION: look")]
    assert glm4.decode(renderer.completion_ids(bare, None, following=[Message("user", "O")])) == (
        "\n<think></think>\nACTION: look<|user|>")


class GLMExpertTokens:
    """The expert's replies as GLM writes them: `\\n<think>{reasoning}</think>\\n` + the action, then the token that
    ends the reply (`<|observation|>` after a tool call, `<|user|>` after a text action); with `check`, every prompt is
    checked against the template's rendering."""

    name = "glm-expert-tokens"

    def __init__(self, tokenizer, reasoning: str, check: bool = True):
        self.tokenizer, self.reasoning, self.check = tokenizer, reasoning, check
        self.renderer = ChatTemplateRenderer(tokenizer)
        self.expert = ExpertPolicy()

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            assert not self.check or p.ids == self.reference(p.messages, p.tools)
        out = []
        for g in self.expert.generate(prompts, params):
            text = self.renderer.family.probe_reply(g.text, self.reasoning)
            end = "<|observation|>" if "<tool_call>" in g.text else "<|user|>"
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids(end)]
            out.append(Generation(text, ids, [0.0] * len(ids), "stop"))
        return out

    def reference(self, messages, tools) -> list[int]:
        return self.tokenizer.apply_chat_template([m.to_dict() for m in messages], tools=tools, add_generation_prompt=True,
                                                  chat_template=self.renderer.template)["input_ids"]


def _episode_ids(traj) -> list[int]:
    ids = list(traj.prompt_ids)
    for turn in traj.turns:
        ids += turn.generated_ids + turn.observation_ids
    return ids


@pytest.mark.parametrize(("fmt", "reasoning"), [("tool_call", "I act."), ("act_line", "")])
def test_rollout_ids_are_glms_rendering(glm4, fmt, reasoning):
    """Where observations are tool messages every turn's reasoning stays in GLM's rendering; in act_line (observations
    are user messages) only a reply without reasoning does. There the episode's ids (prompt + generated + observation
    deltas) equal the template's rendering of the whole conversation, and GRPO trains exactly the sampled ids."""
    policy = GLMExpertTokens(glm4, reasoning)
    options = with_family_format("household", {"format": fmt}, policy.renderer.family)
    assert options["format"] == ("tool_call:glm4" if fmt == "tool_call" else "act_line")
    trajs = run_episodes(policy, lambda: make_env("household", **options), load_tasks("household", "train", limit=4), 1,
                         renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2
        assert all(turn.parse_ok for turn in traj.turns)
        assert_token_exact(traj, policy.reference(traj.messages, traj.tools))


def test_reasoning_before_a_user_observation_stays_in_the_ids_though_glms_template_hides_it(glm4):
    """In act_line GLM's template empties a turn's reasoning once the next observation (a user message) comes; the
    episode keeps the ids the model generated, reasoning included, as with Qwen3's training variant."""
    policy = GLMExpertTokens(glm4, "I act.", check=False)
    (traj,) = run_episodes(policy, lambda: make_env("household", format="act_line"),
                           load_tasks("household", "train", limit=1), 1, renderer=policy.renderer)
    assert traj.stop_reason is StopReason.success
    ids = glm4.decode(_episode_ids(traj))
    rendered = glm4.apply_chat_template([m.to_dict() for m in traj.messages], tokenize=False, add_generation_prompt=True)
    assert ids.count("<think>I act.</think>") == len(traj.turns) and rendered.count("<think>I act.</think>") == 0
    assert ids.replace("<think>I act.</think>", "<think></think>") == rendered


def test_glm4_collects_trains_and_evaluates_in_its_own_format(tmp_path):
    """`model = "tiny:glm4"`, `format = "tool_call"`: the expert demonstrates in GLM's `<arg_key>` calls, SFT 2 steps,
    GRPO 2 steps (every parameter changes), the eval plays tool_call:glm4."""
    # A 2-step SFT model writes noise; the episodes' lengths differ within a group only where a sample stops on one of
    # its end tokens, which 24 tokens a turn gave none of tiny:glm4's 12 episodes: 64 gives room.
    recipe = RECIPE.format(family="glm4", format="tool_call").replace("max_new_tokens = 24", "max_new_tokens = 64")
    collected, evaluated = run_family_recipe(tmp_path, "glm4", "tool_call", recipe)
    assert all("<tool_call>act\n<arg_key>action</arg_key>\n<arg_value>" in t["text"] for e in collected
               for t in e["turns"])
    assert evaluated["tool_calls"]["format"] == "tool_call:glm4"


def test_serve_answers_glms_tool_calls_and_reasoning(glm4_dir):
    """`turnforge serve` over tiny:glm4: a reply is read as GLM's calls (the request's tools bound to the format) and
    its reasoning comes apart; a chat request with `tools` answers, streamed too."""
    from turnforge.formats import get_format
    from turnforge.formats.base import bind_tools
    from turnforge.policies.serve import ServedModel, _reply

    tools = [{"type": "function", "function": {"name": "act", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}, "n": {"type": "integer"}}}}}]
    fmt = get_format("tool_call:glm4")
    bind_tools(fmt, tools)
    text = "\n<think>I look.</think>\n" + CALL.replace("</tool_call>", "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")
    message, finish = _reply(Generation(text=text, ids=[1]), [], True, False, get_family("glm4"), fmt)
    assert finish == "tool_calls" and message["reasoning"] == "I look."
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"action": "look", "n": 2}
    served = ServedModel(str(glm4_dir), name="glm4", device="cpu")
    assert served.family.name == "glm4" and served.tool_format.name == "tool_call:glm4"
    assert_serves(served, {"model": "glm4", "messages": [{"role": "user", "content": "look around"}], "tools": tools,
                           "max_tokens": 8, "temperature": 0})
    assert_continues_from_written_ids(served)  # its history writes the reply with an empty think block
