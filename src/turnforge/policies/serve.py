"""`turnforge serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the hf backend.

    turnforge serve --model runs/qs/stages/02-sft/model --port 8000 [--adapter dpo=runs/qs/stages/04-dpo/model]
    curl http://127.0.0.1:8000/v1/models

`POST /v1/chat/completions`: messages (+ `tools`) -> the model's own chat template -> `HFPolicy.generate` ->
tool calls in the model family's own format (Qwen3 / Hermes `<tool_call>` blocks, Llama 3 JSON, LFM2's
`<|tool_call_start|>`...: formats/families.py) parsed into `tool_calls` (finish_reason "tool_calls"), a thinking
model's reasoning into `reasoning` (vLLM's field; a request's `reasoning` or `reasoning_content` goes back to the
template as `reasoning_content`). It takes `n`,
`temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop`, `seed`, `logprobs`, and vLLM's
extensions `top_k`, `return_token_ids` (the reply's `token_ids` and the `prompt_token_ids`) and
`include_stop_str_in_output`; `usage` counts the prompt once and every choice's tokens. `stream: true` answers
with OpenAI's `chat.completion.chunk` server-sent events (and `stream_options.include_usage`'s usage chunk); its
text goes out token by token as the engine writes it, holding back what a later token or a stop string may still
change (policies/serve_stream.py). Errors are OpenAI-shaped
JSON bodies (`{"error": {"message", "type", "param", "code"}}`) with 400, 404, 405 or 500 (in a stream that has
started: an `error` event); `param` names the field at fault, or is null.

`POST /v1/completions` scores token ids with vLLM's `prompt_logprobs` (policies/serve_scoring.py): the server can
be an on-policy distillation teacher (`teacher = "openai:URL"`).

Batching: every choice of every open request is one request of the hf engine (policies/engine.py), which steps all
open ones together and hands each back as it ends; the batching queue (`RoleQueues`, policies/queue.py) passes them
on as they come (with LoRA adapters, one adapter's group at a time).

Token-exact conversations (docs/decisions.md, "turnforge serve"): a client sends back text, and re-tokenizing a
reply need not give the ids the model wrote. The server keeps, for each reply it made, the rendered
conversation up to the end of that reply and the ids the model actually saw and wrote (`ReplyMemory`); a
request that continues one starts from those ids and tokenizes only the new part, which always begins at the token
the template ends the reply with. So an episode over HTTP sees the same ids as one run in-process, and the hf
engine's shared KV blocks cover the conversation so far (blocks are shared by content).

LoRA adapters are chosen by the request's `model`: `--adapter NAME=PATH` serves the adapter as model NAME;
the base model keeps its own name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from turnforge.formats import Format, get_format
from turnforge.formats.base import bind_tools
from turnforge.formats.chat_template import encode, reading_family, render, turn_ends
from turnforge.formats.families import Family
from turnforge.policies.base import (
    CONTEXT_LENGTH_EXCEEDED,
    Generation,
    Prompt,
    SamplingParams,
    context_refusal,
)
from turnforge.policies.queue import Role, RoleQueues
from turnforge.policies.reply_memory import ReplyMemory
from turnforge.policies.serve_scoring import CompletionRequest, complete
from turnforge.policies.serve_shape import check_chat_shape
from turnforge.policies.serve_stream import (
    DONE,
    Choice,
    EarlyPieces,
    choice_chunks,
    piece_chunk,
    role_chunk,
    sse,
)
from turnforge.types import Message, Task

logger = logging.getLogger(__name__)


class StreamOptions(BaseModel):
    """OpenAI's `stream_options` (with `stream: true` only)."""

    model_config = ConfigDict(extra="allow")

    include_usage: bool = False  # a last chunk with `usage` and no choices


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat-completions request this server reads (others are ignored, as vLLM does);
    `messages` and `tools` are checked against OpenAI's shape in `_prepare` (policies/serve_shape.py) and kept as sent."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    n: int = Field(default=1, ge=1, le=64)
    # OpenAI's names for the sampling group; unset, SamplingParams' defaults hold, and its checks apply (_sampling).
    temperature: float | None = Field(default=None, le=2.0)  # OpenAI's range ends at 2
    top_p: float | None = None
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension: -1 = off, as 0
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)  # only the sampled token's log-probability
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    include_stop_str_in_output: bool = False


class APIError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"message": self.message, "type": kind, "param": self.param, "code": self.code}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.body()}, status_code=self.status)


