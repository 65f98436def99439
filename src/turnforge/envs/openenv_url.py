"""`--env openenv:URL`: a running OpenEnv server as a turnforge env, for eval, collect, rft, dpo mining and grpo.

    turnforge eval --env openenv:http://127.0.0.1:8001 --policy replay:runs/gold/episodes.jsonl --out runs/remote
    turnforge eval --env openenv:http://127.0.0.1:8002 --env-opt format=tool_call --policy hf --model M --out runs/x

Each env instance holds one WebSocket session (openenv's `GenericEnvClient`), so the rollout's parallel episodes are
parallel sessions on the server; `close()` ends the session. Two kinds of servers:

- `turnforge env serve` (its `/state` names the env and its format): the client parses replies with the server's
  own format (so Turn records and format-error limits are a direct run's), steps with the parsed reply (its calls
  as `{"message": ...}`; a reply without calls, or a parse error, as `{"text": ...}`, which the server's format
  parses back into it), and scores with the server's `score`. A round trip gives the direct env's episodes and
  scores.
- any other OpenEnv server: tasks come from OpenEnv's Task API (`reset(split=, index=)`), else are `seeds`
  episodes `reset(seed=0..N-1)`. Actions: an MCP env (action `CallToolAction`) offers its tools (`list_tools`) and
  each tool call is a `call_tool` step; another structured action is ONE tool whose parameters are the action's
  JSON schema (its title is the name); an action with one string field takes a text format's action as that
  field (`action_field` names it when there are several). Observations are shown as their one text field, else
  as JSON. The episode's reward is the sum of the steps' rewards; success is reaching `success_reward`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import httpx
from openenv import GenericEnvClient

from turnforge.envs.base import EnvOption, EnvSpec, get_env_spec
from turnforge.formats import get_format
from turnforge.formats.base import Format, FormatError
from turnforge.formats.plain_text import PlainTextEndsTurn
from turnforge.types import Message, Score, StepResult, StopReason, Task, ToolCall

PREFIX = "openenv:"
OBSERVATION_BASE = ("done", "reward", "metadata")
SEEDS = 10  # episodes per split of a server without OpenEnv's Task API (option `seeds`)


@dataclass(frozen=True)
class ServerFacts:
    """What a server says about itself over plain HTTP, read once per URL."""

    url: str
    env_name: str  # the Task API's name (`/list_environments`)
    action_schema: dict[str, Any]
    turnforge: dict[str, Any] | None  # `turnforge env serve`'s /state (env, format, ...), else None
    task_api: bool

    @property
    def mcp(self) -> bool:
        return self.action_schema.get("title") in ("CallToolAction", "ListToolsAction")


@functools.cache  # one process talks to one server per URL (tests clear it between servers)
def server_facts(url: str) -> ServerFacts:
    try:
        with httpx.Client(base_url=url, timeout=30.0) as http:
            schema = _get(http, "/schema")["action"]
            state = _get(http, "/state")
            names = http.get("/list_environments")
            env_name = names.json()[0] if names.status_code == 200 and names.json() else ""
            task_api = bool(env_name) and http.get(f"/{env_name}/splits").status_code == 200
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach the OpenEnv server at {url} ({e}); start it (e.g. `turnforge env serve "
                         "--env household --port 8001`) and give --env openenv:http://HOST:PORT") from None
    turnforge = state if {"env", "format", "plain_text_answers"} <= set(state) else None
    return ServerFacts(url, env_name, schema, turnforge, task_api)


def _get(http: httpx.Client, path: str) -> dict[str, Any]:
    response = http.get(path)
    if response.status_code != 200:
        raise ValueError(f"{http.base_url}{path} answered {response.status_code}; is it an OpenEnv server?")
    return response.json()


def _post(facts: ServerFacts, route: str, body: dict[str, Any]) -> Any:
    with httpx.Client(base_url=facts.url, timeout=60.0) as http:
        response = http.post(f"/{facts.env_name}/{route}", json=body)
    if response.status_code != 200:
        raise ValueError(f"{facts.url}: the Task API's {route} refused {body} ({response.status_code}: "
                         f"{response.text[:200]})")
    return response.json()


def load_remote_tasks(url: str, split: str, limit: int | None = None, seeds: int = SEEDS, **_: Any) -> list[Task]:
    """The split's tasks from the Task API, in its order; without one, `seeds` episodes reset by seed."""
    facts, name = server_facts(url), PREFIX + url
    if not facts.task_api:
        return [Task(f"seed-{i}", name, split, "openenv", {"reset": {"seed": i}}) for i in range(limit or seeds)]
    splits = [s.get("name") if isinstance(s, dict) else s for s in _get_json(facts, f"/{facts.env_name}/splits")]
    if split not in splits:
        raise ValueError(f"env {name!r} has no split {split!r}; splits are: {', '.join(map(str, splits))}")
    specs = _post(facts, "task_range", {"split": split, "start": 0, "stop": limit})["tasks"]
    tasks = []
    for index, spec in enumerate(specs):
        spec = spec if isinstance(spec, dict) else {}
        task_id = str(spec.get("id", f"{split}-{index}"))
        reset = {"task_id": task_id, "split": split} if facts.turnforge else {"split": split, "index": index}
        tasks.append(Task(task_id, name, split, str(spec.get("category", "openenv")), {"reset": reset}))
    return tasks


