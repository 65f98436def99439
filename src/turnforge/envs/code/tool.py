"""The `code_interpreter` tool, as the seed's SandboxFusion tool (Open-AgentRL `recipe/demystify`).

- One tool, `code_interpreter(code)`; the schema is the seed's `sandbox_fusion_tool_config.yaml`, verbatim.
- If the code holds a fenced ```python block, the first one is run.
- The last line is printed when it is a top-level expression not already printed (the seed wraps the last
  non-empty line in `print(...)` unless it starts with `print`; wrapping only whole expressions keeps an
  indented last line or an assignment from turning into a syntax error).
- The result is stdout + stderr, cut to `max_chars` with a marker; a run past its limit says so.
"""

from __future__ import annotations

import ast
import re

from turnforge.envs.code.sandbox import RunResult

TOOL_NAME = "code_interpreter"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "A tool for executing code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The code to execute."}},
            "required": ["code"],
        },
    },
}
NO_OUTPUT = "no stdout here"  # the seed's text for a run that printed nothing it could return
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def code_to_run(code: str) -> str:
    """The program the tool runs for the model's `code` argument (first fenced block; last expression printed)."""
    fenced = _FENCE.search(code)
    if fenced is not None:
        code = fenced.group(1)
    return print_last_expression(code)


def print_last_expression(code: str) -> str:
    """Wrap a final top-level expression in `print(...)`, unless it is already a print call.

    >>> print_last_expression("x = 2\\nx ** 10\\n")
    'x = 2\\nprint(x ** 10)\\n'
    >>> print_last_expression("print(1)"), print_last_expression("for i in range(2):\\n    i")
    ('print(1)', 'for i in range(2):\\n    i')
    """
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # the run reports the syntax error itself
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    value = last.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    lines = code.splitlines(keepends=True)
    start, end = last.lineno - 1, last.end_lineno
    if last.col_offset != 0 or any(";" in line for line in lines[start:end]):
        return code  # `a = 1; a` on one line: leave it as written
    expression = "".join(lines[start:end]).rstrip("\n")
    ending = "\n" if lines[end - 1].endswith("\n") else ""
    return "".join(lines[:start]) + f"print({expression})" + ending + "".join(lines[end:])


def tool_output(result: RunResult, max_chars: int, timeout_s: float) -> str:
    """What the model sees: stdout + stderr, cut with a marker, and why a run was stopped."""
    text = result.stdout + result.stderr
    if result.timed_out:
        text += f"\nTimeoutError: the code ran past the {timeout_s:g} s limit and was stopped."
    elif result.killed:
        text += f"\nThe code was killed (signal {-result.exit_code})."
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n... [output truncated: {len(text) - max_chars} more characters]"
    elif result.truncated:
        text += "\n... [output truncated]"
    return text if text.strip() else NO_OUTPUT