def _failure(e: Exception) -> APIError:
    """A request that failed (in generation, or an unforeseen error before it) as the client's OpenAI-shaped 500
    answer, and one line in the server's log; an APIError (a refused request) unchanged."""
    if isinstance(e, APIError):
        return e
    failure = APIError(500, f"generation failed: {type(e).__name__}: {e}")
    logger.error(failure.message)
    return failure


@dataclass
class _ServedPrompt(Prompt):
    """A prompt with its own request's settings: one batch may mix requests that differ in them.

    Its task and sample say which choice of a request it is, and seed its draws (`row_seed`: with the prompt ids,
    so the same request with the same `seed` gives the same samples)."""

    params: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None
    on_token: Callable[[list[int], list[float]], None] | None = field(default=None, compare=False)
    """Told the reply's ids and log-probs as it grows (a streamed request)."""



class _PerRequestSettings:
    """The queue's policy: runs a batch as one `HFPolicy.generate` call per (adapter, sampling settings) group.

    Without adapters each choice is its own call, `batch_size` at once, and the hf engine batches whatever is open;
    with adapters, which switch the model's weights for everyone, one group at a time under the model lock."""

    name = "serve"
    renderer = None

    def __init__(self, hf, adapters: bool, lock: threading.Lock) -> None:
        self.hf, self.adapters = hf, adapters
        self.lock = lock if adapters else contextlib.nullcontext()
        self.max_in_flight = 1 if adapters else hf.batch_size

    def generate(self, prompts: list[_ServedPrompt], _params: SamplingParams) -> list[Generation]:
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(prompts):
            groups.setdefault((p.adapter, p.params.model_dump_json()), []).append(i)
        out: list[Generation | None] = [None] * len(prompts)
        for (adapter, _), rows in groups.items():
            def grown(j: int, ids: list[int], logprobs: list[float], rows=rows) -> None:
                if prompts[rows[j]].on_token is not None:
                    prompts[rows[j]].on_token(ids, logprobs)

            with self.lock, self._adapter(adapter):
                gens = self.hf.generate([prompts[i] for i in rows], prompts[rows[0]].params, on_token=grown)
            for i, gen in zip(rows, gens, strict=True):
                out[i] = gen
        return out  # type: ignore[return-value]

    @contextlib.contextmanager
    def _adapter(self, name: str | None) -> Iterator[None]:
        model = self.hf.model
        if not self.adapters:
            yield
        elif name is None:
            with model.disable_adapter():
                yield
        else:
            model.set_adapter(name)
            yield


class ServedModel:
    """The hf policy, its adapters by model name, and what the server needs to know of its tokenizer."""

    def __init__(self, model: str, name: str | None = None, adapters: dict[str, str] | None = None,
                 device: str = "auto", dtype: str = "auto", max_tokens_default: int = 512):
        from turnforge.policies.hf import HFPolicy  # imports torch and transformers

        self.name = name or model
        self.adapters = dict(adapters or {})
        if self.name in self.adapters:
            raise ValueError(f"--adapter {self.name}=...: the base model is already served as {self.name!r}")
        # Blocks of the same ids differ per adapter: a server with adapters shares none.
        self.hf = HFPolicy(model, device=device, dtype=dtype, prefix_sharing=not self.adapters)
        if self.adapters:
            _load_adapters(self.hf, self.adapters)
        self.tokenizer = self.hf.tokenizer
        # The family as the model's own template prompts it (the renderer's may render with a training variant).
        self.family: Family | None = reading_family(self.tokenizer, self.hf.renderer.family, None)
        self.tool_format = get_format(self.family.tool_format if self.family and self.family.tool_format else "tool_call")
        """How the model writes tool calls (its family's format; Qwen3 / Hermes for a template of no known family)."""
        self.max_context = self.hf.max_context
        self.max_tokens_default = max_tokens_default
        self.memory = ReplyMemory(self.tokenizer.get_added_vocab())
        self.turn_ends = turn_ends(self.tokenizer, self.family)
        """The tokens the template writes after a reply (`Family.turn_ends`; most families: the eos)."""
        self.end_ids = set(self.tokenizer.convert_tokens_to_ids([*self.turn_ends, self.tokenizer.eos_token]))
        self.model_lock = threading.Lock()
        """Held while the model runs: generation (the batching queue's thread) and scoring (/v1/completions) take
        turns, so that neither sees the other's adapter."""

    @property
    def names(self) -> list[str]:
        return [self.name, *self.adapters]