def _get_json(facts: ServerFacts, path: str) -> Any:
    with httpx.Client(base_url=facts.url, timeout=30.0) as http:
        return _get(http, path)


def remote_split_size(url: str, split: str, options: dict[str, Any]) -> int | None:
    facts = server_facts(url)
    if not facts.task_api:
        return options["seeds"]
    return None  # counted from the tasks (an unknown split is refused there, with the server's splits)


class OpenEnvEnv:
    """A turnforge env over one OpenEnv session (see the module docstring)."""

    blocks = True  # every call waits on the network: the rollout runs them in worker threads

    def __init__(self, url: str, format: str = "", seeds: int = SEEDS, success_reward: float = 1.0,  # noqa: A002
                 action_field: str = "", timeout_s: float = 60.0):
        self.url, self.name = url, PREFIX + url
        self.facts = server_facts(url)
        self.success_reward, self.timeout_s = success_reward, timeout_s
        self.format = self._format(format)
        self.action_field = self._action_field(action_field)
        self.client = None
        self._tools: list[dict] | None = None
        self.total, self.done = 0.0, False

    # ---- the Env protocol -----------------------------------------------------------------------------------
    def reset(self, task: Task) -> list[Message]:
        if self.client is None:
            self.client = GenericEnvClient(base_url=self.url, message_timeout_s=self.timeout_s).sync()
        try:
            result = self.client.reset(**task.data["reset"])
        except RuntimeError as e:  # openenv's client: "Server error: Server at capacity: 2/2 sessions ... (code: ...)"
            if "CAPACITY_REACHED" not in str(e):
                raise
            raise RuntimeError(
                f"the OpenEnv server at {self.url} refused a session: {_server_message(e)}; this run opens more "
                "episodes at once than it serves: lower --limit-open (a recipe stage: batch_size) to at most its "
                "--max-sessions, or serve it with a larger --max-sessions") from None
        self.total, self.done = float(result.reward or 0.0), result.done
        if self.facts.turnforge:
            self._tools = result.observation.get("tools")
            return [Message.from_dict(m) for m in result.observation.get("messages", [])]
        self._tools = self._foreign_tools()
        system = self.format.system_prompt(self._tools)
        return [Message("system", system), Message("user", observation_text(result.observation))]

    def tools(self) -> list[dict] | None:
        return self._tools

    def step(self, reply: Message | FormatError) -> StepResult:
        if self.facts.turnforge:
            result = self.client.step(self._turnforge_action(reply))
            self.done = result.done
            info = dict(result.observation.get("metadata") or {})  # the env's step info (server.py `step_info`)
            stop = info.pop("stop", None)
            info.pop("format_error", None)  # for other clients: the rollout here parsed the reply itself
            messages = [Message.from_dict(m) for m in result.observation.get("messages", [])]
            return StepResult(messages, float(result.reward or 0.0), result.done, StopReason(stop) if stop else None,
                              info)
        return self._foreign_step(reply)

    def _turnforge_action(self, reply: Message | FormatError) -> dict[str, Any]:
        """The step that makes `turnforge env serve` apply `reply`: its calls as a message; a reply without calls
        (a text action, an answer) as the format's text, which the server parses back into it (`parse(render(m))
        == m`): the server reads a message without calls as what the model wrote (integrations/openenv/models.py);
        a parse error as the text that failed, for the env's own error observation."""
        if isinstance(reply, FormatError):
            return {"text": reply.text}
        if reply.tool_calls:
            return {"message": reply.to_dict()}
        return {"text": self.format.render(reply)}

    def score(self) -> Score:
        if self.facts.turnforge:
            return Score(**self.client.state()["score"])
        won = self.total >= self.success_reward
        return Score(success=won, reward=self.total, progress=1.0 if won else 0.0, details={"return": self.total})

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            client.close()

    # ---- any other OpenEnv server ---------------------------------------------------------------------------
    def _foreign_step(self, reply: Message | FormatError) -> StepResult:
        if isinstance(reply, FormatError):  # the server never sees it: answer as a turnforge env would
            return StepResult([self.format.observation(self.format.error_observation(reply))], info={"progress": 0.0})
        if not self.format.uses_tools:
            return self._send({self.action_field: reply.content}, None)
        if not reply.tool_calls:
            note = "Answer with a tool call; each call is an action."
            return StepResult([self.format.observation(note, tool=self._tool_names()[0])], info={"progress": 0.0})
        results = [self._send(self._call_action(call), call) for call in reply.tool_calls]
        last = results[-1]
        return StepResult([m for r in results for m in r.messages], sum(r.reward for r in results), last.done,
                          None, last.info)

    def _send(self, action: dict[str, Any], call: ToolCall | None) -> StepResult:
        result = self.client.step(action)
        reward = float(result.reward or 0.0)
        self.total += reward
        self.done = result.done
        observation = self.format.observation(observation_text(result.observation), call)
        return StepResult([observation], reward, result.done, None, {"progress": float(self.total >= self.success_reward)})

    def _call_action(self, call: ToolCall) -> dict[str, Any]:
        if self.facts.mcp:
            return {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
        return dict(call.arguments)

    def _foreign_tools(self) -> list[dict] | None:
        if not self.format.uses_tools:
            return None
        if self.facts.mcp:
            listed = self.client.step({"type": "list_tools"}).observation.get("tools", [])
            return [_function(t["name"], t.get("description", ""), t.get("input_schema", {})) for t in listed]
        schema = self.facts.action_schema
        properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
        parameters = {"type": "object", "properties": properties, "required": schema.get("required", [])}
        return [_function(schema.get("title", "act"), schema.get("description", "One action."), parameters)]

    def _tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self._tools or []] or ["act"]

    def _format(self, name: str) -> Format:
        served = self.facts.turnforge
        if served is not None:
            if name and name != served["format"]:
                raise ValueError(f"{self.url} serves env {served['env']!r} with format {served['format']!r}, which parses "
                                 f"the replies; drop --env-opt format={name}")
            fmt = get_format(served["format"])
            return PlainTextEndsTurn(fmt) if served["plain_text_answers"] else fmt
        if name:
            return get_format(name)
        return get_format("act_line" if _string_fields(self.facts.action_schema) and not self.facts.mcp
                          else "tool_call")

    def _action_field(self, name: str) -> str:
        if self.facts.turnforge is not None or self.format.uses_tools:
            return name
        fields = _string_fields(self.facts.action_schema)
        if name:
            if name not in fields:
                raise ValueError(f"{self.url}'s action has no string field {name!r}; its string fields: {fields or 'none'}")
            return name
        if len(fields) != 1:
            raise ValueError(f"{self.url}'s action has string fields {fields}: name the one a text action fills "
                             "(--env-opt action_field=NAME), or use a tool format (--env-opt format=tool_call)")
        return fields[0]


