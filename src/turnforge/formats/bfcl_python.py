"""bfcl_python: BFCL's prompting format, a Python list of calls — `[func(a=1), g(b='x')]`.

    [cd(folder='document'), mkdir(dir_name='temp')]

parses to `Message("assistant", "", tool_calls=[ToolCall("cd", {"folder": "document"}),
ToolCall("mkdir", {"dir_name": "temp"})])`. As in BFCL's `default_decode_execute_prompting`, code fences
and surrounding whitespace are stripped and the brackets may be omitted (`cd(folder='x')` is one call).

A reply that is not a call list is a plain answer: `Message("assistant", text)` without `tool_calls`,
which in BFCL ends the user turn (so is `[]`). A reply that starts like a call list but cannot be read
(unbalanced brackets, a non-literal or positional argument) is a `FormatError`. Arguments are read with
`ast.literal_eval`, never `eval`; BFCL's own decoder also evaluates arithmetic and turns bare names into
strings, which we refuse with a message instead.
"""

from __future__ import annotations

import ast

from turnforge.formats.base import FormatError
from turnforge.types import Message, ToolCall

# BFCL's DEFAULT_SYSTEM_PROMPT (bfcl_eval/constants/default_prompts.py), the prompting models' system prompt.
_INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose.\n"
    "If none of the functions can be used, point it out. If the given question lacks the parameters required "
    "by the function, also point it out.\n"
    "You should only return the function calls in your response.\n\n"
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
    "You SHOULD NOT include any other text in the response.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within the current "
    "turn. Continue to output functions to call until you have fulfilled the user's request to the best of "
    "your ability. Once you have no more functions to call, the system will consider the current turn "
    "complete and proceed to the next turn or task.\n"
)
_FUNCTIONS = "\nHere is a list of functions in JSON format that you can invoke.\n{functions}\n"


def _dotted_name(node: ast.expr) -> str | None:
    """`f` or `a.b.f` (BFCL keeps dotted names), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _call(node: ast.expr, index: int) -> ToolCall | str:
    """One list element -> ToolCall, or why it is not one."""
    where = f"call {index + 1}"
    if not isinstance(node, ast.Call):
        return f"{where} is not a function call"
    name = _dotted_name(node.func)
    if name is None:
        return f"{where} has no plain function name"
    if node.args or any(k.arg is None for k in node.keywords):
        return f"{where} ({name}) has positional or ** arguments; write every argument as name=value"
    arguments = {}
    for keyword in node.keywords:
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except Exception:  # literal_eval raises several types on non-literals; all mean "not a literal"
            return f"{where} ({name}): the value of {keyword.arg} is not a literal (quote strings)"
    return ToolCall(name=name, arguments=arguments)


def _calls(source: str) -> list[ToolCall] | str:
    """The calls of a `[...]` list, or why it is not a call list."""
    try:
        tree = ast.parse(source, mode="eval").body
    except Exception:  # SyntaxError, ValueError (null bytes), RecursionError, MemoryError
        return "the call list is not valid Python (check brackets and quotes)"
    if not isinstance(tree, ast.List):
        return "the reply is not one [...] list of calls"
    calls = []
    for index, element in enumerate(tree.elts):
        call = _call(element, index)
        if isinstance(call, str):
            return call
        calls.append(call)
    return calls


def _strip(text: str) -> str:
    # BFCL strips backticks, newlines and spaces from both ends; we also drop a fence's language tag.
    body = text.strip("`\n ")
    if body.startswith("python\n"):
        body = body[len("python\n") :].strip("`\n ")
    return body


def call_string(call: ToolCall) -> str:
    """BFCL's string of a call (its FC models' `convert_to_function_call`): `name(k=repr(v),...)`."""
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


class BfclPythonFormat:
    """`[func(a=1), g(b='x')]` replies; anything else is a plain answer that ends the user turn.

    Calls are written as text, but parse into `tool_calls`; their results come back as `tool` messages named
    by the call string, as in BFCL's prompting mode.
    """

    name = "bfcl_python"
    uses_tools = False
    thoughts = False  # a reply is the call list alone: text around it makes it a plain answer

    def action(self, tool: str, arguments: dict, text: str) -> Message:
        return Message("assistant", "", tool_calls=[ToolCall(tool, dict(arguments))])

    def observation(self, content: str, call: ToolCall | None = None, tool: str | None = None) -> Message:
        if call is None:
            return Message("user", content)
        return Message("tool", content, name=call_string(call))

    def system_prompt(self, tools: list[dict] | None = None) -> str:
        """BFCL's prompting system prompt; with `tools` (BFCL function docs) their list is appended.

        BFCL fills `{functions}` with the Python list itself (`str(list)`), though the text says JSON; so do we.
        """
        if tools is None:
            return _INSTRUCTIONS
        return _INSTRUCTIONS + _FUNCTIONS.format(functions=tools)

    def parse(self, text: str) -> Message | FormatError:
        body = _strip(text)
        bracketed = body.startswith("[")
        if not bracketed and not (body[:1].isalpha() and body.endswith(")")):
            return Message(role="assistant", content=text.strip())
        calls = _calls(body if bracketed else f"[{body}]")
        if isinstance(calls, str):
            # A bracketed reply meant to be calls; an unbracketed one may be prose that ends with ")".
            return FormatError(reason=calls, text=text) if bracketed else Message("assistant", text.strip())
        return Message(role="assistant", content="", tool_calls=calls or None)

    def render(self, message: Message, *, thought: str | None = None) -> str:
        """`[f(a=1), g(b='x')]` for a message with calls, else its text."""
        if thought is not None:
            raise ValueError("the bfcl_python format has no place for a thought (a reply is the call list alone)")
        if not message.tool_calls:
            return message.content
        calls = ", ".join(
            f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in message.tool_calls
        )
        return f"[{calls}]"

    def error_observation(self, error: FormatError) -> str:
        return (
            f"Invalid function call list: {error.reason}. Write the calls as "
            "[func_name1(param1=value1, param2=value2), func_name2(param=value)] with literal values."
        )
