"""The openai policy against a small misbehaving OpenAI-compatible server on loopback (a real HTTP server).

Each request takes the next step of the server's script: an HTTP status, a slow answer, a malformed body, or a
chat completion. What the client sent is recorded.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.policies import make_policy
from turnforge.policies.base import CONTEXT_LENGTH, BackendError, Prompt, SamplingParams, explores
from turnforge.policies.openai import chat_messages
from turnforge.rollout import RolloutLimits
from turnforge.rollouts_file import run_eval
from turnforge.types import Message, Task, ToolCall, Trajectory

pytest.importorskip("openai")

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "request_timeout": 0.5}


def completion(content="ACTION: look", tool_calls=None) -> dict:
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}


class Scripted(ThreadingHTTPServer):
    """`script`: steps consumed one per chat request; the last one repeats. A step is ("ok", body),
    ("status", code, headers), ("error", code, body), ("slow", seconds), ("malformed",)."""

    daemon_threads = True

    def __init__(self, script):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script, self.requests, self.headers_seen, self.lock = list(script), [], [], threading.Lock()

    def next_step(self):
        with self.lock:
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # /v1/models
        self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(body)
        self.server.headers_seen.append(dict(self.headers))
        step = self.server.next_step()
        if step[0] == "error":
            self._send(step[1], step[2])
        elif step[0] == "status":
            self._send(step[1], {"error": {"message": f"scripted {step[1]}", "type": "x"}}, step[2] if len(step) > 2 else {})
        elif step[0] == "slow":
            time.sleep(step[1])
            self._send(200, completion())
        elif step[0] == "malformed":
            self._send_raw(200, b'{"id": "x", "choices": [ {')
        else:
            self._send(200, step[1])

    def _send(self, code, body, headers=None):
        self._send_raw(code, json.dumps(body).encode(), headers)

    def _send_raw(self, code, data, headers=None):
        try:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def serve_script():
    servers = []

    def start(*script):
        server = Scripted(script)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _prompt() -> Prompt:
    return Prompt(messages=[Message("user", "hi")], task=Task("t", "household", "test", "c"), sample=0, turn=0)


def _policy(url, **kw):
    return make_policy(f"openai:{url}#m", **(FAST | kw))


def test_429_then_success_is_retried_and_usage_counted(serve_script):
    server, url = serve_script(("status", 429, {"Retry-After": "0"}), ("ok", completion("ACTION: look")))
    policy = _policy(url)
    (gen,) = policy.generate([_prompt()], SamplingParams())
    assert gen.text == "ACTION: look" and len(server.requests) == 2
    assert policy.usage.to_dict() == {"requests": 1, "prompt_tokens": 10, "completion_tokens": 3, "retries": 1}


def test_replies_explore_leaves_out_are_asked_for_greedily(serve_script):
    """`SamplingParams.explore`: the requests `explores` leaves out go at temperature 0, the others as set."""
    prompts = [dataclasses.replace(_prompt(), turn=k) for k in range(12)]
    server, url = serve_script(*[("ok", completion())] * len(prompts))
    params = SamplingParams(temperature=0.8, explore=0.5)
    _policy(url).generate(prompts, params)
    sent = [r["temperature"] for r in server.requests]
    assert sent == [0.8 if explores(params, p) else 0.0 for p in prompts] and set(sent) == {0.0, 0.8}


def test_500s_until_retries_run_out_say_so_in_one_line(serve_script):
    server, url = serve_script(("status", 500,))
    with pytest.raises(BackendError) as info:
        _policy(url, max_retries=2).generate([_prompt()], SamplingParams())
    message = str(info.value)
    assert "\n" not in message and f"{url} answered HTTP 500 after 3 attempts" in message and "scripted 500" in message
    assert len(server.requests) == 3


def test_a_slow_answer_times_out_and_is_retried(serve_script):
    server, url = serve_script(("slow", 1.5), ("ok", completion("ACTION: go to desk 1")))
    policy = _policy(url, request_timeout=0.3)
    (gen,) = policy.generate([_prompt()], SamplingParams())
    assert gen.text == "ACTION: go to desk 1" and policy.usage.retries == 1
    _, always_slow = serve_script(("slow", 1.0))
    with pytest.raises(BackendError, match=r"did not answer within 0.3 s, after 2 attempts"):
        _policy(always_slow, request_timeout=0.3, max_retries=1).generate([_prompt()], SamplingParams())


def test_malformed_json_is_retried_then_reported(serve_script):
    _, url = serve_script(("malformed",), ("ok", completion()))
    assert _policy(url).generate([_prompt()], SamplingParams())[0].text == "ACTION: look"
    _, broken = serve_script(("malformed",))
    with pytest.raises(BackendError, match="returned a malformed completion after 2 attempts"):
        _policy(broken, max_retries=1).generate([_prompt()], SamplingParams())


def test_no_server_names_the_url_and_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed at once: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(BackendError) as info:
        make_policy(f"openai:{url}", **FAST, max_retries=1)  # no #model: asks the server which, and finds none
    assert str(info.value).startswith(f"no server at {url} (") and "turnforge serve" in str(info.value)


def test_4xx_is_not_retried(serve_script):
    server, url = serve_script(("status", 401,))
    with pytest.raises(BackendError, match="HTTP 401 .*set OPENAI_API_KEY"):
        _policy(url).generate([_prompt()], SamplingParams())
    assert len(server.requests) == 1
    _, url = serve_script(("status", 400,))
    with pytest.raises(BackendError, match="HTTP 400 .*scripted 400"):  # names none of the extensions
        _policy(url).generate([_prompt()], SamplingParams())


def test_a_prompt_refused_for_the_context_ends_its_episode_not_the_run(serve_script):
    """Issue 40 (9): vLLM's server (no error code, its own words) and `turnforge serve` / OpenAI (code
    context_length_exceeded) refuse a prompt with no room for max_tokens; the reply is the in-process backends'
    refusal (stop reason max_tokens in a rollout), not a BackendError that stops every episode."""
    vllm = {"object": "error", "type": "BadRequestError", "param": None, "code": 400, "message": (
        "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens (4100 in the "
        "messages, 100 in the completion). Please reduce the length of the messages or completion.")}
    ours = {"error": {"message": "This model's maximum context length is 4096 tokens; the messages take 4100 and "
                      "max_tokens is 100", "type": "invalid_request_error", "param": "messages",
                      "code": "context_length_exceeded"}}
    server, url = serve_script(("error", 400, vllm), ("error", 400, ours))
    policy = _policy(url)
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="maximum context length is 4096 tokens"):
            (gen,) = policy.generate([_prompt()], SamplingParams(max_new_tokens=100))
        assert gen.finish_reason == CONTEXT_LENGTH and gen.ids == [] and "4096" in gen.text
    assert len(server.requests) == 2  # neither retried


def test_a_server_refusing_return_token_ids_is_asked_again_without_it(serve_script):
    class Refuses(Scripted):
        def next_step(self):
            if "return_token_ids" in self.requests[-1]:
                return ("status", 400)
            return ("ok", completion())

    server = Refuses([("ok", completion())])
    server.RequestHandlerClass = type("H", (_Handler,), {"_send": _refusal_message})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        policy = _policy(f"http://127.0.0.1:{server.server_address[1]}/v1")
        assert policy.generate([_prompt()], SamplingParams())[0].text == "ACTION: look"
        assert policy.generate([_prompt()], SamplingParams())[0].text == "ACTION: look"
        assert ["return_token_ids" in r for r in server.requests] == [True, False, False]
    finally:
        server.shutdown()
        server.server_close()


def _refusal_message(self, code, body, headers=None):
    if code == 400:
        body = {"error": {"message": "Unrecognized request argument supplied: return_token_ids"}}
    _Handler._send(self, code, body, headers)


def test_tool_calls_go_as_tool_calls_with_matching_ids_and_come_back_as_format_text(serve_script, tmp_path):
    call = {"id": "srv_1", "type": "function", "function": {"name": "act", "arguments": '{"action": "look"}'}}
    server, url = serve_script(("ok", completion(None, [call])))
    summary = run_eval("household", {"format": "tool_call"}, f"openai:{url}#m", "test", 1, 1, 0, tmp_path,
                       limits=RolloutLimits(max_turns=3), params=SamplingParams(temperature=0.0),
                       policy_options=FAST)
    assert summary["n_episodes"] == 1 and summary["usage"]["requests"] == 3
    (episode,) = [Trajectory.from_json(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert all(t.parse_ok for t in episode.turns)  # the env's own parse read the rendered call
    assert episode.turns[0].text == '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    first, third = server.requests[0], server.requests[2]
    assert first["tools"][0]["function"]["name"] == "act" and first["seed"] != third["seed"]
    sent = third["messages"]
    assistants = [m for m in sent if m["role"] == "assistant"]
    tools = [m for m in sent if m["role"] == "tool"]
    assert [a["tool_calls"][0]["id"] for a in assistants] == [t["tool_call_id"] for t in tools] == ["call_2_0", "call_4_0"]
    assert assistants[0]["tool_calls"][0]["function"] == {"name": "act", "arguments": '{"action": "look"}'}


def test_text_formats_send_the_conversation_as_written():
    messages = [Message("system", "s"), Message("user", "task"), Message("assistant", "ACTION: look"),
                Message("tool", "obs", name="act")]
    assert chat_messages(messages) == [
        {"role": "system", "content": "s"}, {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ACTION: look"}, {"role": "tool", "content": "obs", "name": "act"},
    ]
    # tool format: a reply without a call stays text; a tool message answering no call carries no id
    from turnforge.formats import get_format

    calls = [Message("assistant", "x", tool_calls=[ToolCall("act", {"action": "a"}), ToolCall("act", {"action": "b"})]),
             Message("tool", "A"), Message("tool", "B"), Message("assistant", "no call"), Message("tool", "err")]
    sent = chat_messages(calls, get_format("tool_call"))
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["call_0_0", "call_0_1", None]
    assert sent[3] == {"role": "assistant", "content": "no call"}


def test_a_failing_server_stops_the_run_in_one_line_and_keeps_finished_episodes(serve_script, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TEST_KEY", "sk-secret-123")
    _, url = serve_script(("ok", completion()), ("ok", completion()), ("ok", completion()), ("status", 503))
    out = tmp_path / "run"
    args = ["eval", "--env", "household", "--tasks", "6", "--max-turns", "1", "--limit-open", "1", "--concurrency", "1",
            "--policy", f"openai:{url}#m", "--api-key-env", "TF_TEST_KEY", "--max-retries", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "answered HTTP 503 after 2 attempts" in lines[0]
    assert "3 finished episodes are kept" in lines[0] and "the same command resumes" in lines[0]
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 3
    for path in out.iterdir():  # the key is read from the environment and written nowhere
        assert "sk-secret-123" not in path.read_text()


def test_the_api_key_comes_from_the_environment(serve_script, monkeypatch):
    server, url = serve_script(("ok", completion()))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    _policy(url).generate([_prompt()], SamplingParams())
    headers = {k.lower(): v for k, v in server.headers_seen[-1].items()}
    assert headers["authorization"] == "Bearer sk-from-env"
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE is not set"):
        _policy(url, api_key_env="NOT_SET_ANYWHERE")


def test_eval_sampling_flags_reach_the_server_and_summary_and_greedy_samples_warn(serve_script, tmp_path):
    server, url = serve_script(("ok", completion()))
    args = ["eval", "--env", "household", "--tasks", "1", "--max-turns", "1", "--policy", f"openai:{url}#m",
            "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--max-new-tokens", "7", "--stop", "\n",
            "--stop", "END", "--seed", "3", "--out", str(tmp_path / "sampled")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "sampled" / "summary.json").read_text())
    assert summary["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_new_tokens": 7,
                                   "stop": ["\n", "END"], "seed": 3, "explore": 1.0}
    sent = server.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"], sent["stop"]) == (0.7, 0.9, 7, ["\n", "END"])
    assert sent["top_k"] == 5 and sent["include_stop_str_in_output"] and sent["return_token_ids"]
    with pytest.warns(UserWarning, match="2 identical episodes per task"):
        run_eval("household", {}, f"openai:{url}#m", "test", 1, 2, 0, tmp_path / "greedy",
                 limits=RolloutLimits(max_turns=1), params=SamplingParams(temperature=0.0), policy_options=FAST)


def text_completion(ids: list[int]) -> dict:
    """vLLM's `/v1/completions` answer with `return_token_ids` and `logprobs` 0 (its text is not read)."""
    return {"id": "x", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": "(not read)", "token_ids": ids, "finish_reason": "stop",
                         "logprobs": {"tokens": [], "token_logprobs": [-0.5] * len(ids), "top_logprobs": []}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 10 + len(ids)}}


