"""tool_call:harmony: gpt-oss's tool calls, a commentary message addressed to the function (`formats/harmony.py`).

    <|channel|>analysis<|message|>I need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

parses to `Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"})])` (the reply stops at
`<|call|>`, a stop token the text leaves out). As openai-harmony reads a reply: the recipient may stand before the
channel (`<|start|>assistant to=functions.f<|channel|>commentary json<|message|>`, how gpt-oss's template writes calls
in history) or after it; `<|constrain|>` before the content type is optional; the arguments are the message's body.
Analysis messages are reasoning, not calls; an answer (`final`) or a commentary without recipient is the content. A
recipient outside `functions.` (gpt-oss's built-in `browser` / `python` tools) is a format error here: the env offers
only its functions. Lenient fixes, refused by `parse_strict`: arguments as a Python literal, text after the JSON,
empty arguments read as `{}`, several calls (a gpt-oss reply stops at its first `<|call|>`).

No vLLM parser is held against this one: vLLM's (`openai_harmony` behind `--tool-call-parser openai`) loads its o200k
vocabulary from the network, which the tests do not reach; the template's own rendering of calls is read back instead
(tests/test_family_gptoss.py).
"""

from __future__ import annotations

import json

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.harmony import CALL, CHANNEL, END, GENERATION_PROMPT, MESSAGE, call_text, parse_reply
from turnforge.formats.tool_call import LenientParsing, ToolCallParse, _decode
from turnforge.types import Message, ToolCall

_INSTRUCTIONS = (
    "To call a function, send a message on the commentary channel addressed to it, its arguments as JSON: "
    f"{CHANNEL}commentary to=functions.NAME {'<|constrain|>'}json{MESSAGE}{{\"argument\": \"value\"}}{CALL}"
)


class HarmonyToolCallFormat(LenientParsing, ToolActions):
    """gpt-oss: one call per reply, a commentary message to `functions.NAME`, its arguments JSON."""

    name = "tool_call:harmony"
    call_marker = "to="  # a recipient: text without one holds no call attempt

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """How to call (gpt-oss's template lists the tools itself, in the developer message)."""
        return _INSTRUCTIONS

    def parse_lenient(self, text: str) -> ToolCallParse:
        messages = parse_reply(text)
        fixes: list[str] = []
        calls: list[ToolCall] = []
        content = []
        for message in messages:
            if message.recipient is None:
                if message.channel != "analysis":
                    content.append(message.body)
                continue
            where = f"the message to {message.recipient}"
            if not message.recipient.startswith("functions."):
                return ToolCallParse(FormatError(
                    f"{where}: only the env's functions can be called (to=functions.NAME)", text), fixes)
            if not message.complete:
                return ToolCallParse(FormatError(f"{where} was cut off before its {MESSAGE}", text), fixes)
            body = message.body.strip()
            if not body:
                fixes.append("empty arguments read as {}")
                arguments = {}
            else:
                arguments = _decode(body, fixes)
                if isinstance(arguments, FormatError):
                    return ToolCallParse(FormatError(f"{where}: arguments are {arguments.reason}", text), fixes)
            if not isinstance(arguments, dict):
                return ToolCallParse(FormatError(f"{where}: arguments must be a JSON object", text), fixes)
            calls.append(ToolCall(message.recipient.removeprefix("functions."), arguments))
        if not calls:
            return ToolCallParse(FormatError("no tool call (a commentary message to=functions.NAME)", text), fixes)
        if len(calls) > 1:
            fixes.append("several calls in one reply (gpt-oss stops at the first <|call|>)")
        return ToolCallParse(Message("assistant", "".join(content).strip(), tool_calls=calls),
                             [f.replace("inside <tool_call>", "in the arguments") for f in fixes])

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """The reply as gpt-oss writes it: a `thought` as analysis, text beside a call as a commentary preamble, the
        call to `functions.NAME` (a message without calls: the final answer)."""
        parts = [f"{CHANNEL}analysis{MESSAGE}{thought}"] if thought else []
        calls = message.tool_calls or []
        if len(calls) > 1:
            raise ValueError(f"{self.name} makes one call per reply (gpt-oss stops at <|call|>)")
        if not calls:
            return (END + GENERATION_PROMPT).join([*parts, f"{CHANNEL}final{MESSAGE}{message.content}"])
        if message.content:
            parts.append(f"{CHANNEL}commentary{MESSAGE}{message.content}")
        call = calls[0]
        parts.append(call_text(f"functions.{call.name}", json.dumps(call.arguments, ensure_ascii=False)))
        return (END + GENERATION_PROMPT).join(parts)

    def error_observation(self, error: FormatError) -> str:
        return f"Invalid tool call: {error.reason}. {_INSTRUCTIONS}"
