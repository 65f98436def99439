"""openai: chat completions against any OpenAI-compatible server (vLLM, SGLang, llama.cpp, `turnforge serve`,
hosted APIs), through the official `openai` client.

    turnforge serve --model runs/qs/stages/02-sft/model --port 8000
    turnforge eval --env household --policy openai:http://127.0.0.1:8000/v1 --concurrency 16 --out runs/via-http

How an episode becomes a request (docs/decisions.md, "The openai policy"):

- Text formats (act_line, react, bfcl_python) send the conversation as it is: system / user / assistant
  messages with the text the model wrote. Tool formats (`env.format.uses_tools`) also send `tools=`; each
  earlier assistant turn is parsed with the env's format and sent as `tool_calls` with ids
  `call_<turn>_<k>`, and the `tool` messages that answer them carry the same `tool_call_id`. A tool message
  that answers no call (the env's reply to a turn without one) is sent as a tool message without an id.
- The reply's `tool_calls` are written back as text with `env.format.render(...)`, so the env's own `parse`
  reads them as it reads an in-process model's text.
- Token ids and log-probabilities are kept where the server returns them: `logprobs=true` (standard), and
  vLLM's `return_token_ids` extension (also understood by `turnforge serve`). A server that refuses an
  extension parameter (HTTP 400 naming it) is asked again without the extensions, once, and never again.
- With `tokenizer` (the served model's folder or Hub id, `--tokenizer`), prompts are rendered here and sent as
  token ids to `/v1/completions` instead (policies/openai_tokens.py): the episodes are token-exact, a greedy one
  through `vllm serve` the in-process engine's. Without it a server re-tokenizes the earlier replies from their text.

Requests: `max_in_flight = concurrency`, so the rollout's queue (policies/queue.py) sends that many at once
and `generate` gets one prompt per call; retries with exponential backoff (and the server's Retry-After) on
429, 5xx, timeouts, connection errors and malformed responses, at most `max_retries` times; a per-request
timeout. Any other 4xx, or retries spent, raises `BackendError` with one line that names the URL and what to
do. The API key comes from the environment (`OPENAI_API_KEY`, or the variable named by `api_key_env`); it is
never written to a run directory or a log.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from turnforge.policies.base import (
    CONTEXT_LENGTH_EXCEEDED,
    BackendError,
    Generation,
    Prompt,
    SamplingParams,
    explores,
    refused_generation,
)
from turnforge.types import Message, ToolCall

# vLLM's extension parameters (also read by `turnforge serve`); hosted APIs refuse unknown ones with a 400.
EXTENSIONS = ("return_token_ids", "include_stop_str_in_output", "top_k")
_RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_NO_KEY = "EMPTY"  # local servers need no key; the client needs a non-empty string


@dataclass
class Usage:
    """Token usage summed over every answered request (as the server counted it)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "retries": self.retries}


