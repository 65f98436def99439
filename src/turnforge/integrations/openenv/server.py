"""`turnforge env serve`: any turnforge env as an OpenEnv environment, on the `openenv` package's own server.

    turnforge env serve --env service --env-opt domain=retail --env-opt data_dir=../shared/data/tau2/retail \
        --split test --port 8001

    from openenv import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8001").sync() as client:
        first = client.reset(task_id="0", sample=0)          # observation: messages (system + user), tools
        result = client.step({"text": "<tool_call>...</tool_call>"})   # or {"message": {...}}: see models.py
        client.state()["score"]                               # success, reward, progress, details

The app is openenv's `create_app` over `TurnforgeEnvironment`: openenv makes one instance per WebSocket session
(up to `max_sessions`) and calls its `close()` when the session ends, which closes the turnforge env it built (the
session's tau2 DB overlay, SQL database, sandbox). Each session's calls run in a thread of its own (openenv's
per-session executor), so a slow step stalls only its session. The same order as a rollout (rollout.py): reset ->
step(parsed reply)* -> score; the env's own error observation answers a bad action, a malformed request gets
OpenEnv's error frame with one line that says what was wrong, and the server goes on.

What does not map is in docs/decisions.md: model roles (a service LLM user) are not played by the server, and
OpenEnv's `/mcp` JSON-RPC route is not offered (tools are MCP actions on the session: `list_tools`, `call_tool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolObservation, ListToolsObservation, Tool

from turnforge.envs.base import Env, SupportsExpert, get_env_spec, load_tasks, make_env
from turnforge.formats.base import FormatError
from turnforge.formats.plain_text import PlainTextEndsTurn
from turnforge.integrations.openenv.models import (
    ACTION_KEYS,
    TurnforgeAction,
    TurnforgeObservation,
    TurnforgeState,
)
from turnforge.types import Message, Score, StepResult, Task, ToolCall

NO_EPISODE = ("step before reset: reset(task_id=...) (or reset()) first, in the same session; OpenEnv's HTTP /step "
              "has none (a fresh env per request): use the WebSocket /ws, as GenericEnvClient does")


class ServedEnv:
    """What every session of one server shares, read-only: the env's name and options, and the tasks of its splits
    (loaded once each). Tasks without a `task_id` are dealt in order, server-wide, so that parallel clients cover
    the split."""

    def __init__(self, name: str, options: dict[str, Any], split: str):
        spec = get_env_spec(name)
        self.name, self.options, self.split = name, spec.coerce_options(options), split
        roles = spec.roles(self.options)
        if roles:
            raise ValueError(f"env {name!r} with these options needs model role(s) {sorted(roles)}, which env serve does "
                             "not play: serve it with a scripted user (e.g. --env-opt user=scripted) and no judge")
        self._tasks: dict[str, list[Task]] = {}
        self._by_id: dict[str, dict[str, Task]] = {}
        self._lock = threading.Lock()
        self.tasks(split)  # the served split's, before the server listens
        self._next = itertools.count()
        probe = make_env(name, **self.options)  # bad options fail here, before the server listens
        try:
            self.format_name = probe.format.name
            self.plain_text_answers = isinstance(probe.format, PlainTextEndsTurn)
            self.expert = isinstance(probe, SupportsExpert)
        finally:
            probe.close()
        self.splits = spec.splits or (split,)

    def tasks(self, split: str | None) -> list[Task]:
        split = split or self.split
        with self._lock:
            if split not in self._tasks:
                self._tasks[split] = load_tasks(self.name, split, **self.options)  # ValueError names the splits
                self._by_id[split] = {task.id: task for task in self._tasks[split]}
            return self._tasks[split]

    def pick(self, split: str | None, task_id: str | None, index: int | None) -> Task:
        """The task `reset` asked for: by id, by index (OpenEnv's Task API), else the next one in order."""
        tasks = self.tasks(split)
        where = f"env {self.name!r} split {split or self.split!r}"
        if task_id is not None:
            found = self._by_id[split or self.split].get(str(task_id))
            if found is None:
                raise ValueError(f"{where} has no task {task_id!r}; its task ids are listed by the Task API "
                                 f"(POST /{self.name}/tasks) or give index=0..{len(tasks) - 1}")
            return found
        if index is not None:
            if not 0 <= index < len(tasks):
                raise ValueError(f"{where} has {len(tasks)} tasks; index {index} is out of range")
            return tasks[index]
        with self._lock:
            return tasks[next(self._next) % len(tasks)]

    def describe(self, split: str, index: int, task: Task) -> dict[str, Any]:
        return {"id": task.id, "index": index, "split": split, "category": task.category}


class TurnforgeEnvironment(Environment[TurnforgeAction, TurnforgeObservation, TurnforgeState]):
    """One OpenEnv session = one turnforge env, playing one episode at a time."""

    # Each session builds its own turnforge env (its own DB overlay, database, sandbox), so sessions are isolated.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: ServedEnv):
        super().__init__()
        self.served = served
        self.env: Env | None = None  # built at the first reset: openenv also builds instances for stateless routes
        self.task: Task | None = None
        self.sample, self.steps, self.done = 0, 0, False
        self.episode_id: str | None = None
        self.final: Score | None = None  # the episode's score, once it has ended

    # ---- OpenEnv's Environment -----------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              sample: int = 0, split: str | None = None, index: int | None = None,
              **unknown: Any) -> TurnforgeObservation:
        """Start a task (`task_id`, or `split` + `index`, else the next one); `seed` is accepted and unused: a
        turnforge episode is fixed by its task, the sampling is the agent's. `sample` labels the episode."""
        if unknown:
            raise ValueError(f"reset got unknown argument(s) {sorted(unknown)}; it takes task_id, sample, split, index "
                             "(and OpenEnv's seed, episode_id)")
        task = self.served.pick(split, task_id, index)
        if self.env is None:
            self.env = make_env(self.served.name, **self.served.options)
        self.task, self.sample, self.steps, self.done, self.episode_id = task, int(sample), 0, False, episode_id
        self.final = None
        messages = self._guarded(self.env.reset, task)
        return TurnforgeObservation(
            messages=[m.to_dict() for m in messages], tools=self._guarded(self.env.tools),
            metadata={"task_id": task.id, "split": task.split, "category": task.category, "sample": self.sample},
        )

    def step(self, action: TurnforgeAction, timeout_s: float | None = None, **_: Any):
        """Apply one assistant turn, parsed as in a rollout; `list_tools` answers without a turn."""
        if action.type == "list_tools":
            return ListToolsObservation(tools=self._mcp_tools())
        if self.env is None or self.task is None:
            raise ValueError(NO_EPISODE)
        if self.done:
            raise ValueError(f"the episode of task {self.task.id!r} is over; reset to start another")
        if action.type == "expert":
            return self._expert_reply()
        reply = self._reply(action)
        result: StepResult = self._guarded(self.env.step, reply)
        self.steps, self.done = self.steps + 1, result.done
        # Once the episode ends, OpenEnv's reward is the episode's (the env's score), as a trainer reads it.
        self.final = self._guarded(self.env.score) if result.done else None
        reward = self.final.reward if self.final is not None else result.reward
        messages = [m.to_dict() for m in result.messages]
        metadata = {**step_info(result.info), "stop": result.stop.value if result.stop else None}
        if isinstance(reply, FormatError):
            # The env answers it as its game would ("Nothing happens." with hints off): without this line a client
            # cannot tell a reply it could not read from an action that did nothing (issue 60).
            metadata["format_error"] = reply.reason
        if action.type == "call_tool":
            answer = next((m["content"] for m in messages if m["role"] == "tool"), "")
            return CallToolObservation(tool_name=action.tool_name, result=answer, done=result.done, reward=reward,
                                       metadata={**metadata, "messages": messages})
        return TurnforgeObservation(messages=messages, done=result.done, reward=reward, metadata=metadata)

    @property
    def state(self) -> TurnforgeState:
        # openenv reads `state` on its event loop, not in the session's thread: a finished episode's score is the
        # one computed by its last step, so that only a client that stops early (a turn cap) waits for a scoring.
        started = self.env is not None and self.task is not None
        score = self.final if self.final is not None else self.env.score() if started else None
        served = self.served
        return TurnforgeState(
            episode_id=self.episode_id, step_count=self.steps, env=served.name, format=served.format_name,
            plain_text_answers=served.plain_text_answers, expert=served.expert, done=self.done, sample=self.sample,
            split=self.task.split if started else served.split, task_id=self.task.id if started else None,
            score=asdict(score) if score is not None else None,
        )

    @functools.cached_property
    def mcp_server(self):
        """The env's tools as a FastMCP server, for OpenEnv's `/mcp` JSON-RPC route (`MCPToolClient`); each call is
        one assistant turn of this session's episode, as a `call_tool` step is. None for a text-action env."""
        tools = self._mcp_tools()
        if not tools:
            return None
        from fastmcp import FastMCP
        from fastmcp.tools import FunctionTool

        server = FastMCP(f"turnforge-{self.served.name}")
        for tool in tools:
            server.add_tool(FunctionTool(name=tool.name, description=tool.description, parameters=tool.input_schema,
                                         fn=self._mcp_call(tool.name)))
        return server

    def _mcp_call(self, name: str):
        async def call(**arguments: Any) -> dict[str, Any]:
            # Off the server's event loop: a step may wait (SQL, a sandbox).
            action = TurnforgeAction(type="call_tool", tool_name=name, arguments=arguments)
            observation = await asyncio.to_thread(self.step, action)
            return {"data": observation.result, "done": observation.done, "reward": observation.reward,
                    "messages": observation.metadata["messages"]}

        return call

    def close(self) -> None:
        if self.env is not None:
            env, self.env, self.task = self.env, None, None
            env.close()

    # ---- OpenEnv's Task API (discovery only; reset takes split + index, or task_id) ------------------------
    def list_splits(self) -> list[str]:
        return list(self.served.splits)

    def num_tasks(self, split: str) -> int:
        return len(self.served.tasks(split))

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self.get_task_range(split)

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        tasks = self.served.tasks(split)
        if not 0 <= index < len(tasks):
            raise IndexError(index)
        return self.served.describe(split, index, tasks[index])

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        tasks = self.served.tasks(split)
        return [self.served.describe(split, i, tasks[i]) for i in range(len(tasks))[start:stop]]

    # ---- turnforge's side ----------------------------------------------------------------------------------
    def _reply(self, action: TurnforgeAction) -> Message | FormatError:
        """The parsed assistant reply the action carries, exactly as a rollout would step the env with it."""
        given = [key for key in ACTION_KEYS if getattr(action, key) is not None]
        extra = sorted(action.model_extra or {})
        if extra or len(given) != 1:
            problem = f"unknown key(s) {extra}" if extra else f"{len(given)} of message, text, type"
            raise ValueError(f"an action is exactly one of {{'message': {{...}}}}, {{'text': '...'}}, "
                             f"{{'type': 'call_tool', 'tool_name': ..., 'arguments': {{...}}}}; got {problem}")
        if action.text is not None:
            return self.env.format.parse(action.text)
        if action.type == "call_tool":
            if not action.tool_name:
                raise ValueError("call_tool needs a tool_name (list_tools names them)")
            call = ToolCall(action.tool_name, action.arguments, id=f"call_{self.steps}")
            return Message("assistant", "", tool_calls=[call])
        message = _assistant_message(action.message)
        if not message.tool_calls:
            # No calls given: the content is what the model wrote, as turnforge's episodes.jsonl stores every reply
            # (tool calls included, as the format's text). Parsed exactly as {"text": ...} is, so that replaying a
            # run's messages gives its rewards; taken as it is, a `<tool_call>` in it was a message to the user.
            return self.env.format.parse(message.content)
        return message

    def _expert_reply(self) -> TurnforgeObservation:
        """What the env's scripted expert would reply now (and the thought it gives), without taking it: the
        `expert` policy and DPO mining's expert replies on an `openenv:URL` env.

        The reply is written as a step reads it back, so that stepping it as it came takes the expert's action: with
        tool calls, that message; without, the text the `expert` policy writes in the env's format (`THOUGHT: ...
        ACTION: go to desk 1`), which `{"message": ...}` and `{"text": ...}` both parse. The parsed action alone
        (`go to desk 1`) is no reply in a text format: stepped, it was a format error (issue 60)."""
        if not isinstance(self.env, SupportsExpert):
            raise ValueError(f"env {self.served.name!r} has no scripted expert")
        reply = self._guarded(self.env.expert_reply)  # first: the thought may state what it decided
        thought = self.env.expert_thought() if hasattr(self.env, "expert_thought") else None
        if not reply.tool_calls:
            reply = Message("assistant", self.env.format.render(reply, thought=thought))
        return TurnforgeObservation(messages=[reply.to_dict()], metadata={"thought": thought})

    def _mcp_tools(self) -> list[Tool]:
        schemas = self.env.tools() if self.env is not None else _tools_of(self.served)
        functions = [s.get("function", s) for s in schemas or []]
        return [Tool(name=f["name"], description=f.get("description", ""), input_schema=f.get("parameters", {}))
                for f in functions]

    def _guarded(self, call, *args):
        """`call(*args)` on the env; an env that raised is closed and not reused (as in a rollout)."""
        try:
            return call(*args)
        except Exception:
            self.close()
            raise