class ServedEnvWithExpert(OpenEnvEnv):
    """A `turnforge env serve` env whose family has a scripted expert: `expert_reply()` asks the server (a step
    `{"type": "expert"}` that does not move the episode), so `--policy expert` and DPO mining's expert work."""

    _thought: str | None = None

    def expert_reply(self) -> Message:
        answer = self.client.step({"type": "expert"}).observation
        self._thought = (answer.get("metadata") or {}).get("thought")
        reply = Message.from_dict(answer["messages"][0])
        if reply.tool_calls:
            return reply
        # Without calls the server sends the reply as the format's text (server.py `_expert_reply`): parsed back here
        # with the server's own format (`parse(render(m)) == m`).
        parsed = self.format.parse(reply.content)
        if isinstance(parsed, FormatError):
            raise ValueError(f"{self.url}'s expert replied {reply.content!r}, which its format "
                             f"{self.format.name!r} cannot parse ({parsed.reason})")
        return parsed

    def expert_thought(self) -> str | None:
        return self._thought


def make_remote_env(url: str, **options: Any) -> OpenEnvEnv:
    served = server_facts(url).turnforge
    return (ServedEnvWithExpert if served and served.get("expert") else OpenEnvEnv)(url, **options)


def _string_fields(schema: dict[str, Any]) -> list[str]:
    return [k for k, v in schema.get("properties", {}).items() if v.get("type") == "string"]


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _server_message(error: RuntimeError) -> str:
    """openenv's "Server error: MESSAGE (code: CODE)" as MESSAGE, without its trailing period."""
    text = str(error).removeprefix("Server error: ")
    return text.rpartition(" (code: ")[0].strip().rstrip(".") or text