def _load_adapters(hf, adapters: dict[str, str]) -> None:
    from peft import PeftModel

    items = list(adapters.items())
    first_name, first_path = items[0]
    model = PeftModel.from_pretrained(hf.model, first_path, adapter_name=first_name)
    for adapter_name, path in items[1:]:
        model.load_adapter(path, adapter_name=adapter_name)
    model.eval()
    hf.model = model


def create_app(served: ServedModel, max_batch: int = 64, tick_s: float = 0.05) -> FastAPI:
    """The FastAPI app; its batching queue starts with the app's event loop (lifespan)."""
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        state["announced"] = 0  # prompts of a request counted as open before they join the queue
        queues = RoleQueues({"agent": Role(_PerRequestSettings(served.hf, bool(served.adapters), served.model_lock))},
                            live=lambda: queues.waiting + state["announced"], max_batch=max_batch, tick_s=tick_s)
        state["queues"] = queues
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, queues.close)

    app = FastAPI(title="turnforge serve", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        return _invalid_request(e).response()

    @app.exception_handler(HTTPException)
    async def no_route(request: Request, e: HTTPException) -> JSONResponse:
        message = str(e.detail)
        if e.status_code in (404, 405):  # OpenAI's words for a path (or method) it does not serve
            message = (f"Invalid URL ({request.method} {request.url.path}); this server answers GET /v1/models, "
                       "POST /v1/chat/completions and POST /v1/completions (prompt_logprobs)")
        answer = APIError(e.status_code, message).response()
        answer.headers.update(e.headers or {})  # 405's Allow
        return answer

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        created = int(time.time())
        return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "turnforge"}
                                           for n in served.names]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: ChatRequest) -> dict[str, Any] | StreamingResponse:
        # Every failure is raised as an APIError, whose handler answers in OpenAI's shape: Starlette's catch-all
        # `Exception` handler answers and re-raises, and uvicorn then logs a traceback and drops the connection.
        try:
            job = _prepare(served, request)  # a bad request is refused here, before a stream starts
            if not request.stream:
                return _completion(served, request, job, await _answer(served, state, request, job))
            grown: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            # A tool call is known at the end; so is where a thinking model's reasoning ends.
            streamed = not (request.tools and request.tool_choice != "none") and not (
                served.family is not None and served.family.reasoning is not None)

            def on_token(index: int, ids: list[int], logprobs: list[float]) -> None:
                loop.call_soon_threadsafe(grown.put_nowait, (index, ids, logprobs))

            answer = _run_to_the_end(state, _answer(served, state, request, job, on_token if streamed else None))
            return StreamingResponse(_stream(served, request, job, answer, grown), media_type="text/event-stream")
        except Exception as e:
            raise _failure(e) from None

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        try:
            _known_model(served, request.model)
            scorer = _PerRequestSettings(served.hf, bool(served.adapters), served.model_lock)
            adapter = scorer._adapter(None if request.model == served.name else request.model)
            return await asyncio.to_thread(complete, served, request, adapter)
        except Exception as e:
            raise _failure(e) from None

    return app


def _known_model(served: ServedModel, model: str) -> None:
    if model not in served.names:
        raise APIError(404, f"The model `{model}` does not exist; this server has: {', '.join(served.names)}",
                       "model", "model_not_found")


def _invalid_request(e: RequestValidationError) -> APIError:
    """A body FastAPI could not read or validate: the first problem, naming the field (`param`) where there is one."""
    first = e.errors()[0] if e.errors() else {}
    if first.get("type") == "json_invalid":  # its `loc` holds the character offset, not a field
        try:
            json.loads(e.body)
            problem = first.get("ctx", {}).get("error", "")
        except (TypeError, ValueError) as err:
            problem = str(err)
        return APIError(400, f"the request body is not valid JSON ({problem}); send one JSON object, "
                        'e.g. {"model": "...", "messages": [{"role": "user", "content": "..."}]}')
    return _field_refusal(first, first.get("loc", ())[1:])  # without FastAPI's "body"


def _field_refusal(error: dict[str, Any], loc: tuple) -> APIError:
    """A 400 with one line, `FIELD.PATH: what is wrong`, naming the field as `param`."""
    where = ".".join(str(x) for x in loc) or None
    return APIError(400, f"{where or 'request'}: {error.get('msg', 'invalid request')}", where)


