"""What `turnforge env serve` speaks on OpenEnv's protocol: its action, observation and state models.

They are OpenEnv's own pydantic bases (`Action`, `Observation`, `State`) with turnforge's fields, so that
`GenericEnvClient` (plain dicts) and any typed client read them, and `/schema` publishes them.

An action is exactly one of:
    {"message": {"role": "assistant", "content": ..., "tool_calls": [...]}}   a reply with its calls, applied as it is
    {"message": {"role": "assistant", "content": "..."}}                       without calls: the content is parsed
                                                                              by the env's format, as {"text": ...}
                                                                              (episodes.jsonl's replies replay as run)
    {"text": "..."}                                                           a raw model reply, parsed by the env's format
    {"type": "call_tool", "tool_name": ..., "arguments": {...}}               one tool call (OpenEnv's MCP action, RFC 003)
    {"type": "list_tools"}                                                    the env's tools (OpenEnv's MCP action)
    {"type": "expert"}                                                        the env's scripted expert's next reply, not taken,
                                                                              written as a step reads it back (text actions
                                                                              in the env's format: `ACTION: go to desk 1`)
"""

from __future__ import annotations

from typing import Any, Literal

from openenv.core.env_server.types import Action, Observation, State
from pydantic import ConfigDict, Field

ACTION_KEYS = ("message", "text", "type")


class TurnforgeAction(Action):
    """One assistant turn (or a tool listing); `TurnforgeEnvironment.step` checks that exactly one kind is given."""

    # Unknown keys reach `step`, which names them in its error: pydantic's refusal reaches a GenericEnvClient
    # as a bare "Invalid message", without saying which key was wrong.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    message: dict[str, Any] | None = Field(default=None, description="An assistant message in OpenAI chat shape; "
                                           "without tool_calls, its content is parsed by the env's format as text.")
    text: str | None = Field(default=None, description="A raw model reply, parsed by the env's format.")
    type: Literal["list_tools", "call_tool", "expert"] | None = Field(
        default=None, description="OpenEnv's MCP actions; expert: the expert's next reply (the episode does not move).")
    tool_name: str | None = Field(default=None, description="call_tool: the tool to call.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: the call's arguments.")


class TurnforgeObservation(Observation):
    """The env's new messages (OpenAI chat dicts); at reset, the system and first user messages and the tools."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = Field(default=None, description="Tool JSON schemas (reset only; null: text actions).")


class TurnforgeState(State):
    """The session: which env and task, and the episode's score so far (its final one once `done`)."""

    env: str = ""
    format: str = Field(default="", description="The format that parses {'text': ...} replies (turnforge.formats).")
    plain_text_answers: bool = Field(default=False, description="A reply without a tool call is an answer, not a format error.")
    expert: bool = Field(default=False, description="The env has a scripted expert (step {'type': 'expert'}).")
    split: str = ""
    task_id: str | None = None
    sample: int = 0
    done: bool = False
    score: dict[str, Any] | None = Field(default=None, description="success, reward, progress, details.")