def observation_text(observation: dict[str, Any]) -> str:
    """An OpenEnv observation as the text an agent reads: its one text field, else its fields as JSON."""
    fields = {k: v for k, v in observation.items() if k not in OBSERVATION_BASE}
    if "tool_name" in fields:  # an MCP CallToolObservation
        return _tool_text(fields.get("result"), fields.get("error"))
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    if not fields and observation.get("metadata"):  # a bare Observation (e.g. an MCP env's reset) says it there
        fields = observation["metadata"]
    return json.dumps(fields, ensure_ascii=False, sort_keys=True)


def _tool_text(result: Any, error: dict[str, Any] | None) -> str:
    """An MCP call's answer as the agent reads it: the text of its content (MCP's), or the error's message."""
    if error:
        return f"Error: {error.get('message', error)}"
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        return "\n".join(part.get("text", "") for part in result["content"] if part.get("type") == "text")
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, sort_keys=True)


@functools.cache
def remote_env_spec(name: str) -> EnvSpec:
    """The registry entry of `openenv:URL` (envs/base.py `get_env_spec` asks here for that prefix)."""
    url = name.removeprefix(PREFIX)  # as given: tasks and episodes carry `name`, which replays compare
    if not url.startswith(("http://", "https://", "ws://", "wss://")):
        raise ValueError(f"--env {name!r}: give the server's URL, e.g. openenv:http://127.0.0.1:8001")
    served = server_facts(url).turnforge
    return EnvSpec(
        name=name,
        description=f"the OpenEnv server at {url}",
        factory=functools.partial(make_remote_env, url),
        load_tasks=functools.partial(load_remote_tasks, url),
        categories=(),
        splits=(),
        split_size=functools.partial(remote_split_size, url),
        # A turnforge server's episodes are its env's: the same benchmark figures (e.g. tau2's pass^k by domain).
        env_metrics=get_env_spec(served["env"]).env_metrics if served else None,
        options=[
            EnvOption("format", str, "", "how the agent writes actions (a turnforge server's own; else act_line for "
                      "a text action, tool_call for a structured or MCP one)"),
            EnvOption("seeds", int, SEEDS, "servers without OpenEnv's Task API: episodes per split, reset(seed=0..N-1)",
                      at_least=1),
            EnvOption("success_reward", float, 1.0, "other servers: an episode succeeds when its summed reward "
                      "reaches this"),
            EnvOption("action_field", str, "", "other servers: the action's string field a text action fills"),
            EnvOption("timeout_s", float, 60.0, "seconds to wait for each answer of the server", at_least=0.001),
        ],
    )