@dataclass
class _Job:
    """A request checked and ready for the model: its messages as the template reads them, the prompt's text and ids,
    sampling settings and adapter."""

    messages: list[dict[str, Any]]
    prompt: str
    ids: list[int]
    params: SamplingParams
    adapter: str | None
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))


def _prepare(served: ServedModel, request: ChatRequest) -> _Job:
    if request.stream_options is not None and not request.stream:
        raise APIError(400, "stream_options is only allowed when stream is true", "stream_options")
    _known_model(served, request.model)
    try:
        check_chat_shape(request.messages, request.tools)
    except ValidationError as e:  # vLLM answers 400 too; the first problem, as for the other fields
        first = e.errors()[0]
        raise _field_refusal(first, first["loc"]) from None
    adapter = None if request.model == served.name else request.model
    messages = [_chat_message(m) for m in request.messages]
    try:
        text = render(served.tokenizer, messages, request.tools, True)
    except Exception as e:  # the template's own checks (jinja raise_exception), or a message it cannot render
        raise APIError(400, f"the chat template cannot render these messages: {e}", "messages") from None
    ids = _prompt_ids(served, request.model, text)
    max_new = request.max_completion_tokens or request.max_tokens or served.max_tokens_default
    refusal = context_refusal(len(ids), max_new, served.max_context)
    if refusal is not None:  # as vLLM's server; the openai policy turns it back into the in-process refusal
        raise APIError(400, refusal, "messages", CONTEXT_LENGTH_EXCEEDED)
    params = _sampling(request, max_new)
    return _Job(messages, text, ids, params, adapter)


OPENAI_NAMES = {"max_new_tokens": "max_tokens"}
"""The request field of a sampling field whose OpenAI name differs (an error names the field the client sent)."""


def _sampling(request: ChatRequest, max_new: int) -> SamplingParams:
    """The request's sampling group; a value SamplingParams refuses is a 400 naming the request's field."""
    given = request.model_dump(include={"temperature", "top_p"}, exclude_none=True)
    if request.top_k is not None:
        given["top_k"] = max(request.top_k, 0)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    try:
        # as OpenAI's: the same seed, the same sample; no seed, a fresh one per request
        return SamplingParams(**given, max_new_tokens=max_new, stop=stop,
                              seed=request.seed if request.seed is not None else secrets.randbits(62))
    except ValidationError as e:
        first = e.errors()[0]
        param = OPENAI_NAMES.get(str(first["loc"][0]), str(first["loc"][0]))
        raise APIError(400, f"{param}: {first['msg']}", param) from None


async def _answer(served: ServedModel, state: dict[str, Any], request: ChatRequest, job: _Job,
                  on_token: Callable[[int, list[int], list[float]], None] | None = None) -> list[Choice]:
    """Generate the request's choices, parse their tool calls and remember their ids (`ReplyMemory`);
    `on_token(choice, ids, logprobs)` is told each choice's reply as it grows."""
    gens = await _generate(state, [
        _ServedPrompt(messages=[], task=Task("choice", "serve", "", ""), sample=index, turn=0, ids=job.ids,
                      params=job.params, adapter=job.adapter,
                      on_token=partial(on_token, index) if on_token is not None else None)
        for index in range(request.n)
    ])
    tools = bool(request.tools) and request.tool_choice != "none"
    tool_format = served.tool_format
    if tools and hasattr(tool_format, "bind_tools"):  # it types values by the tools' schemas: this request's
        tool_format = get_format(tool_format.name)
        bind_tools(tool_format, request.tools)
    choices = []
    for index, gen in enumerate(gens):
        message, finish = _reply(gen, job.params.stop, tools, request.include_stop_str_in_output, served.family,
                                 tool_format)
        _remember(served, request, job, message, gen.ids)
        choices.append(Choice(index, message, finish, gen))
    return choices


def _completion(served: ServedModel, request: ChatRequest, job: _Job, choices: list[Choice]) -> dict[str, Any]:
    """The `chat.completion` answer (stream: false)."""
    body: dict[str, Any] = {
        "id": job.id, "object": "chat.completion", "created": job.created, "model": request.model,
        "choices": [_plain_choice(served, request, c) for c in choices], "usage": _usage(job, choices),
    }
    if request.return_token_ids:
        body["prompt_token_ids"] = job.ids
    return body


