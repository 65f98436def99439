"""Model families (issue 63): read from the template, token-exact per family, and every family end to end on a tiny model
with that family's template and tokens: collect -> SFT 2 steps -> GRPO 2 steps -> eval, and `turnforge serve`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from rich.console import Console
from transformers import AutoTokenizer

from turnforge.envs.base import load_tasks, make_env, with_family_format
from turnforge.formats import get_format
from turnforge.formats.chat_template import ChatTemplateRenderer, template_name, trl_chat_template
from turnforge.formats.families import (
    check_tool_format,
    detect_family,
    get_family,
    model_family,
    visible_reply,
)
from turnforge.models import load_model
from turnforge.pipeline import run_recipe
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.train.grpo_rollouts import episode_sequence
from turnforge.types import Message, StopReason

TOOL_FAMILIES = ["qwen3_thinking", "qwen3_5", "llama3", "lfm2", "granite4", "smollm3"]
FAMILIES = [*TOOL_FAMILIES, "gemma3", "phi3"]
"""The families beside the quickstart's qwen3 (tested everywhere else) that have a tiny model; Gemma 3's and Phi-3.5's
templates render no tools, so they play text formats only."""


@pytest.fixture(scope="session")
def family_model_dir(build_tiny, tmp_path_factory):
    built: dict[str, Path] = {}

    def build(family: str) -> Path:
        if family not in built:
            built[family] = build_tiny(tmp_path_factory.mktemp("families") / f"tiny-{family}", family=family)
        return built[family]

    return build


# ---- reading the family ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("template, family", [
    ("qwen3_instruct_2507.jinja", "qwen3"), ("qwen2_5.jinja", "qwen3"), ("qwen3.jinja", "qwen3_thinking"),
    ("qwen3_5_think.jinja", "qwen3_5"), ("qwen3_5_nothink.jinja", "qwen3_5"), ("qwen3_6.jinja", "qwen3_5"),
    ("qwen3_training.jinja", "qwen3_thinking"), ("llama3_2.jinja", "llama3"), ("llama3_1.jinja", "llama3"),
    ("lfm2.jinja", "lfm2"), ("gemma3.jinja", "gemma3"), ("phi3_5.jinja", "phi3"),
    ("phi3.jinja", "phi3"),
    ("turnforge/granite4.jinja", "granite4"), ("turnforge/smollm3.jinja", "smollm3"),
])
def test_the_family_is_read_from_the_template(template, family):
    found = detect_family(trl_chat_template(template))
    assert (found.name if found else None) == family


def test_reasoning_is_split_as_vllms_reasoning_parsers_split_it():
    thinking = get_family("qwen3_thinking")
    assert thinking.split_reasoning("<think>\nplan\n</think>\n\nACTION: go") == ("\nplan\n", "\n\nACTION: go")
    assert thinking.split_reasoning("plan</think>ACTION: go") == ("plan", "ACTION: go")  # open tag in the prompt
    assert thinking.split_reasoning("<think>\nstill thinking") == ("\nstill thinking", "")  # cut off: all reasoning
    assert get_family("llama3").split_reasoning("<think>x</think>y") == ("", "<think>x</think>y")
    assert visible_reply(thinking, "<think>a</think>\nACTION: look") == "\nACTION: look"
    assert visible_reply(None, "<think>a</think>b") == "<think>a</think>b"


def test_tool_call_means_the_models_own_tool_format():
    llama = get_family("llama3")
    assert with_family_format("household", {"format": "tool_call"}, llama) == {"format": "tool_call:llama3"}
    assert with_family_format("bfcl", {}, llama) == {"format": "tool_call:llama3"}  # the env's default format
    assert with_family_format("household", {"format": "act_line"}, llama) == {"format": "act_line"}
    assert with_family_format("household", {"format": "tool_call"}, get_family("qwen3")) == {"format": "tool_call"}
    assert make_env("household", format="tool_call:llama3").format.name == "tool_call:llama3"
    with pytest.raises(ValueError, match="household: format: 'tool_call:nope'|unknown format 'tool_call:nope'"):
        make_env("household", format="tool_call:nope")
    check_tool_format(llama, "tool_call:llama3")
    check_tool_format(llama, "act_line")
    with pytest.raises(ValueError, match="writes tool calls as tool_call:llama3, but the env reads tool_call: set"):
        check_tool_format(llama, "tool_call")
    assert model_family("tiny:lfm2").name == "lfm2" and model_family("tiny").name == "qwen3"


def test_eval_reports_how_the_calls_were_written_per_family():
    """summary.json's `tool_calls`: of the replies attempting a call (reasoning left out: a reply that never closes
    its reasoning is all reasoning, as vLLM's qwen3 parser reads it), the lenient and strict parse rates and the
    fixes, by hand on six replies."""
    from turnforge.eval.metrics import tool_call_quality
    from turnforge.types import Score, Trajectory, Turn

    call = '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    replies = [call, "<tool_call>\n{'name': 'act', 'arguments': {}}\n</tool_call>", "<tool_call>\nnot json", "I am done."]
    texts = [f"<think>\n</think>\n\n{reply}" for reply in replies] + [
        f"<think>\nmaybe {call}\n</think>\n\nno call after all", f"<think>\nstill thinking {call}"]
    turns = [Turn(text=text, generated_ids=[1], logprobs=[0.0]) for text in texts]
    traj = Trajectory(task_id="t", env="e", category="c", messages=[], turns=turns, score=Score(False, 0.0, 0.0),
                      stop_reason=StopReason.failure)
    quality = tool_call_quality([traj], get_format("tool_call"), get_family("qwen3_thinking"))
    assert quality == {"format": "tool_call", "family": "qwen3_thinking", "call_replies": 3, "parse_lenient": 2 / 3,
                       "parse_strict": 1 / 3, "fixes": {"Python literal instead of JSON (single quotes?)": 1}}
    # read without the family, the reasoning's calls are attempts too
    assert tool_call_quality([traj], get_format("tool_call"), None)["call_replies"] == 5


def test_the_rollout_gives_a_format_that_types_values_by_schema_the_episodes_tools():
    """GLM-4's values are untyped text, read by the tools' schemas as vLLM's parser reads them by the request's: the
    rollout binds the episode's tools to the env's format after each reset, through PlainTextEndsTurn too."""
    from turnforge.envs.household.env import ACTION_TOOL
    from turnforge.formats.base import bind_tools
    from turnforge.formats.plain_text import PlainTextEndsTurn

    env = make_env("household", format="tool_call:glm4")
    (traj,) = run_episodes(ExpertPolicy(), lambda: env, load_tasks("household", "train", limit=1), 1)
    assert traj.stop_reason is StopReason.success and env.format.tools == [ACTION_TOOL]
    counted = {"type": "function", "function": {"name": "take", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}}
    fmt = PlainTextEndsTurn(get_format("tool_call:glm4"))
    reply = "<tool_call>take\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    assert fmt.parse(reply).tool_calls[0].arguments == {"n": "2"}  # no schema: a string, as vLLM without tools
    bind_tools(fmt, [counted])
    assert fmt.parse(reply).tool_calls[0].arguments == {"n": 2}


# ---- token-exact per family -------------------------------------------------------------------------------------

class FamilyExpertTokens:
    """The expert's replies as a model of the family writes them (a thinking family's reasoning block first), as
    canonical ids + end-of-turn; it checks every prompt against the template the renderer renders with."""

    name = "family-expert-tokens"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.renderer = ChatTemplateRenderer(tokenizer)
        self.expert = ExpertPolicy()
        self.end_id = self.renderer.turn_end_ids[self.renderer.turn_ends[0]]  # the eos, or Phi-3.5's <|end|>

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:
            assert p.ids == self.reference(p.messages, p.tools)
        out = []
        for g in self.expert.generate(prompts, params):
            text = self.renderer.family.probe_reply(g.text)  # "<think>\nI act.\n</think>\n\n" + the action
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_id]
            out.append(Generation(text, ids, [0.0] * len(ids), "stop"))
        return out

    def reference(self, messages, tools) -> list[int]:
        return self.tokenizer.apply_chat_template([m.to_dict() for m in messages], tools=tools, add_generation_prompt=True,
                                                  chat_template=self.renderer.template)["input_ids"]


def assert_token_exact(traj, reference: list[int]) -> list[int]:
    """The episode's ids (prompt + per turn the generated ids and the observation delta) equal `reference`, and GRPO's
    sequence trains exactly the sampled ids (reasoning included), and only them; returns the ids."""
    ids = list(traj.prompt_ids)
    for turn in traj.turns:
        ids += turn.generated_ids + turn.observation_ids
    assert ids == reference
    prompt, completion, mask, _ = episode_sequence(traj, max_completion_length=len(ids))
    assert prompt + completion == ids[: len(prompt) + len(completion)]
    assert [t for t, m in zip(completion, mask, strict=True) if m] == [t for turn in traj.turns
                                                                       for t in turn.generated_ids]
    return ids


@pytest.mark.parametrize(("family", "fmt"), [
    *((family, fmt) for family in TOOL_FAMILIES for fmt in ("act_line", "tool_call")), ("gemma3", "act_line"),
    ("phi3", "act_line")])
def test_rollout_ids_are_the_family_templates_rendering(family_model_dir, family, fmt):
    """The episode's ids (prompt + generated + observation deltas) equal the family's template rendering the whole
    conversation; the env read each reply without its reasoning (the expert still wins every episode); GRPO's
    sequence trains exactly the sampled ids."""
    tokenizer = AutoTokenizer.from_pretrained(family_model_dir(family))
    policy = FamilyExpertTokens(tokenizer)
    options = with_family_format("household", {"format": fmt}, policy.renderer.family)
    trajs = run_episodes(policy, lambda: make_env("household", **options), load_tasks("household", "train", limit=4), 1,
                         renderer=policy.renderer)
    for traj in trajs:
        assert traj.stop_reason is StopReason.success and len(traj.turns) >= 2
        assert_token_exact(traj, policy.reference(traj.messages, traj.tools))
        assert all(turn.parse_ok for turn in traj.turns)


def test_a_thinking_template_renders_with_trls_training_variant_and_keeps_every_turns_reasoning(family_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(family_model_dir("qwen3_thinking"))
    renderer = ChatTemplateRenderer(tokenizer)
    assert template_name(tokenizer) == "chat template trl/chat_templates/qwen3.jinja"  # its own: drops reasoning
    assert template_name(tokenizer, renderer.template) == "chat template trl/chat_templates/qwen3_training.jinja"
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"},
                {"role": "user", "content": "obs"}]
    assert "R1" in tokenizer.decode(renderer.prompt_ids(messages, None))
    assert "R1" not in tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_the_renderer_writes_the_day_it_was_made_not_the_clocks(family_model_dir):
    """Llama 3's template writes today's date: the renderer fixes it when made, so an episode that crosses midnight
    stays one prefix-preserving sequence."""
    renderer = ChatTemplateRenderer(AutoTokenizer.from_pretrained(family_model_dir("llama3")))
    renderer.date_string = "01 Jan 2000"  # as if made that day
    prompt = renderer.tokenizer.decode(renderer.prompt_ids([Message("user", "go")], None))
    assert "Today Date: 01 Jan 2000" in prompt


def test_a_family_whose_template_renders_no_tools_is_refused_for_a_tool_env_in_one_line(family_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(family_model_dir("gemma3"))
    renderer = ChatTemplateRenderer(tokenizer)
    assert renderer.family.name == "gemma3" and renderer.family.tool_format is None
    env = make_env("household", **with_family_format("household", {"format": "tool_call"}, renderer.family))
    messages = env.reset(load_tasks("household", "train", limit=1)[0])
    with pytest.raises(ValueError, match=r"gemma3\.jinja does not render tools.*format=react, or act_line"):
        renderer.prompt_ids(messages, env.tools())


@pytest.mark.parametrize(("template", "opened"), [("qwen3_5_think", True), ("qwen3_5_nothink", False), ("qwen3", None)])
def test_the_reasoning_starts_where_the_generation_prompt_leaves_it(family_model_dir, template, opened):
    """Qwen3.5 think opens `<think>` in the prompt (the reply starts inside it), no-think closes an empty block (the reply
    has none), Qwen3's leaves it to the reply; each renders with its own TRL training variant."""
    tokenizer = AutoTokenizer.from_pretrained(family_model_dir("qwen3_5"))
    tokenizer.chat_template = trl_chat_template(f"{template}.jinja")
    renderer = ChatTemplateRenderer(tokenizer)
    assert template_name(tokenizer, renderer.template) == f"chat template trl/chat_templates/{template}_training.jinja"
    assert renderer.family.prompt_reasoning is opened
    reply = "plan\n</think>\n\nACTION: look" if opened else "<think>\nplan\n</think>\n\nACTION: look"
    assert visible_reply(renderer.family, "ACTION: look" if opened is False else reply).strip() == "ACTION: look"


