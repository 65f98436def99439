"""gpt-oss (harmony) as a model family (issue 63): replies as channel messages read as openai-harmony reads them, the
analysis channel kept and trained but never sent to the env, episodes token-exact through `HarmonyRenderer`, and
`tiny:gptoss` end to end: collect -> SFT 2 steps -> GRPO 2 steps -> eval, and `turnforge serve`."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from test_families import (
    assert_continues_from_written_ids,
    assert_serves,
    assert_token_exact,
    run_family_recipe,
)
from turnforge.envs.base import load_tasks, make_env, with_family_format
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.formats.chat_template import chat_renderer, trl_chat_template
from turnforge.formats.families import detect_family, get_family, visible_reply
from turnforge.formats.harmony import (
    HarmonyRenderer,
    assistant_reply,
    parse_reply,
    render_conversation,
    split_reply,
)
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.types import Message, StopReason, ToolCall

CALL = '<|channel|>commentary to=functions.act <|constrain|>json<|message|>{"action": "look"}'
THINK = "<|channel|>analysis<|message|>The desk first.<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def gptoss_dir(build_tiny, tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("gptoss") / "tiny-gptoss", family="gptoss")


# ---- reading a reply ------------------------------------------------------------------------------------------

def test_the_family_is_read_from_gpt_oss_templates():
    assert detect_family(trl_chat_template("gptoss.jinja")).name == "gptoss"
    assert detect_family(trl_chat_template("gptoss_training.jinja")).name == "gptoss"


def test_a_reply_is_read_as_harmony_messages():
    (analysis, call) = parse_reply(THINK + CALL)
    assert (analysis.channel, analysis.recipient, analysis.body) == ("analysis", None, "The desk first.")
    assert (call.channel, call.recipient, call.content_type, call.body) == (
        "commentary", "functions.act", "json", '{"action": "look"}')
    # the recipient before the channel, no <|constrain|>: how gpt-oss's template writes calls in history
    (call,) = parse_reply(' to=functions.act<|channel|>commentary json<|message|>{"action": "look"}')
    assert (call.channel, call.recipient, call.content_type) == ("commentary", "functions.act", "json")
    (cut,) = parse_reply("<|channel|>commentary to=functions.act <|constr")
    assert cut.recipient == "functions.act" and not cut.complete
    assert parse_reply("no harmony at all") == []


def test_the_analysis_is_reasoning_and_the_env_reads_the_rest():
    family = get_family("gptoss")
    assert split_reply(THINK + "<|channel|>final<|message|>ACTION: look") == ("The desk first.", "ACTION: look")
    reasoning, visible = family.split_reasoning(THINK + CALL)
    assert reasoning == "The desk first." and visible == "<|start|>assistant" + CALL
    assert visible_reply(family, "<|channel|>analysis<|message|>still thinking") == ""  # cut off while reasoning
    assert visible_reply(family, "plain text") == "plain text"


def test_the_harmony_format_reads_calls_and_writes_what_it_reads():
    fmt = get_format("tool_call:harmony")
    assert fmt.parse(THINK + CALL) == Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look"})])
    preamble = "<|channel|>commentary<|message|>Looking.<|end|><|start|>assistant" + CALL
    assert fmt.parse(preamble).content == "Looking."
    assert fmt.parse(split_reply(preamble)[1]).content == "Looking."  # what the env is given: the same
    unicode = Message("assistant", "", tool_calls=[ToolCall("say", {"text": 'Zoë "東京"', "n": {"a": [1, None]}})])
    assert fmt.parse(fmt.render(unicode)) == unicode
    assert fmt.parse(fmt.render(unicode, thought="why")) == unicode  # the thought is analysis: not content
    assert fmt.render(Message("assistant", "done")) == "<|channel|>final<|message|>done"
    empty = "<|channel|>commentary to=functions.look <|constrain|>json<|message|>"
    assert fmt.parse(empty).tool_calls[0].arguments == {} and isinstance(fmt.parse_strict(empty), FormatError)
    python = "<|channel|>commentary to=functions.act <|constrain|>json<|message|>{'action': 'look'}"
    assert fmt.parse(python).tool_calls[0].arguments == {"action": "look"}
    assert "Python literal" in fmt.parse_strict(python).reason
    for bad, why in [
        ("<|channel|>commentary to=browser.search <|constrain|>json<|message|>{}", "only the env's functions"),
        ("<|channel|>commentary to=functions.act <|constrain|>json<|message|>{\"action\": ", "arguments are invalid JSON"),
        ("<|channel|>commentary to=functions.act <|constr", "cut off before"),
        ("<|channel|>final<|message|>ACTION: look", "no tool call"),
        ("<|channel|>commentary to=functions.act <|constrain|>json<|message|>[1]", "must be a JSON object"),
    ]:
        parsed = fmt.parse(bad)
        assert isinstance(parsed, FormatError) and why in parsed.reason, (bad, parsed)
    with pytest.raises(ValueError, match="one call per reply"):
        fmt.render(Message("assistant", "", tool_calls=[ToolCall("a", {}), ToolCall("b", {})]))


def test_the_templates_own_calls_read_back():
    """gpt-oss's template writes a call in history as `to=functions.f<|channel|>commentary json`: read the same."""
    tools = [{"type": "function", "function": {"name": "get", "description": "Get.", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    args = {"q": 'naïve "café"', "nested": {"k": [1, 2.5, True, None]}}
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "get", "arguments": args}}]}]
    text, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=trl_chat_template("gptoss.jinja"))
    reply = text[0].rsplit("<|start|>assistant", 1)[1].removesuffix("<|call|>")
    assert get_format("tool_call:harmony").parse(reply).tool_calls == [ToolCall("get", args)]