def _plain_choice(served: ServedModel, request: ChatRequest, c: Choice) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": c.index, "message": c.message, "finish_reason": c.finish,
                              "logprobs": {"content": _logprobs(served, c.gen)} if request.logprobs else None}
    if request.return_token_ids:
        choice["token_ids"] = c.gen.ids
    return choice


def _usage(job: _Job, choices: list[Choice]) -> dict[str, int]:
    """The prompt counted once, every choice's tokens."""
    completion_tokens = sum(len(c.gen.ids) for c in choices)
    return {"prompt_tokens": len(job.ids), "completion_tokens": completion_tokens,
            "total_tokens": len(job.ids) + completion_tokens}


def _run_to_the_end(state: dict[str, Any], answer: Coroutine[Any, Any, list[Choice]]) -> asyncio.Task:
    """The answer as a task of its own: a client that hangs up mid-stream stops its stream, not the generation
    (which shares a batch with other requests) nor the remembering of its ids."""
    task = asyncio.get_running_loop().create_task(answer)
    state.setdefault("answers", set()).add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(lambda t: (state["answers"].discard(t), t.cancelled() or t.exception()))
    return task


async def _stream(served: ServedModel, request: ChatRequest, job: _Job, answer: asyncio.Task,
                  grown: asyncio.Queue) -> AsyncIterator[str]:
    """The `chat.completion.chunk` events (stream: true): each choice's pieces as its reply grows (`grown`), the
    rest when it ends; policies/serve_stream.py says how a reply is cut."""
    usage = request.stream_options is not None and request.stream_options.include_usage
    head: dict[str, Any] = {"id": job.id, "object": "chat.completion.chunk", "created": job.created,
                            "model": request.model} | ({"usage": None} if usage else {})
    first = head | ({"prompt_token_ids": job.ids} if request.return_token_ids else {})
    for index in range(request.n):
        yield sse((first if index == 0 else head) | {"choices": [role_chunk(index)]})
    decode = served.tokenizer.decode
    early = [EarlyPieces(decode, served.hf.stop_ids, job.params.stop) for _ in range(request.n)]
    entries: list[list[dict]] = [[] for _ in range(request.n)]  # each choice's logprob entries so far
    while not answer.done():
        update = asyncio.ensure_future(grown.get())
        await asyncio.wait({update, answer}, return_when=asyncio.FIRST_COMPLETED)
        if not update.done():
            update.cancel()
            break
        index, ids, logprobs = update.result()
        gen = Generation(text="", ids=ids, logprobs=logprobs)
        if request.logprobs:
            entries[index] += _logprobs(served, Generation(text="", ids=ids[len(entries[index]):],
                                                           logprobs=logprobs[len(entries[index]):]))
        for piece in early[index].update(ids):
            chunk = piece_chunk(index, piece, gen, entries[index] if request.logprobs else None, request.return_token_ids)
            yield sse(head | {"choices": [chunk]})
    try:
        choices = await asyncio.shield(answer)
    except Exception as e:  # after the 200 header: the error goes in the stream, where OpenAI's clients raise it
        yield sse({"error": _failure(e).body()})
        yield DONE
        return
    for c in choices:
        logprobs = _logprobs(served, c.gen) if request.logprobs else None
        for chunk in choice_chunks(c, decode, logprobs, request.return_token_ids, early[c.index].handed):
            yield sse(head | {"choices": [chunk]})
    if usage:
        yield sse(head | {"choices": [], "usage": _usage(job, choices)})
    yield DONE


async def _generate(state: dict[str, Any], prompts: list[_ServedPrompt]) -> list[Generation]:
    """Every prompt joins the queue; all of one request's go in together, so they share a batch."""
    queues: RoleQueues = state["queues"]
    state["announced"] += len(prompts)

    async def one(prompt: _ServedPrompt) -> Generation:
        state["announced"] -= 1  # ... and it is counted as waiting from the same step on
        gen, _ = await queues.generate("agent", prompt, 0)
        return gen

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def _prompt_ids(served: ServedModel, model: str, text: str) -> list[int]:
    """The prompt's ids, continuing a remembered reply's exact ids where there is one."""
    hit = served.memory.lookup(model, text)
    if hit is None:
        return encode(served.tokenizer, text)
    cut, ids = hit
    # The rest starts at an added token (the template's end of the reply): a BPE never merges across one.
    return list(ids) + encode(served.tokenizer, text[cut:])


