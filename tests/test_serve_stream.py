"""`turnforge serve` with `stream: true` (OpenAI's server-sent chunks) and its OpenAI-shaped errors (issue 40, defect 11).

Driven by the real openai client and by raw HTTP (httpx) against a server on loopback; the tiny model decodes
greedily, so a streamed answer must equal the non-streamed one token for token.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from turnforge.policies.base import Generation
from turnforge.policies.serve import ServedModel, running_server

openai = pytest.importorskip("openai")

# A prompt on which the tiny model's greedy reply is not one token repeated (spaces, digits, words).
ROOM = "You are in the middle of a room. Your task is to: put a clean mug in coffeemachine."


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    return ServedModel(str(tiny_model_dir), name="tiny", device="cpu")


@pytest.fixture(scope="module")
def url(served):
    with running_server(served) as base_url:
        yield base_url


@pytest.fixture
def client(url):
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _request(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": ROOM}], "temperature": 0, "max_tokens": 16,
            "logprobs": True, "extra_body": {"return_token_ids": True}} | kw


def _joined(chunks, index: int = 0) -> dict:
    """What one choice's chunks say, put together: content, logprobs, token ids, finish reasons."""
    out = {"content": "", "logprobs": [], "token_ids": [], "finish": [], "roles": []}
    for chunk in chunks:
        for c in chunk.choices:
            if c.index != index:
                continue
            out["roles"] += [c.delta.role] if c.delta.role else []
            out["content"] += c.delta.content or ""
            out["logprobs"] += [(t.token, t.logprob) for t in (c.logprobs.content or [])] if c.logprobs else []
            out["token_ids"] += (c.model_extra or {}).get("token_ids") or []
            out["finish"] += [c.finish_reason] if c.finish_reason else []
    return out


# (prompt, stop): greedy replies "... keychain 10 keychain 10 ..." and "htuhtuhtu ... htu h h h"; the stop strings
# end the text at a token's end (" h") and inside a token ("uh": the first token "htu" is cut to "ht").
CASES = {"no-stop": (ROOM, None), "stop-at-a-token": ("go to desk 1", [" h"]), "stop-in-a-token": ("go to desk 1", ["uh"])}


@pytest.mark.parametrize("case", CASES)
def test_a_stream_says_what_the_plain_answer_says_token_for_token(client, case):
    prompt, stop = CASES[case]
    kw = _request(stop=stop, messages=[{"role": "user", "content": prompt}], max_tokens=24)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed, choice = _joined(chunks), whole.choices[0]
    assert streamed["content"] == choice.message.content
    assert streamed["roles"] == ["assistant"] and streamed["finish"] == [choice.finish_reason]
    assert streamed["token_ids"] == choice.model_extra["token_ids"]
    assert streamed["logprobs"] == [(t.token, t.logprob) for t in choice.logprobs.content]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])
    if stop is None:
        assert len(chunks) > 10  # in pieces, not one chunk
    else:
        assert choice.finish_reason == "stop" and stop[0] not in streamed["content"]
        assert choice.message.content == ("htu" * 12 if stop == [" h"] else "ht")


def test_a_stream_sends_pieces_while_the_reply_is_still_generating(client, monkeypatch):
    """Token by token (issue 51): the engine reports each token, and content chunks built from a reply that has not
    ended yet go out at once; with the rest they say exactly what the plain answer says."""
    from turnforge.policies import serve_stream

    seen: list[tuple[int, int]] = []  # (tokens of the reply so far, pieces sent at that update)
    update = serve_stream.EarlyPieces.update

    def spy(self, ids):
        pieces = update(self, ids)
        seen.append((len(ids), len(pieces)))
        return pieces

    monkeypatch.setattr(serve_stream.EarlyPieces, "update", spy)
    kw = _request(max_tokens=60)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    whole = client.chat.completions.create(**kw)
    total = len(whole.choices[0].model_extra["token_ids"])
    assert any(n < total and pieces > 0 for n, pieces in seen)  # sent before the reply's last token existed
    streamed = _joined(chunks)
    assert streamed["content"] == whole.choices[0].message.content
    assert streamed["token_ids"] == whole.choices[0].model_extra["token_ids"]
    assert streamed["logprobs"] == [(t.token, t.logprob) for t in whole.choices[0].logprobs.content]


