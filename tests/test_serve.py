"""`turnforge serve` on loopback, driven by the openai client and by turnforge's own openai policy.

The served tiny model must give the same greedy episodes through HTTP as in-process (issue 14, requirement 6).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

from turnforge.formats import get_format
from turnforge.policies.base import Generation, SamplingParams
from turnforge.policies.serve import ServedModel, _reply, running_server
from turnforge.rollout import RolloutLimits
from turnforge.rollouts_file import run_eval
from turnforge.types import StopReason, Trajectory

openai = pytest.importorskip("openai")

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def adapter_dir(tiny_adapter_dir):
    """A LoRA adapter with random (non-zero) weights on the tiny model (conftest): it changes what the model writes."""
    return tiny_adapter_dir


@pytest.fixture(scope="module")
def served(tiny_model_dir, adapter_dir):
    return ServedModel(str(tiny_model_dir), name="tiny", adapters={"lora": str(adapter_dir)}, device="cpu")


@pytest.fixture(scope="module")
def url(served):
    with running_server(served) as base_url:
        yield base_url


@pytest.fixture
def client(url):
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _ask(client, **kw):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "go to fridge 1"}], "temperature": 0,
            "max_tokens": 8} | kw
    return client.chat.completions.create(**body)


def test_models_and_a_completion_with_ids_logprobs_and_usage(client, served):
    assert [m.id for m in client.models.list().data] == ["tiny", "lora"]
    reply = _ask(client, logprobs=True, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    ids = choice.model_extra["token_ids"]
    assert reply.usage.completion_tokens == len(ids) == len(choice.logprobs.content) and 0 < len(ids) <= 8
    assert choice.finish_reason in ("stop", "length")
    prompt = served.tokenizer.apply_chat_template([{"role": "user", "content": "go to fridge 1"}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert reply.model_extra["prompt_token_ids"] == prompt and reply.usage.prompt_tokens == len(prompt)
    assert served.tokenizer.decode([i for i in ids if i != served.tokenizer.eos_token_id]) == choice.message.content
    two = _ask(client, n=2, temperature=1.0, seed=3)
    assert len(two.choices) == 2 and two.usage.prompt_tokens == len(prompt)


def test_an_adapter_is_chosen_by_model_name(client, tiny_model_dir, adapter_dir):
    from turnforge.policies.base import Prompt
    from turnforge.policies.hf import HFPolicy
    from turnforge.types import Task

    base, tuned = _ask(client, max_tokens=12), _ask(client, model="lora", max_tokens=12)
    in_process = HFPolicy(str(tiny_model_dir), device="cpu", adapter=str(adapter_dir))
    prompt = Prompt(messages=[], task=Task("t", "x", "", ""), sample=0, turn=0,
                    ids=in_process.renderer.prompt_ids([{"role": "user", "content": "go to fridge 1"}], None))
    expected = in_process.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=12))[0]
    assert tuned.choices[0].message.content == expected.text != base.choices[0].message.content


def test_errors_are_openai_shaped(url, client, served):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _ask(client, model="nope")
    with pytest.raises(openai.BadRequestError, match="n: "):
        _ask(client, n=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length") as refused:
        _ask(client, max_tokens=served.max_context)
    assert refused.value.code == "context_length_exceeded"
    answer = httpx.post(f"{url}/chat/completions", json={"model": "tiny", "messages": [], "stream": True})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(("change", "param", "says"), [
    ({"tools": [{"type": "function"}]}, "tools.0.function", "Field required"),
    ({"tools": [{"type": "function", "function": {"name": "act"}}], "stream": True}, None, None),
    ({"messages": [{"role": "user", "content": 42}]}, "messages.0.content", "not int"),
    ({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, "messages.0.content", "part 0 is not"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]}]}, None, None),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "messages.0.role", "'user'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages.1.tool_calls.0.function.name", "Field required"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": True, "tools": [{"function": {"name": 7}}]},
     "tools.0.function.name", "valid string"),
])
def test_a_request_not_of_openais_shape_is_a_400_naming_the_field(url, change, param, says):
    """Issue 60: a tool without its function, or a message whose content is a number, got 200 OK (vLLM answers 400,
    and the README promises it): pydantic checks OpenAI's shape of messages and tools, before a stream begins."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1} | change
    answer = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
    if param is None:  # OpenAI's shape: served
        assert answer.status_code == 200, answer.text
        return
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == param and says in error["message"], error
    assert error["message"].startswith(f"{param}: ") and "\n" not in error["message"]