# ---- rendering --------------------------------------------------------------------------------------------------

def _template(messages, tools=None, generation_prompt=True) -> str:
    text, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=trl_chat_template("gptoss.jinja"),
                                    add_generation_prompt=generation_prompt)
    return text[0]


def test_user_and_tool_messages_render_as_gpt_oss_template_writes_them():
    """After a reply, the renderer writes user and tool messages exactly as the template does (unicode and quotes in a
    tool result go through its `tojson`); before the first reply the template writes everything itself."""
    tools = [{"type": "function", "function": {"name": "act", "description": "Act.", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}}}}}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "act", "arguments": {"action": "look"}}}]}
    head = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Task: look."}]
    tool = {"role": "tool", "name": "act", "content": 'Zoë sees "東京"\nand a desk.'}
    user = {"role": "user", "content": "Next: open it."}
    head_text = _template(head, tools, generation_prompt=False)
    ours = render_conversation([*head, call, tool], tools, True, lambda m, tools: _template(m, tools, False))
    theirs = _template([*head, call, tool], tools)
    assert ours.startswith(head_text) and theirs.startswith(head_text)
    assert ours.split("<|call|>", 1)[1] == theirs.split("<|call|>", 1)[1]  # the tool message and the prompt
    answer = {"role": "assistant", "content": "ACTION: look"}
    ours = render_conversation([*head, answer, user], None, True, lambda m, tools: _template(m, tools, False))
    theirs = _template([*head, answer, user])
    assert ours.split("<|return|>", 1)[1] == theirs.split("ACTION: look<|end|>", 1)[1]  # the template writes <|end|>
    assert assistant_reply(answer) == ("<|channel|>final<|message|>ACTION: look", "<|return|>")
    assert assistant_reply({**answer, "thinking": "T"})[0] == (
        "<|channel|>analysis<|message|>T<|end|><|start|>assistant<|channel|>final<|message|>ACTION: look")


def test_the_renderer_is_chosen_from_the_template(gptoss_dir):
    tokenizer = AutoTokenizer.from_pretrained(gptoss_dir)
    renderer = chat_renderer(tokenizer)
    assert isinstance(renderer, HarmonyRenderer) and renderer.family.name == "gptoss"
    with pytest.raises(ValueError, match="window must be at least 1"):
        chat_renderer(tokenizer, window=0)
    messages = [Message("user", "go"), Message("assistant", THINK + CALL), Message("tool", "ok", name="act")]
    # a reply cut by length gets its stop token from the delta; one that stopped has it already
    cut = renderer.observation_ids(messages[:2], messages[2:], None, [5], "length")
    stopped = renderer.observation_ids(messages[:2], messages[2:], None, [5, tokenizer.convert_tokens_to_ids("<|call|>")],
                                       "stop")
    assert tokenizer.decode(cut) == "<|call|>" + tokenizer.decode(stopped)
    assert tokenizer.decode(stopped).endswith("<|end|><|start|>assistant")
    # a tool message's author: its name, else the function the reply called, else (no call: a format error's
    # answer) the user
    unnamed = [Message("tool", "Invalid tool call.")]
    assert "<|start|>functions.act to=assistant" in tokenizer.decode(renderer.observation_ids(messages[:2], unnamed,
                                                                                              None, [5], "length"))
    answered = [Message("user", "go"), Message("assistant", "<|channel|>final<|message|>hm")]
    assert tokenizer.decode(renderer.observation_ids(answered, unnamed, None, [5], "length")) == (
        "<|return|><|start|>user<|message|>Invalid tool call.<|end|><|start|>assistant")
    completion = renderer.completion_ids([Message("user", "go"), Message("assistant", "ACTION: look")], None)
    assert tokenizer.decode(completion) == "<|channel|>final<|message|>ACTION: look<|return|>"


