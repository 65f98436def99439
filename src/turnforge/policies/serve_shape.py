"""The shape of an OpenAI chat request's `messages` and `tools`, as `turnforge serve` checks it (pydantic models).

vLLM's server validates these against OpenAI's types and answers 400 to a message whose `content` is a number or to
a tool without its `function` (issue 60: turnforge served both, 200 OK). The models say what a request may hold;
unknown keys are allowed, as vLLM (and OpenAI's newer fields) have them. The request's own dicts, not these models'
dumps, go on to the chat template: their key order is what the template's `tojson` writes.

    check_chat_shape([{"role": "user", "content": 42}], None)   # ValidationError at messages.0.content
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError


def _content(value: Any) -> Any:
    """OpenAI's message content: a string, a list of content parts (`{"type": "text", "text": ...}`, image parts...)
    or null; one error that says which, rather than one per member of the union."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("content_type", "a message's content is a string, a list of content parts or null, "
                                  "not {kind}", {"kind": type(value).__name__})
    for i, part in enumerate(value):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise PydanticCustomError("content_part", "part {i} is not a content part (an object with a \"type\")", {"i": i})
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise PydanticCustomError("text_part", "part {i} is a text part without \"text\", a string", {"i": i})
    return value


def _arguments(value: Any) -> Any:
    """A called function's arguments: OpenAI's JSON string (an object, as Hugging Face templates take, is read too)."""
    if value is None or isinstance(value, str | dict):
        return value
    raise PydanticCustomError("arguments_type", "a tool call's arguments are a JSON string (or an object), not {kind}",
                              {"kind": type(value).__name__})


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    arguments: Annotated[Any, BeforeValidator(_arguments)] = None


class ToolCallParam(BaseModel):
    """A call in an assistant message's `tool_calls`."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    """One message of `messages`."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Any, BeforeValidator(_content)] = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    """One tool of `tools` (vLLM's ChatCompletionToolsParam: a function, its `type` "function" by default)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatShape(BaseModel):
    messages: list[ChatMessage]
    tools: list[ToolSpec] | None = None


def check_chat_shape(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    """Raise pydantic's ValidationError (locations `messages.I.FIELD`, `tools.I.FIELD`) unless both have OpenAI's shape."""
    ChatShape.model_validate({"messages": messages, "tools": tools})