def step_info(info: dict[str, Any]) -> dict[str, Any]:
    """A step's `info` as JSON (progress, defects, won: what DPO mining and progress rewards read), without the hint:
    an env with hints on has put it in the observation already, and with hints off it must not reach the agent."""
    return json.loads(json.dumps({k: v for k, v in info.items() if k != "hint"}, default=str))


def _tools_of(served: ServedEnv) -> list[dict] | None:
    env = make_env(served.name, **served.options)
    try:
        return env.tools()
    finally:
        env.close()


def _assistant_message(data: dict[str, Any]) -> Message:
    """An assistant message dict (OpenAI chat shape, as turnforge's episodes store it), with one clear error."""
    if data.get("role", "assistant") != "assistant":
        raise ValueError(f"the message of a step is the assistant's; got role {data.get('role')!r}")
    try:
        return Message.from_dict({"role": "assistant", **data})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"the step's message is not an assistant message in OpenAI chat shape ({type(e).__name__}: "
                         f"{e}); e.g. {{'role': 'assistant', 'content': '', 'tool_calls': [{{'type': 'function', "
                         "'function': {'name': ..., 'arguments': {...}}}]}") from None


def build_app(name: str, options: dict[str, Any], split: str, max_sessions: int = 64):
    """The FastAPI app of `turnforge env serve`: openenv's `create_app` over one `TurnforgeEnvironment` per session."""
    if max_sessions < 1:
        raise ValueError(f"--max-sessions must be at least 1, got {max_sessions}")
    served = ServedEnv(name, options, split)
    app = create_app(functools.partial(TurnforgeEnvironment, served), TurnforgeAction, TurnforgeObservation,
                     env_name=name, max_concurrent_envs=max_sessions, state_cls=TurnforgeState)
    app.add_exception_handler(ValueError, _refused)  # on the WebSocket, openenv sends such errors as error frames
    return app