def test_a_tool_call_conversation_renders_as_the_chat_template_does(client, served):
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {
        "action": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "find the apple"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "act", "arguments": '{"action": "look"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "You see a fridge 1."},
    ]
    reply = client.chat.completions.create(model="tiny", messages=messages, tools=tools, temperature=0, max_tokens=4,
                                           extra_body={"return_token_ids": True})
    as_template = [messages[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "act", "arguments": {"action": "look"}}}]}, messages[2]]
    expected = served.tokenizer.apply_chat_template(as_template, tools=tools, add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
    assert reply.model_extra["prompt_token_ids"] == expected


def test_tool_call_blocks_become_tool_calls():
    text = 'I look.\n<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    hermes = (None, get_format("tool_call"))  # a template of no known family: Qwen3 / Hermes blocks
    message, finish = _reply(Generation(text=text, ids=[1, 2]), [], True, False, *hermes)
    assert finish == "tool_calls" and message["content"] == "I look."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "act", "arguments": '{"action": "look"}'} and call["id"].startswith("call_")
    # without tools, or cut by the length limit, the text stays text
    assert _reply(Generation(text=text, ids=[1]), [], False, False, *hermes)[1] == "stop"
    assert _reply(Generation(text=text, finish_reason="length"), [], True, False, *hermes)[1] == "length"
    # OpenAI's stop strings end the text before them, unless vLLM's include_stop_str_in_output asks otherwise
    assert _reply(Generation(text="go to x\nobs"), ["\n"], False, False, *hermes)[0]["content"] == "go to x"
    assert _reply(Generation(text="go to x\n"), ["\n"], False, True, *hermes)[0]["content"] == "go to x\n"