def test_a_tokenizer_sends_the_exact_prompt_ids_to_completions_and_cuts_replies_as_in_process(
        serve_script, tiny_model_dir, tmp_path):
    """Issue 60: through chat completions a server re-tokenizes the model's earlier replies from their text; with
    `tokenizer` the policy renders the prompt here and sends its ids to `/v1/completions`, each turn's prompt the
    last one's exact ids + the reply's ids + the observation's, and the reply's ids are cut at the first end-of-turn
    id as the in-process backends cut theirs (`finish_generation`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    said = tokenizer.encode("ACTION: look", add_special_tokens=False)
    server, url = serve_script(("ok", text_completion([*said, tokenizer.eos_token_id, 7, 7])))
    summary = run_eval("household", {}, f"openai:{url}#m", "test", 1, 1, 0, tmp_path,
                       limits=RolloutLimits(max_turns=2), params=SamplingParams(temperature=0.0, top_k=4),
                       policy_options=FAST | {"tokenizer": str(tiny_model_dir)})
    assert summary["usage"]["requests"] == 2
    (episode,) = [Trajectory.from_json(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    first, second = server.requests
    turn = episode.turns[0]
    assert turn.generated_ids == [*said, tokenizer.eos_token_id] and turn.text == "ACTION: look"
    assert turn.logprobs == [-0.5] * len(turn.generated_ids)
    assert first["prompt"] == episode.prompt_ids and "messages" not in first
    assert second["prompt"] == episode.prompt_ids + turn.generated_ids + turn.observation_ids
    assert (first["temperature"], first["logprobs"], first["top_k"]) == (0.0, 0, 4)
    assert first["return_token_ids"] and first["skip_special_tokens"] is False
    assert tokenizer.eos_token_id in first["stop_token_ids"]


def test_a_tokenizer_needs_a_server_that_returns_token_ids(serve_script, tiny_model_dir):
    body = text_completion([5])
    del body["choices"][0]["token_ids"]
    _, url = serve_script(("ok", body))
    policy = _policy(url, tokenizer=str(tiny_model_dir))
    with pytest.raises(BackendError, match="returned no token ids for a token-id prompt"):
        policy.generate([_prompt()], SamplingParams())


def test_tokenizer_is_refused_for_other_policies_and_a_missing_folder(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--env", "household", "--policy", "expert", "--tokenizer", "x",
                                      "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "--tokenizer is for server policies (openai:URL), not 'expert'" in result.output
    with pytest.raises(FileNotFoundError, match="nothere does not exist"):
        make_policy("openai:http://127.0.0.1:9/v1#m", tokenizer=str(tmp_path / "nothere"))