# ---- every family end to end ------------------------------------------------------------------------------------

RECIPE = """\
name = "family-{family}"

[model]
name = "tiny:{family}"

[env]
name = "household"
format = "{format}"

[[stages]]
kind = "collect"
tasks = 16

[[stages]]
kind = "sft"
data = ["collect"]
max_steps = 2
batch_size = 2
max_length = 2048
logging_steps = 1
learning_rate = 1e-3

[[stages]]
kind = "grpo"
model = "sft"
steps = 2
tasks = 4
tasks_per_step = 2
num_generations = 2
max_new_tokens = 24
max_completion_length = 512
mask_truncated_completions = false  # a 2-step SFT model seldom ends its last turn within max_new_tokens
learning_rate = 1e-2
env = {{ max_steps = 3 }}
# A 2-step SFT model rarely writes a valid call: the episodes' lengths (DAPO's soft overlong penalty over a
# 500-token buffer) are what differ within a group.
rewards = {{ outcome = 1.0, format = 1.0, overlong = 1.0, overlong_buffer = 500 }}

[[stages]]
kind = "eval"
model = "grpo"
tasks = 2
max_new_tokens = 12
env = {{ max_steps = 2 }}
"""

CALL_TEXT = {"qwen3_thinking": '<tool_call>\n{"name": "act"', "llama3": '{"name": "act", "parameters": {',
             "lfm2": "<|tool_call_start|>[act(", "qwen3_5": "<tool_call>\n<function=act>\n<parameter=action>\n",
             "granite4": '<tool_call>\n{"name": "act", "arguments": {', "smollm3": '<tool_call>\n{"name": "act"'}