def test_the_openai_stream_helper_accepts_the_stream_and_n_choices_are_indexed(client):
    # (the helper refuses replies cut by max_tokens: a stop string ends these)
    kw = _request(n=2, messages=[{"role": "user", "content": "go to desk 1"}], stop=[" h"], max_tokens=24)
    with client.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    assert [c.index for c in final.choices] == [0, 1]
    assert all(c.message.content == "htu" * 12 and c.finish_reason == "stop" for c in final.choices)
    whole = client.chat.completions.create(**kw)
    # The engine batches whatever is open at each step: the same reply's log-probs from another batch agree to
    # float noise (matmuls over a different number of rows round differently), not bit for bit.
    for streamed_choice, plain_choice in zip(final.choices, whole.choices, strict=True):
        assert [t.logprob for t in streamed_choice.logprobs.content] == pytest.approx(
            [t.logprob for t in plain_choice.logprobs.content], abs=1e-5)
    chunks = list(client.chat.completions.create(**kw, stream=True))  # no include_usage: no usage chunk
    assert {c.choices[0].index for c in chunks} == {0, 1} and all(c.usage is None for c in chunks)


def test_the_same_seed_gives_the_same_samples_streamed_or_not(client):
    """OpenAI's `seed`: the same request, the same samples. Each reply's draws were seeded by its prefix-cache key,
    a fresh random one per request, so a seed gave other samples at each call."""
    kw = _request(temperature=1.0, seed=11, n=2, max_tokens=12)
    first, second = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    streamed = list(client.chat.completions.create(**kw, stream=True))
    contents = [c.message.content for c in first.choices]
    assert [c.message.content for c in second.choices] == contents
    assert [_joined(streamed, i)["content"] for i in (0, 1)] == contents
    assert contents[0] != contents[1]  # two samples, not one twice


