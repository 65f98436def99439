"""Formats: how an agent writes its actions as text, and how that text becomes a Message.

Registered formats (`list_formats()`), each described in its own module:

    get_format("act_line")   ALFWorld `ACTION: <command>` lines (seed DPO adapter)
    get_format("react")      AgentBench ReAct: Thought / Action / Final Answer
    get_format("react_sql")  the same, actions as DBBench's `Action: Operation` + ```sql block
    get_format("tool_call")  Qwen3 / Hermes `<tool_call>` JSON blocks
    get_format("tool_call:llama3") Llama 3.x JSON calls, `{"name": ..., "parameters": {...}}`
    get_format("tool_call:harmony") gpt-oss's commentary message `to=functions.NAME <|constrain|>json<|message|>{...}`
    get_format("tool_call:gemma4") Gemma 4's `<|tool_call>call:f{a:<|"|>x<|"|>,n:2}<tool_call|>`
    get_format("tool_call:glm4")   GLM-4.5/4.6 `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>`
    get_format("tool_call:granite4") Granite 4.0's `<tool_call>` JSON blocks, read as strictly as vLLM's granite4
    get_format("tool_call:lfm2")   LiquidAI LFM2's `<|tool_call_start|>[f(a=1)]<|tool_call_end|>`
    get_format("tool_call:phi4_mini") Phi-4-mini's `functools[{"name": ..., "arguments": {...}}]`
    get_format("tool_call:qwen3_xml") Qwen3.5 / Qwen3-Coder `<tool_call><function=f><parameter=k>v</parameter>...`
    get_format("bfcl_python") BFCL's prompting format: `[func(a=1), g(b='x')]`

`chat_template.py` is the step after a format: a conversation of Messages rendered to the model's token ids by the
tokenizer's chat template, token-exactly (the rollout's `ChatRenderer`); it is not a registered format.
"""

from __future__ import annotations

from collections.abc import Callable

from turnforge.formats.act_line import ActLineFormat
from turnforge.formats.base import Format, FormatError
from turnforge.formats.bfcl_python import BfclPythonFormat
from turnforge.formats.react import ReactFormat
from turnforge.formats.tool_call import ToolCallFormat
from turnforge.formats.tool_call_gemma4 import Gemma4ToolCallFormat
from turnforge.formats.tool_call_glm4 import Glm4ToolCallFormat
from turnforge.formats.tool_call_granite4 import Granite4ToolCallFormat
from turnforge.formats.tool_call_harmony import HarmonyToolCallFormat
from turnforge.formats.tool_call_lfm2 import Lfm2ToolCallFormat
from turnforge.formats.tool_call_llama3 import Llama3ToolCallFormat
from turnforge.formats.tool_call_phi4_mini import Phi4MiniToolCallFormat
from turnforge.formats.tool_call_qwen3_xml import Qwen3XmlToolCallFormat

_FORMATS: dict[str, Callable[[], Format]] = {
    "act_line": ActLineFormat,
    "bfcl_python": BfclPythonFormat,
    "react": ReactFormat,
    "react_sql": lambda: ReactFormat(code_language="sql", name="react_sql"),
    "tool_call": ToolCallFormat,
    "tool_call:gemma4": Gemma4ToolCallFormat,
    "tool_call:glm4": Glm4ToolCallFormat,
    "tool_call:granite4": Granite4ToolCallFormat,
    "tool_call:harmony": HarmonyToolCallFormat,
    "tool_call:lfm2": Lfm2ToolCallFormat,
    "tool_call:llama3": Llama3ToolCallFormat,
    "tool_call:phi4_mini": Phi4MiniToolCallFormat,
    "tool_call:qwen3_xml": Qwen3XmlToolCallFormat,
}


def list_formats() -> list[str]:
    """Names accepted by `get_format` (and by recipes' `format = ...`)."""
    return sorted(_FORMATS)


def get_format(name: str) -> Format:
    """A fresh instance of the named format; formats hold no state, so sharing one is also fine."""
    try:
        factory = _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}; choose one of: {', '.join(list_formats())}") from None
    return factory()


__all__ = [
    "ActLineFormat",
    "Format",
    "FormatError",
    "Gemma4ToolCallFormat",
    "Glm4ToolCallFormat",
    "Granite4ToolCallFormat",
    "Lfm2ToolCallFormat",
    "Llama3ToolCallFormat",
    "Phi4MiniToolCallFormat",
    "Qwen3XmlToolCallFormat",
    "ReactFormat",
    "ToolCallFormat",
    "get_format",
    "list_formats",
]
