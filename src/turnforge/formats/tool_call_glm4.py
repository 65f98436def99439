"""tool_call:glm4: GLM-4.5 / 4.6 `<tool_call>` blocks, the function name then `<arg_key>`/`<arg_value>` pairs.

    I will look.
    <tool_call>act
    <arg_key>action</arg_key>
    <arg_value>look</arg_value>
    <arg_key>n</arg_key>
    <arg_value>2</arg_value>
    </tool_call>

This is what GLM-4.5's chat template (trl/chat_templates/glm4moe.jinja) writes for an assistant message with
`tool_calls` after its `<think></think>` block: a string value as it is, any other value as JSON. It parses to
`Message("assistant", "I will look.", tool_calls=[ToolCall("act", {"action": "look", "n": 2})])` — given the tools.

A value's type is not in the text (`2` could be the string "2"), so, as vLLM's GLM parser (`Glm47MoeModelToolParser`,
`vllm serve --tool-call-parser glm45`) does, values are read by the tools' JSON schemas: an `integer` property's "2"
is 2, a `string` property's "2" stays "2", an `object`/`array` property's text is read as JSON, and a value whose
property has no schema stays a string. So the format needs the tools at parse time: `Glm4ToolCallFormat(tools=...)`
(the env's `Env.tools()` schemas: the rollout binds each episode's after its reset, `bind_tools`); without them every
value is a string, as in vLLM for a request without tools.
With tools, a call of a function not among them is dropped (vLLM's `validate_tool_names`; a fix), the other calls kept.

`parse` reads what vLLM reads (held against it reply by reply in benchmarks/tool_call_parsers.py): every complete
`<tool_call>...</tool_call>` block; keys are stripped, values are not. The content is the text before the first
block.

Known disagreement: a reply cut off inside a block (its last `<tool_call>` has no `</tool_call>`, as when generation
hits max_tokens) is a FormatError here; vLLM reads it as a call once the name is finished, with only the arguments
whose `</arg_value>` came (`transfer_funds({})`), as its streaming engine had sent them. That is a call the model never
finished: an env would run it with arguments missing or cut, so turnforge refuses it, as vLLM's own llama3_json and
hermes parsers refuse a cut-off call. `parse_lenient` lists the fixes a reply needed; `parse_strict` refuses any reply that needed one.
"""

from __future__ import annotations

import json
import re

from turnforge.formats.base import FormatError, ToolActions
from turnforge.formats.schema_values import SchemaTyped, tool_properties, typed_value
from turnforge.formats.tool_call import LenientParsing, ToolCallParse
from turnforge.types import Message, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(?P<body>.*?)" + re.escape(CLOSE), re.S)
_ARG = re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>", re.S)

# GLM-4.5's chat template, tool section, verbatim (trl/chat_templates/glm4moe.jinja).
_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_CALL_INSTRUCTIONS = (
    "For each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n"
    "<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>"
)

def _tool_names(tools: list[dict] | None) -> set[str]:
    return {tool.get("function", tool).get("name") for tool in tools or []}


class Glm4ToolCallFormat(SchemaTyped, LenientParsing, ToolActions):
    """Free text, then `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>` blocks."""

    name = "tool_call:glm4"
    call_marker = OPEN  # text without it holds no call attempt

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """GLM-4.5's own tool section when `tools` are given (its template's words), else just the call format."""
        if tools is None:
            return _CALL_INSTRUCTIONS
        listed = "".join(json.dumps(tool, ensure_ascii=False) + "\n" for tool in tools)
        return f"{_TOOLS_HEADER}{listed}</tools>\n\n{_CALL_INSTRUCTIONS}"

    def parse_lenient(self, text: str) -> ToolCallParse:
        blocks = list(_BLOCK.finditer(text))
        if not blocks:
            return ToolCallParse(FormatError(reason=f"no {OPEN} block", text=text))
        if OPEN in text[blocks[-1].end() :]:
            return ToolCallParse(FormatError(reason=f"the reply was cut off inside a {OPEN} block (no {CLOSE})", text=text))
        fixes: list[str] = []
        calls, unknown = [], []
        for index, block in enumerate(blocks):
            call = self._call(block.group("body"), index, fixes)
            if isinstance(call, str):
                return ToolCallParse(FormatError(reason=call, text=text), fixes)
            if self.tools and call.name not in _tool_names(self.tools):
                unknown.append(call.name)
                continue
            calls.append(call)
        if unknown:
            names = ", ".join(repr(name) for name in unknown)
            if not calls:
                return ToolCallParse(FormatError(reason=f"{names} is not one of the tools", text=text), fixes)
            fixes.append(f"calls of unknown tools dropped ({names})")
        if text[blocks[-1].end() :].strip():
            fixes.append(f"text after the last {CLOSE}")
        content = text[: blocks[0].start()].strip()
        return ToolCallParse(Message(role="assistant", content=content, tool_calls=calls), fixes)

    def _call(self, body: str, index: int, fixes: list[str]) -> ToolCall | str:
        where = f"tool call {index + 1}"
        name = body.split("<arg_key>", 1)[0].strip()
        if not name:
            return f"{where} has no function name after {OPEN}"
        properties = tool_properties(self.tools, name)
        arguments = {}
        for match in _ARG.finditer(body):
            key, value = match.group("key").strip(), match.group("value")
            schema = properties.get(key)
            arguments[key] = typed_value(value, schema) if isinstance(schema, dict) else value
        if _ARG.sub("", body[body.find("<arg_key>") :] if "<arg_key>" in body else "").strip():
            fixes.append(f"text between the arguments of {where}")
        return ToolCall(name=name, arguments=arguments)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """Exactly what GLM-4.5's chat template writes for this assistant message after its `<think></think>` block;
        a `thought` is free text before the calls (it parses back as the content)."""
        blocks = [
            f"{OPEN}{call.name}\n" + "".join(
                f"<arg_key>{key}</arg_key>\n<arg_value>"
                f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}</arg_value>\n"
                for key, value in call.arguments.items()
            ) + CLOSE
            for call in message.tool_calls or []
        ]
        return "\n".join([text.strip() for text in (thought, message.content) if text and text.strip()] + blocks)

    def error_observation(self, error: FormatError) -> str:
        return (
            f"Invalid tool call: {error.reason}. Write each call as "
            f"{OPEN}{{function-name}}\n<arg_key>{{arg-key}}</arg_key>\n<arg_value>{{arg-value}}</arg_value>\n{CLOSE}"
        )