def test_a_raw_stream_is_server_sent_events_ending_in_done(url):
    body = {"model": "tiny", "messages": [{"role": "user", "content": ROOM}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0] == {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def test_tool_calls_stream_in_openais_shape():
    """Index, id, type and name first, then the arguments; the openai client's own accumulator rebuilds them."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    from turnforge.policies.serve_stream import Choice, choice_chunks, role_chunk

    text = 'I look.\n<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    call = {"id": "call_1", "type": "function", "function": {"name": "act", "arguments": '{"action": "look"}'}}
    choice = Choice(0, {"role": "assistant", "content": "I look.", "tool_calls": [call]}, "tool_calls",
                            Generation(text=text, ids=[7, 8, 9], logprobs=[-0.5, -0.25, -0.125]))
    entries = [{"token": str(i), "logprob": lp, "bytes": [], "top_logprobs": []}
               for i, lp in zip([7, 8, 9], choice.gen.logprobs, strict=True)]
    deltas = [role_chunk(0), *choice_chunks(choice, lambda ids: "".join(map(str, ids)), entries, with_ids=True)]
    tool_deltas = [d["delta"]["tool_calls"][0] for d in deltas if "tool_calls" in d["delta"]]
    assert tool_deltas == [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "act", "arguments": ""}},
                           {"index": 0, "function": {"arguments": '{"action": "look"}'}}]
    state = ChatCompletionStreamState()
    for d in deltas:
        state.handle_chunk(ChatCompletionChunk.model_validate(
            {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "tiny", "choices": [d]}))
    final = state.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "I look."
    (got,) = final.message.tool_calls
    assert (got.id, got.function.name, got.function.arguments) == ("call_1", "act", '{"action": "look"}')
    assert [t.logprob for t in final.logprobs.content] == [-0.5, -0.25, -0.125]


def test_text_pieces_hold_back_split_characters_and_never_pass_the_content():
    """A token that ends inside a UTF-8 character decodes to U+FFFD: its text waits for the next token. The pieces
    join to exactly `content` (here cut before a stop string) and leave the rest of the tokens to the last chunk."""
    from turnforge.policies.serve_stream import text_pieces

    vocab = {1: b"ab", 2: b"\xc3", 3: b"\xa9c", 4: b"|st", 5: b"op"}

    def decode(ids):
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")

    pieces = text_pieces(decode, [1, 2, 3, 4, 5], "ab\u00e9c|")
    assert [(p.text, p.start, p.end) for p in pieces] == [("ab", 0, 1), ("\u00e9c", 1, 3), ("|", 3, 4)]
    assert text_pieces(decode, [1, 2], "") == []


@pytest.mark.parametrize("stop", [[], ["é w", "zz"]])
def test_early_pieces_resumed_token_by_token_are_the_pieces_cut_from_scratch(tiny_model_dir, stop):
    """`EarlyPieces` resumes after what it handed out (linear in the reply): at every length of a reply with
    accents, an emoji split across tokens and stop strings, what it has handed out so far is what cutting every
    prefix from scratch would have sent (the longest cut so far: a tail that may begin a stop string can shrink a
    later cut), and all of it begins the finished reply's pieces."""
    from transformers import AutoTokenizer

    from turnforge.policies.serve_stream import EarlyPieces, text_pieces

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ids = tokenizer("Café crème 🙂 déjà vu, naïve façade — go to desk 1 é w then zz.")["input_ids"]
    def cut(pieces):
        return [(p.text, p.start, p.end) for p in pieces]

    early, handed, longest = EarlyPieces(tokenizer.decode, [], stop), [], []
    for k in range(1, len(ids) + 1):
        handed += cut(early.update(ids[:k]))
        fresh = cut(EarlyPieces(tokenizer.decode, [], stop).update(ids[:k]))
        assert longest[: len(fresh)] == fresh[: len(longest)], k
        longest = max(longest, fresh, key=len)
        assert handed == longest, k
    text = tokenizer.decode(ids)
    content = text[: min([text.find(s) for s in stop if s in text], default=len(text))]
    assert handed == cut(text_pieces(tokenizer.decode, ids, content))[: len(handed)]
    assert "".join(p[0] for p in handed).startswith("Café crème 🙂 déjà vu")


def test_a_client_that_leaves_mid_stream_does_not_break_the_server(url, client, served, caplog):
    """The generation of a stream whose client hung up runs to its end (it shares a batch with other requests)
    and its reply is remembered, as if the client had read it."""
    expected = client.chat.completions.create(**_request(max_tokens=24)).choices[0].message.content
    remembered = len(served.memory.entries)
    body = {"model": "tiny", "messages": [{"role": "user", "content": ROOM + " Hurry."}], "temperature": 0,
            "max_tokens": 24, "n": 3, "stream": True}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as answer:
        next(answer.iter_lines())  # the first chunk, then hang up
    after = client.chat.completions.create(**_request(max_tokens=24), stream=True)  # joins the left one's batch
    assert _joined(after)["content"] == expected
    for _ in range(100):  # bounded: the left request's reply is remembered when its batch ends
        if len(served.memory.entries) > remembered:
            break
        time.sleep(0.05)
    assert len(served.memory.entries) == remembered + 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback in the server's log


def test_unknown_paths_are_openai_shaped_404s(url, client):
    for method, path in (("POST", "/v1/completion"), ("GET", "/v2/models"), ("GET", "/v1/chat/completions")):
        answer = httpx.request(method, url.removesuffix("/v1") + path)
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] is None, answer.text
        assert answer.status_code in (404, 405) and path in error["message"]
    with pytest.raises(openai.NotFoundError, match="/v1/embeddings") as e:
        client.embeddings.create(model="tiny", input="go to fridge 1")
    assert e.value.body["type"] == "invalid_request_error"
    # /v1/completions is served: one token, and vLLM's prompt_logprobs (a distillation teacher, test_distill.py)
    assert client.completions.create(model="tiny", prompt="go to fridge 1").choices[0].finish_reason == "length"


def test_malformed_json_and_invalid_fields_say_what_and_where(url, client):
    answer = httpx.post(f"{url}/chat/completions", content=b'{"model": "tiny", "messages": [',
                        headers={"content-type": "application/json"})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] is None, error
    assert "not valid JSON" in error["message"] and "line 1 column 32" in error["message"]
    with pytest.raises(openai.BadRequestError, match="not valid JSON") as e:
        client.post("/chat/completions", cast_to=object, content=b"{'model': 'tiny'}",
                    options={"headers": {"content-type": "application/json"}})
    assert e.value.body["param"] is None
    with pytest.raises(openai.BadRequestError, match="temperature") as e:
        client.chat.completions.create(**_request(temperature=5))
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError, match="stream_options.include_usage") as e:
        client.chat.completions.create(**_request(), stream=True, stream_options={"include_usage": "perhaps"})
    assert e.value.body["param"] == "stream_options.include_usage"
    with pytest.raises(openai.BadRequestError, match="only allowed when stream") as e:
        client.chat.completions.create(**_request(), stream_options={"include_usage": True})
    assert e.value.body["param"] == "stream_options"
    with pytest.raises(openai.NotFoundError, match="does not exist"):  # refused before the stream starts
        client.chat.completions.create(**_request(model="nope"), stream=True)