class OpenAIPolicy:
    """Generate through an OpenAI-compatible chat-completions endpoint (`openai:URL[#model]`), or with `tokenizer`
    through its completions endpoint, token ids in and out (policies/openai_tokens.py)."""

    name = "openai"
    renderer = None  # without a tokenizer the server renders the chat template: episodes hold its reply ids, if any

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        concurrency: int = 8,
        request_timeout: float = 120.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        api_key_env: str | None = None,
        extensions: bool = True,
        tokenizer: str | None = None,
    ):
        try:
            from openai import OpenAI  # the optional extra: imported only when asked for
        except ImportError:
            raise ValueError("policy openai needs the openai client: pip install 'turnforge[openai]'") from None

        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if request_timeout <= 0 or max_retries < 0:
            raise ValueError(f"request_timeout must be > 0 and max_retries >= 0 (got {request_timeout}, {max_retries})")
        self.base_url = base_url.rstrip("/")
        self.max_in_flight = concurrency
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s
        self.extensions = extensions
        self.logprobs = True
        self.usage = Usage()
        self._lock = threading.Lock()
        # Retries are ours (counted, one-line errors), so the client's own are off.
        self.client = OpenAI(base_url=self.base_url, api_key=_api_key(api_key_env), timeout=request_timeout,
                             max_retries=0)
        self.model = model or self._only_model()
        self.tokens = None
        if tokenizer is not None:  # token mode: the prompts rendered here, as ids (policies/openai_tokens.py)
            from turnforge.policies.openai_tokens import TokenPrompts

            self.tokens = TokenPrompts(tokenizer)
            self.renderer = self.tokens.renderer  # what makes the rollout build each prompt's exact ids

    # ---- the Policy contract -------------------------------------------------------------------------

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        """One request per prompt, in order (the rollout's queue sends `max_in_flight` calls at once)."""
        return [self._complete(p, params) for p in prompts]

    # ---- requests ------------------------------------------------------------------------------------

    def _complete(self, prompt: Prompt, params: SamplingParams) -> Generation:
        if self.tokens is not None:
            return self._complete_ids(prompt, params)
        tools = _uses_tools(prompt)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": chat_messages(prompt.messages, prompt.env.format if tools else None),
            "temperature": params.temperature if explores(params, prompt) else 0.0,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "seed": request_seed(params.seed, prompt),
        }
        if self.logprobs:
            body["logprobs"] = True
        if params.stop:
            body["stop"] = list(params.stop)
        if tools and prompt.tools:
            body["tools"] = prompt.tools
        try:
            data = self._post(body, params)
        except _ContextRefused as e:  # the episode ends as an in-process backend's would (`refuse_overlong`)
            return refused_generation(str(e))
        return self._generation(data, prompt)

    def _complete_ids(self, prompt: Prompt, params: SamplingParams) -> Generation:
        """Token mode: the prompt's ids to `/v1/completions`, with vLLM's extensions (never dropped: without them the
        reply is not the in-process one)."""
        body = self.tokens.body(prompt, params, self.model, request_seed(params.seed, prompt))
        try:
            data = self._with_retries(functools.partial(self._create, body, self.tokens.extensions(params)))
        except _ContextRefused as e:
            return refused_generation(str(e))
        self._count(data)
        return self.tokens.generation(data["choices"][0], params, self.base_url)

    def _post(self, body: dict[str, Any], params: SamplingParams) -> dict[str, Any]:
        while True:
            extra = self._extensions(params) if self.extensions else {}
            try:
                return self._with_retries(functools.partial(self._create, body, extra))
            except BackendError as e:
                # A server that refuses vLLM's extensions or log-probabilities (HTTP 400 naming them) is asked
                # again without them, and never asked for them again.
                refused = e.status == 400 and str(e)
                if refused and self.extensions and any(x in refused for x in EXTENSIONS):
                    self.extensions = False
                elif refused and "logprobs" in refused and body.pop("logprobs", None):
                    self.logprobs = False
                else:
                    raise

    @staticmethod
    def _extensions(params: SamplingParams) -> dict[str, Any]:
        extra: dict[str, Any] = {"return_token_ids": True}
        if params.stop:
            extra["include_stop_str_in_output"] = True  # as the hf policy: the text keeps the stop string
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        return extra

    def _create(self, body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        """One request: a chat completion, or in token mode (a `prompt` of ids) a completion."""
        endpoint = self.client.completions if "prompt" in body else self.client.chat.completions
        raw = endpoint.with_raw_response.create(**body, extra_body=extra or None)
        try:
            data = json.loads(raw.http_response.text)
            data["choices"][0]["text" if "prompt" in body else "message"]  # noqa: B018 — what later lines rely on
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _Malformed(f"{type(e).__name__}: {e}") from None
        return data

    def _with_retries(self, call):
        """`call()`, retried with exponential backoff on what may pass (429, 5xx, timeouts, no connection)."""
        import openai

        for attempt in range(self.max_retries + 1):
            try:
                return call()
            except openai.APIStatusError as e:
                if e.status_code not in _RETRY_STATUS or attempt == self.max_retries:
                    raise self._error(e) from None
                wait = _retry_after(e.response) or self._backoff(attempt)
            except (openai.APIConnectionError, _Malformed) as e:  # APITimeoutError is an APIConnectionError
                if attempt == self.max_retries:
                    raise self._error(e) from None
                wait = self._backoff(attempt)
            with self._lock:
                self.usage.retries += 1
            time.sleep(min(wait, self.max_backoff_s))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int) -> float:
        # Full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): concurrent clients spread out.
        return self.backoff_s * 2**attempt * (0.5 + random.random() / 2)

    def _error(self, e: Exception) -> BackendError:
        """One line: what happened at which URL, and what to do."""
        import openai

        url, tries = self.base_url, f"after {self.max_retries + 1} attempts"
        if isinstance(e, openai.APIStatusError):
            detail = _server_message(e)
            if e.status_code == 400 and _context_exceeded(e):
                return _ContextRefused(f"{url}: {detail}", e.status_code)
            if e.status_code in _RETRY_STATUS:
                return BackendError(f"{url} answered HTTP {e.status_code} {tries} ({detail}); "
                                    "the server is overloaded or failing: check it, or lower --concurrency", e.status_code)
            hint = {401: "set OPENAI_API_KEY (or --api-key-env NAME) to a valid key",
                    403: "the key may not use this model", 404: f"check the URL and the model name ({self.model!r})"}
            what = hint.get(e.status_code, "the request was refused; fix it or the server's settings")
            return BackendError(f"{url} refused the request: HTTP {e.status_code} ({detail}); {what}", e.status_code)
        if isinstance(e, openai.APITimeoutError):
            return BackendError(f"{url} did not answer within {self.client.timeout:g} s, {tries}; "
                                "raise the request timeout or lower --concurrency")
        if isinstance(e, _Malformed):
            return BackendError(f"{url} returned a malformed completion {tries} ({e}); "
                                "is it an OpenAI-compatible /v1 endpoint?")
        return BackendError(f"no server at {url} ({_cause(e)}), {tries}; start one (turnforge serve --model M "
                            "--port 8000) or fix the URL in --policy openai:URL")

    def _only_model(self) -> str:
        """The model to ask for when the spec names none: the server's only one."""
        data = self._with_retries(lambda: self.client.models.list().model_dump())
        names = [m["id"] for m in data.get("data", [])]
        if len(names) != 1:
            raise ValueError(f"{self.base_url} serves {len(names)} models ({', '.join(names[:10]) or 'none'}); "
                             f"name one: --policy openai:{self.base_url}#MODEL")
        return names[0]

    # ---- the reply -----------------------------------------------------------------------------------

    def _count(self, data: dict[str, Any]) -> None:
        """Add an answered request's usage (as the server counted it) to `usage`."""
        usage = data.get("usage") or {}
        with self._lock:
            self.usage.requests += 1
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)

    def _generation(self, data: dict[str, Any], prompt: Prompt) -> Generation:
        choice = data["choices"][0]
        message = choice["message"]
        self._count(data)
        text = message.get("content") or ""
        if message.get("tool_calls") and _uses_tools(prompt):
            text = prompt.env.format.render(_reply_message(text, message["tool_calls"]))
        logprobs = [float(t["logprob"]) for t in ((choice.get("logprobs") or {}).get("content") or [])]
        ids = [int(t) for t in choice.get("token_ids") or []]
        finish = choice.get("finish_reason") or "stop"
        return Generation(text=text, ids=ids, logprobs=logprobs, finish_reason="length" if finish == "length" else "stop")