def _changed(before: Path, after: Path) -> list[str]:
    """Names of the parameters that differ between two saved models."""
    old, _ = load_model(str(before), dtype="float32", device="cpu")
    new, _ = load_model(str(after), dtype="float32", device="cpu")
    trained = dict(new.named_parameters())
    return [n for n, p in old.named_parameters() if not torch.equal(p, trained[n])]


def run_family_recipe(tmp_path: Path, family: str, fmt: str, recipe: str | None = None) -> tuple[list[dict], dict]:
    """Run `recipe` (RECIPE for `tiny:FAMILY` in `fmt` by default) and check what every family must give: 16 expert
    episodes won, SFT changing the model, GRPO changing every parameter, the eval playing the family's format (a tool
    format: its own, with its `tool_calls` block). Returns (the collected episodes, the eval's summary)."""
    path = tmp_path / f"{family}.toml"
    path.write_text(recipe or RECIPE.format(family=family, format=fmt))
    out = tmp_path / "run"
    run_recipe(path, out, console=Console(quiet=True))
    stages = out / "stages"
    collected = [json.loads(line) for line in (stages / "01-collect" / "trajectories.jsonl").read_text().splitlines()]
    assert len(collected) == 16 and all(e["stop_reason"] == "success" for e in collected)
    assert _changed(out / "models" / f"tiny-{family}", stages / "02-sft" / "model")
    start, grpo = stages / "02-sft" / "model", stages / "03-grpo" / "model"
    assert _changed(start, grpo) == [n for n, _ in load_model(str(start), device="cpu")[0].named_parameters()]
    evaluated = json.loads((out / "eval" / "eval" / "summary.json").read_text())
    if fmt == "tool_call":
        assert evaluated["env_options"]["format"] == get_family(family).tool_format
        assert evaluated["tool_calls"]["format"] == get_family(family).tool_format
        assert evaluated["tool_calls"]["family"] == family
    else:
        assert evaluated["env_options"]["format"] == fmt and "tool_calls" not in evaluated
    return collected, evaluated