async def _refused(request, error: ValueError):
    """A request the env refused (an unknown task, a step without an episode) on openenv's HTTP routes: a 400 with
    the one line, not Starlette's bare 500 and a traceback in the server's log."""
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=400, content={"detail": str(error)})


def serve(name: str, options: dict[str, Any], split: str, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = 64, on_ready=None) -> None:
    """Serve until interrupted; `on_ready(url)` once the socket listens (port 0: a free one)."""
    import uvicorn

    from turnforge.policies.serve import bind

    app = build_app(name, options, split, max_sessions)
    sock = bind(host, port)
    if on_ready is not None:
        on_ready(f"http://{host}:{sock.getsockname()[1]}")
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)).run(sockets=[sock])


@contextlib.contextmanager
def running_server(name: str, options: dict[str, Any], split: str, max_sessions: int = 64,
                   startup_timeout_s: float = 30.0) -> Iterator[str]:
    """`with running_server("household", {}, "test") as url:` a server on a free loopback port in a thread of this
    process, stopped at the end of the block. For tests and benchmarks."""
    from turnforge.policies.serve import app_in_thread

    app = build_app(name, options, split, max_sessions)
    with app_in_thread(app, "127.0.0.1", "turnforge env serve", startup_timeout_s) as url:
        yield url