@pytest.fixture
def failing_model(served, monkeypatch):
    def fails(*_args, **_kw):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(served.hf, "generate", fails)


def test_a_generation_that_fails_is_a_500_answer_not_a_reset_connection(client, failing_model, caplog):
    """Starlette's catch-all handler answered and then re-raised: uvicorn logged a traceback and closed the
    connection, which the client often saw reset before the answer."""
    for _ in range(3):
        with pytest.raises(openai.InternalServerError, match="generation failed: RuntimeError: CUDA out of memory"):
            client.chat.completions.create(**_request())
    assert not [r for r in caplog.records if r.exc_info]  # no traceback in the server's log


def test_an_unforeseen_error_before_generation_is_an_openai_shaped_500(url, monkeypatch, caplog):
    """Only generation was wrapped: an error while preparing a request reached Starlette's default handler
    (a text/plain 500 and a traceback in the log)."""
    from turnforge.policies import serve

    def broken(*_args, **_kw):
        raise TypeError("sequence item 0: expected str instance, int found")

    monkeypatch.setattr(serve, "_prepare", broken)
    body = {"model": "tiny", "messages": [{"role": "user", "content": ROOM}], "max_tokens": 4}
    answer = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
    assert answer.status_code == 500 and answer.headers["content-type"].startswith("application/json")
    assert "TypeError: sequence item 0" in answer.json()["error"]["message"]
    assert not [r for r in caplog.records if r.exc_info]


def test_a_generation_that_fails_is_an_error_event_in_a_stream_that_began(client, failing_model):
    stream = client.chat.completions.create(**_request(), stream=True)
    assert next(stream).choices[0].delta.role == "assistant"  # sent before the model ran
    with pytest.raises(openai.APIError, match="generation failed: RuntimeError: CUDA out of memory"):
        next(stream)


def test_a_tool_call_reply_streams_to_the_openai_client_as_tool_calls(client, served, monkeypatch):
    """The served model's reply is a `<tool_call>` block (a scripted generation: the tiny model writes none)."""
    text = '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
    ids = [*served.tokenizer.encode(text), served.tokenizer.eos_token_id]
    monkeypatch.setattr(served.hf, "generate", lambda prompts, _params, on_token=None: [
        Generation(text=text, ids=ids, logprobs=[-0.5] * len(ids)) for _ in prompts])
    tools = [{"type": "function", "function": {"name": "act", "parameters": {"type": "object", "properties": {
        "action": {"type": "string"}}}}}]
    with client.chat.completions.stream(**_request(), tools=tools) as stream:
        final = stream.get_final_completion().choices[0]
    whole = client.chat.completions.create(**_request(), tools=tools).choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    (streamed,), (plain,) = final.message.tool_calls, whole.message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (plain.function.name, plain.function.arguments)
    assert plain.function.arguments == '{"action": "look"}'
    assert streamed.id.startswith("call_") and not final.message.content  # "" from the role chunk, as vLLM
    assert [t.logprob for t in final.logprobs.content] == [-0.5] * len(ids)