def _episodes(out) -> list[Trajectory]:
    return [Trajectory.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_a_prompt_past_the_context_ends_its_episode_alike_through_http_and_in_process(url, served, tiny_model_dir,
                                                                                     tmp_path):
    """Issue 40 (9): serve refused a prompt with no room for max_tokens (HTTP 400), on which the openai policy
    stopped the whole run, while the hf policy generated past the model's positions. Both now end the episode with
    stop reason max_tokens, by serve's rule and in its words (`context_refusal`), and the run goes on."""
    params = SamplingParams(temperature=0.0, max_new_tokens=served.max_context)  # no prompt leaves room for it
    common = dict(env="household", env_options={"format": "act_line"}, split="test", n_tasks=2, samples=1, seed=0,
                  params=params)
    refusal = rf"This model's maximum context length is {served.max_context} tokens; the messages take \d+"
    with pytest.warns(RuntimeWarning, match=refusal):
        run_eval(policy_spec=f"openai:{url}#tiny", out_dir=tmp_path / "http", policy_options={"concurrency": 2},
                 **common)
    with pytest.warns(RuntimeWarning, match=refusal):
        run_eval(policy_spec="hf", model=str(tiny_model_dir), out_dir=tmp_path / "hf", policy_options={"device": "cpu"},
                 **common)
    for out in ("http", "hf"):
        assert [(e.stop_reason, len(e.turns)) for e in _episodes(tmp_path / out)] == [(StopReason.max_tokens, 0)] * 2


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_household_eval_through_http_equals_the_in_process_eval(url, tiny_model_dir, tmp_path, fmt):
    """Greedy, same tasks: the same episodes token for token, and the same summary but for who ran it."""
    limits = RolloutLimits(max_turns=4, max_open=4)
    common = dict(env="household", env_options={"format": fmt}, split="test", n_tasks=4, samples=1, seed=0,
                  limits=limits, params=GREEDY)
    local = run_eval(policy_spec="hf", model=str(tiny_model_dir), out_dir=tmp_path / "hf",
                     policy_options={"device": "cpu"}, **common)
    http = run_eval(policy_spec=f"openai:{url}#tiny", out_dir=tmp_path / "http",
                    policy_options={"concurrency": 4}, **common)
    differ = {k for k in local.keys() | http.keys() if local.get(k) != http.get(k)}
    # tool_calls: the same counts; only the in-process policy knows the model's family (a server's client does not)
    assert differ == {"policy", "wall_s", "wall_s_invocation", "usage"} | ({"tool_calls"} if fmt == "tool_call" else set())
    if fmt == "tool_call":
        assert local["tool_calls"] == {**http["tool_calls"], "family": "qwen3"} and http["tool_calls"]["family"] is None
    assert http["usage"]["completion_tokens"] == http["tokens_generated"] > 0 and http["usage"]["retries"] == 0
    assert http["sampling"] == local["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                                     "max_new_tokens": 12, "stop": [], "seed": 0, "explore": 1.0}
    by_key = {e.key: e for e in _episodes(tmp_path / "hf")}
    for episode in _episodes(tmp_path / "http"):
        twin = by_key[episode.key]
        assert [m.to_dict() for m in episode.messages] == [m.to_dict() for m in twin.messages]
        assert [t.generated_ids for t in episode.turns] == [t.generated_ids for t in twin.turns]
        for a, b in zip(episode.turns, twin.turns, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_the_serve_command_listens_and_stops(tiny_model_dir):
    command = [sys.executable, "-c", "from turnforge.cli import app; app()", "serve", "--model", str(tiny_model_dir),
               "--name", "tiny", "--port", "0", "--device", "cpu"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # "serving tiny at http://127.0.0.1:PORT/v1 (Ctrl-C stops)"
        assert line.startswith("serving tiny at http://127.0.0.1:"), line + process.stderr.read()
        base = line.split(" at ")[1].split()[0]
        for _ in range(200):  # bounded: the socket listens before uvicorn answers
            try:
                models = httpx.get(f"{base}/models", timeout=5).json()
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert [m["id"] for m in models["data"]] == ["tiny"]
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode is not None


def test_serve_refuses_bad_adapters_and_a_busy_port(tiny_model_dir):
    from typer.testing import CliRunner

    from turnforge.cli import app

    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_model_dir), "--adapter", "nopath"])
    assert result.exit_code == 2 and "is not NAME=PATH" in result.output
    from turnforge.policies.serve import bind

    taken = bind("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match="pick another --port"):
            bind("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_summary_records_usage_and_the_model_must_be_named_when_there_are_several(tmp_path, url):
    out = tmp_path / "one"
    with pytest.raises(ValueError, match=r"serves 2 models \(tiny, lora\); name one: --policy openai:.*#MODEL"):
        run_eval("household", {}, f"openai:{url}", "test", 1, 1, 0, out, params=GREEDY)
    summary = run_eval("household", {}, f"openai:{url}#lora", "test", 1, 1, 0, out,
                       limits=RolloutLimits(max_turns=1), params=GREEDY)
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["usage"]["requests"] == 1 and on_disk == summary


def test_a_continued_conversation_starts_from_the_ids_the_model_wrote(served):
    """Re-tokenizing a reply's text need not give the ids the model wrote; the server continues from the latter."""
    from turnforge.formats.chat_template import encode, render
    from turnforge.policies.serve import ChatRequest, _prepare, _prompt_ids, _remember

    tok = served.tokenizer
    first = [{"role": "user", "content": "find the apple"}]
    prompt = encode(tok, render(tok, first, None, True))
    written = [i for ch in "go to desk 1" for i in encode(tok, ch)] + [served.tokenizer.eos_token_id]  # one id per character
    assert written[:-1] != encode(tok, "go to desk 1")  # not what re-tokenizing the text gives
    reply = {"role": "assistant", "content": "go to desk 1"}
    request = ChatRequest(model="tiny", messages=first)
    job = _prepare(served, request)
    assert job.ids == prompt
    _remember(served, request, job, reply, written)
    after = [*first, reply, {"role": "user", "content": "You arrive at desk 1."}]
    ids = _prompt_ids(served, "tiny", render(tok, after, None, True))
    assert ids[: len(prompt) + len(written)] == prompt + written
    assert tok.decode(ids) == render(tok, after, None, True)
    # another model name (an adapter) does not share the memory
    assert _prompt_ids(served, "lora", render(tok, after, None, True)) == encode(tok, render(tok, after, None, True))