def assert_serves(served, body: dict) -> dict:
    """`turnforge serve` over `served` answers the chat request `body` as an assistant message, streamed too; returns
    the answer's message."""
    from turnforge.policies.serve import running_server

    with running_server(served) as url:
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["message"]["role"] == "assistant", answer
        streamed = httpx.post(f"{url}/chat/completions", json={**body, "stream": True}, timeout=120).text
        assert streamed.rstrip().endswith("data: [DONE]")
    return answer["choices"][0]["message"]


def assert_continues_from_written_ids(served, history_end: str | None = None) -> None:
    """A request that continues a reply `served` made starts from the ids the model wrote (here one id per character
    of the reply as the template renders it, and the end token it stopped on), then the whole text's tokenization from
    the template's end of the reply on (`ReplyMemory`): where the family writes another end in history than the one
    its model stops on (GLM-4.5's next role, gpt-oss's <|end|>) and where an end token swallows the newline after it
    (Phi-3's). `history_end`: the token the template ends a reply with in history, where it is none of the ends the
    model stops on (gpt-oss's <|end|>)."""
    from turnforge.formats.chat_template import encode, render
    from turnforge.policies.serve import ChatRequest, _prepare, _prompt_ids, _remember

    tok = served.tokenizer
    first = [{"role": "user", "content": "find the apple"}]
    reply = {"role": "assistant", "content": "go to desk 1"}
    head = render(tok, first, None, True)
    after = render(tok, [*first, reply, {"role": "user", "content": "You arrive at desk 1."}], None, True)
    end = min(at for end in ([history_end] if history_end else served.turn_ends) if (at := after.find(end, len(head))) >= 0)
    written = [i for ch in after[len(head):end] for i in encode(tok, ch)]
    assert written != encode(tok, after[len(head):end])  # not what re-tokenizing the text gives
    stopped_on = tok.convert_tokens_to_ids(served.turn_ends[0])
    prompt = encode(tok, head)
    request = ChatRequest(model=served.name, messages=first)
    job = _prepare(served, request)
    assert job.ids == prompt
    _remember(served, request, job, reply, [*written, stopped_on])
    ids = _prompt_ids(served, served.name, after)
    assert ids[: len(prompt) + len(written)] == prompt + written
    rest = ids[len(prompt) + len(written):]
    assert rest == encode(tok, after)[-len(rest):] and tok.decode(rest[:1]) == after[end:].split(">")[0] + ">"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_collects_trains_and_evaluates_in_its_own_format(family, tmp_path):
    """`model = "tiny:FAMILY"` with `format = "tool_call"`: the expert demonstrates in the family's tool-call format,
    SFT trains 2 steps and GRPO 2 steps on its model (every parameter changes), the eval plays it."""
    tools = family in TOOL_FAMILIES
    collected, _ = run_family_recipe(tmp_path, family, "tool_call" if tools else "act_line")
    assert all(CALL_TEXT[family] in t["text"] for e in collected for t in e["turns"]) if tools else all(
        t["text"].startswith("ACTION: ") for e in collected for t in e["turns"])