# ---- token-exact episodes ------------------------------------------------------------------------------------------

class HarmonyExpert:
    """The household expert's actions as gpt-oss writes them: an analysis message first, then the action (the final
    answer, or a call), as canonical ids + the reply's own stop token; it checks every prompt against the renderer's
    rendering of the whole conversation."""

    name = "harmony-expert"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.renderer = chat_renderer(tokenizer)
        self.expert = ExpertPolicy()

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            assert p.ids == self.reference(p.messages, p.tools)
        out = []
        for g in self.expert.generate(prompts, params):
            action = g.text if g.text.startswith("<|channel|>") else "<|channel|>final<|message|>" + g.text
            text = "<|channel|>analysis<|message|>I act.<|end|><|start|>assistant" + action
            end = "<|call|>" if "to=functions." in text else "<|return|>"
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids(end)]
            out.append(Generation(text, ids, [0.0] * len(ids), "stop"))
        return out

    def reference(self, messages, tools) -> list[int]:
        return self.tokenizer.encode(self.renderer.render(messages, tools, True), add_special_tokens=False)


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_rollout_ids_are_the_renderers_rendering_and_grpo_trains_the_sampled_ids(gptoss_dir, fmt):
    tokenizer = AutoTokenizer.from_pretrained(gptoss_dir)
    policy = HarmonyExpert(tokenizer)
    options = with_family_format("household", {"format": fmt}, policy.renderer.family)
    assert options["format"] == ("tool_call:harmony" if fmt == "tool_call" else "act_line")
    trajs = run_episodes(policy, lambda: make_env("household", **options), load_tasks("household", "train", limit=4), 1,
                         renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2  # the env never saw the analysis
        assert all(turn.parse_ok for turn in traj.turns)
        ids = assert_token_exact(traj, policy.reference(traj.messages, traj.tools))
        assert "I act." in tokenizer.decode(ids)  # every turn's analysis stays in the context


# ---- end to end ---------------------------------------------------------------------------------------------------

def test_gpt_oss_collects_trains_and_evaluates_in_its_own_format(tmp_path):
    collected, evaluated = run_family_recipe(tmp_path, "gptoss", "tool_call")
    assert all("<|channel|>commentary to=functions.act <|constrain|>json<|message|>" in t["text"]
               for e in collected for t in e["turns"])
    assert evaluated["tool_calls"]["format"] == "tool_call:harmony"


def test_serve_answers_gpt_oss_calls_and_reasoning(gptoss_dir):
    from turnforge.policies.serve import ServedModel, _reply

    family = get_family("gptoss")
    message, finish = _reply(Generation(text=THINK + CALL, ids=[1]), [], True, False, family,
                             get_format("tool_call:harmony"))
    assert finish == "tool_calls" and message["reasoning"] == "The desk first."
    assert message["tool_calls"][0]["function"] == {"name": "act", "arguments": '{"action": "look"}'}
    message, _ = _reply(Generation(text=THINK + "<|channel|>final<|message|>Done.", ids=[1]), [], True, False, family,
                        get_format("tool_call:harmony"))
    assert message["content"] == "Done." and "tool_calls" not in message
    served = ServedModel(str(gptoss_dir), name="gptoss", device="cpu")
    assert served.tool_format.name == "tool_call:harmony"
    tools = [{"type": "function", "function": {"name": "act", "description": "Act.", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}}}}}]  # gpt-oss's template needs a description
    assert_serves(served, {"model": "gptoss", "messages": [{"role": "user", "content": "look around"}], "tools": tools,
                           "max_tokens": 8, "temperature": 0})
    assert_continues_from_written_ids(served, history_end="<|end|>")  # where the model stopped on <|return|>