def _remember(served: ServedModel, request: ChatRequest, job: _Job, reply: dict[str, Any], reply_ids: list[int]) -> None:
    """Remember the ids behind this reply, keyed by how the template renders the conversation up to the reply's end
    as the client will send it: before the first of the family's end tokens written after the prompt, or the whole
    text where the template writes none after a last reply (GLM-4.5). The reply's own end token is left out: the
    template's follows it in the next request (gpt-oss writes `<|end|>` where its model stopped on `<|return|>`)."""
    try:
        text = render(served.tokenizer, [*job.messages, _chat_message(reply)], request.tools, False)
    except Exception:
        return
    if not text.startswith(job.prompt):  # the template writes the prompt otherwise before a reply: the ids would not match
        return
    ends = [at for end in served.turn_ends if (at := text.find(end, len(job.prompt))) >= 0]
    if reply_ids and reply_ids[-1] in served.end_ids:
        reply_ids = reply_ids[:-1]
    served.memory.store(request.model, text[: min(ends, default=len(text))], job.ids + reply_ids)


def _reply(gen: Generation, stop: list[str], tools: bool, keep_stop: bool, family: Family | None,
           tool_format: Format) -> tuple[dict[str, Any], str]:
    """(the choice's message, finish_reason): a thinking `family`'s reasoning apart, tool calls read in `tool_format`
    (the model's family's)."""
    text = gen.text
    if stop and gen.finish_reason == "stop" and not keep_stop:  # OpenAI: the text ends before the stop string
        cuts = [text.find(s) for s in stop if s in text]
        text = text[: min(cuts)] if cuts else text
    message: dict[str, Any] = {"role": "assistant"}
    if family is not None and family.reasoning is not None:
        reasoning, text = family.split_reasoning(text)
        message["reasoning"] = reasoning.strip() or None
    if tools and gen.finish_reason == "stop":
        parsed = tool_format.parse(text)
        if isinstance(parsed, Message) and parsed.tool_calls:
            calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                     for c in parsed.tool_calls]
            return {**message, "content": parsed.content or None, "tool_calls": calls}, "tool_calls"
    return {**message, "content": text}, gen.finish_reason


def _logprobs(served: ServedModel, gen: Generation) -> list[dict[str, Any]]:
    """OpenAI's logprob entry for each generated token."""
    tokens = [served.tokenizer.decode([t]) for t in gen.ids]
    return [{"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(tokens, gen.logprobs, strict=False)]


def _chat_message(m: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message (of OpenAI's shape: `check_chat_shape`) as Hugging Face chat templates read it: text
    content, tool-call arguments as dicts."""
    role = m["role"]
    content = m.get("content")
    if isinstance(content, list):  # content parts: the text ones, joined
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
    if m.get("tool_calls"):
        out["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
    for k in ("tool_call_id", "name"):
        if m.get(k) is not None:
            out[k] = m[k]
    reasoning = m.get("reasoning") or m.get("reasoning_content")  # vLLM's field, and the deprecated one
    if role == "assistant" and isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning  # as thinking templates (Qwen3's) read it
    return out


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args = fn.get("arguments")
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args) if args.strip() else {}
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


# ---- running it ----------------------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), so that the URL is known before the server starts."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
    sock.listen(2048)
    return sock


def serve(served: ServedModel, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 64,
          on_ready=None) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM). `on_ready(url)` is called once the socket listens."""
    import uvicorn

    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}/v1"
    config = uvicorn.Config(create_app(served, max_batch), log_level="warning", timeout_graceful_shutdown=5)
    if on_ready is not None:
        on_ready(url)
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def running_server(served: ServedModel, host: str = "127.0.0.1", max_batch: int = 64,
                   startup_timeout_s: float = 30.0) -> Iterator[str]:
    """`with running_server(served) as url:` a server on a free port in a thread of this process, shut down
    (and its batching worker stopped) at the end of the block. For tests and benchmarks."""
    with app_in_thread(create_app(served, max_batch), host, "turnforge serve", startup_timeout_s) as base:
        yield f"{base}/v1"


@contextlib.contextmanager
def app_in_thread(app: Any, host: str = "127.0.0.1", name: str = "server",
                  startup_timeout_s: float = 30.0) -> Iterator[str]:
    """`with app_in_thread(app) as base_url:` an ASGI app under uvicorn on a free port of `host`, in a thread of this
    process, stopped at the end of the block (`turnforge serve` and `env serve` in tests and benchmarks)."""
    import uvicorn

    sock = bind(host, 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"{name} did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