def test_serve_answers_tool_calls_and_reasoning_in_the_models_family_format(family_model_dir):
    """`turnforge serve` over each family's tiny model: a chat request with `tools` answers (streamed too); the reply
    text is read in the family's tool-call format and a thinking model's reasoning comes apart."""
    from turnforge.policies.serve import ServedModel, _reply

    lfm2 = get_family("lfm2")
    text = '<|tool_call_start|>[act(action="look")]<|tool_call_end|>'
    message, finish = _reply(Generation(text=text, ids=[1]), [], True, False, lfm2, get_format("tool_call:lfm2"))
    assert finish == "tool_calls" and message["tool_calls"][0]["function"] == {"name": "act",
                                                                               "arguments": '{"action": "look"}'}
    thinking = get_family("qwen3_thinking")
    text = '<think>\nI look.\n</think>\n\n<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    message, finish = _reply(Generation(text=text, ids=[1]), [], True, False, thinking, get_format("tool_call"))
    assert finish == "tool_calls" and message["reasoning"] == "I look." and message["tool_calls"]
    tools = [{"type": "function", "function": {"name": "act", "parameters": {
        "type": "object", "properties": {"action": {"type": "string"}}}}}]
    for family in FAMILIES:
        served = ServedModel(str(family_model_dir(family)), name=family, device="cpu")
        assert served.tool_format.name == (get_family(family).tool_format or "tool_call")
        assert_serves(served, {"model": family, "messages": [{"role": "user", "content": "look around"}],
                               "tools": tools, "max_tokens": 8, "temperature": 0})
        if get_family(family).reasoning is None:  # a thinking template renders a last reply otherwise than in history
            assert_continues_from_written_ids(served)