class _ContextRefused(BackendError):
    """The server refused the prompt for the model's context: the episode ends, the run goes on."""


def _context_exceeded(e) -> bool:
    """Whether an HTTP 400 refuses the prompt for the model's context: OpenAI's and `turnforge serve`'s error code,
    or vLLM's server's message (it gives no code)."""
    body = e.body if isinstance(e.body, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    return error.get("code") == CONTEXT_LENGTH_EXCEEDED or "maximum context length" in _server_message(e)


class _Malformed(Exception):
    """A 2xx answer that is not a chat completion (not JSON, or no choices[0].message)."""


def chat_messages(messages: list[Message], tool_format=None) -> list[dict[str, Any]]:
    """The OpenAI `messages` of an episode; with a tool format, assistant turns as `tool_calls` (see module doc)."""
    out: list[dict[str, Any]] = []
    open_calls: list[str] = []  # ids of the last assistant turn's calls not answered yet, in order
    for turn, m in enumerate(messages):
        if m.role == "assistant" and tool_format is not None:
            out.append(_assistant_with_calls(m, tool_format, turn))
            open_calls = [c["id"] for c in out[-1].get("tool_calls", [])]
        elif m.role == "tool":
            item: dict[str, Any] = {"role": "tool", "content": m.content}
            call_id = m.tool_call_id if m.tool_call_id in open_calls else (open_calls[0] if open_calls else None)
            if call_id is not None:
                item["tool_call_id"] = call_id
                open_calls.remove(call_id)
            if m.name is not None:
                item["name"] = m.name
            out.append(item)
        else:
            out.append({"role": m.role, "content": m.content})
            open_calls = []
    return out


def _assistant_with_calls(m: Message, tool_format, turn: int) -> dict[str, Any]:
    parsed = m if m.tool_calls else tool_format.parse(m.content)
    calls = getattr(parsed, "tool_calls", None)
    if not calls:  # a reply without a (valid) call stays the text the model wrote
        return {"role": "assistant", "content": m.content}
    return {
        "role": "assistant",
        "content": parsed.content or None,
        "tool_calls": [
            {"id": c.id or f"call_{turn}_{k}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for k, c in enumerate(calls)
        ],
    }


def _reply_message(content: str, tool_calls: list[dict[str, Any]]) -> Message:
    """The parsed assistant message of a reply with `tool_calls`; a call whose arguments are not a JSON object
    stays in the text, so the env's parse reports it as the format error it is."""
    calls, broken = [], []
    for c in tool_calls:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = None
        if isinstance(args, dict) and fn.get("name"):
            calls.append(ToolCall(fn["name"], args))
        else:
            broken.append(json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}, ensure_ascii=False))
    text = "\n".join([content, *broken]) if broken else content
    return Message("assistant", text, tool_calls=calls)


def request_seed(seed: int, prompt: Prompt) -> int:
    """A per-request seed from (seed, task, sample, turn): reproducible whatever the order requests go in."""
    key = f"{seed}/{prompt.task.id}/{prompt.sample}/{prompt.turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big") & 0x7FFFFFFF


def _uses_tools(prompt: Prompt) -> bool:
    return prompt.env is not None and bool(getattr(prompt.env.format, "uses_tools", False))


def _api_key(env_name: str | None) -> str:
    name = env_name or "OPENAI_API_KEY"
    key = os.environ.get(name)
    if not key and env_name:
        raise ValueError(f"--api-key-env {env_name}: the environment variable {env_name} is not set")
    return key or _NO_KEY


def _retry_after(response) -> float | None:
    try:
        return float(response.headers.get("retry-after"))
    except (TypeError, ValueError, AttributeError):
        return None


def _server_message(e) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    message = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else body.get("message")
    return " ".join(str(message or e.message).split())[:300]


def _cause(e: Exception) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return " ".join(f"{type(e).__name__}: {e}".split())[:200]
