"""Verdicts on a final reply: math by its last `\\boxed{}`, code by running its last ```python block on tests.

Math, two modes (`math_verify=` option):
- `strict`: the seed's training reward (verl `math_dapo.compute_score(strict_box_verify=True)`): the last
  `\\boxed{...}` in the last 300 characters, compared to the answer as an exact string.
- `math_verify`: math-verify's `parse`/`verify`, gold first (`livecodebench/code_math.math_verify_reward_function`).
  math-verify times itself out with `signal.alarm`, which raises off the main thread (the rollout runs
  this env in worker threads): so it runs with its own timeouts off, inside a child process
  (`turnforge.envs.bfcl.isolation`, the child-process pattern already used for BFCL's MathAPI) under our
  own timeout; a check past it is a wrong answer, never an error of the run.

Code (`code_math.compute_score`): the last ```python block of the reply (after any `</think>`), which must
parse; each test runs in the sandbox; a timeout or a crash fails that test. Styles: stdin/stdout
(`{"inputs": [...], "outputs": [...]}`, compared line by line with trailing spaces ignored) and functions
(`{"fn_name": "f", "inputs": [[args...]], "outputs": [value]}`, `f` top-level or a method of `class Solution`).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

from turnforge.envs.code.sandbox import SandboxPool

MATH_MODES = ("math_verify", "strict")
VERIFY_TIMEOUT_S = 10.0
_PYTHON_BLOCK = re.compile(r"```python[ \t]*\n(.*?)```", re.S)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None.

    >>> last_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    """
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def strict_match(reply: str, answer: str) -> bool:
    """The seed's strict box check: last boxed answer in the reply's last 300 characters == the answer."""
    boxed = last_boxed(reply[-300:])
    return boxed is not None and boxed.strip() == answer.strip()


class MathVerifier:
    """Runs inside an isolation child: math-verify with its signal-based timeouts turned off."""

    def verify(self, answer: str, reply: str) -> bool:
        from math_verify import parse, verify

        boxed = last_boxed(reply)
        if boxed is None:
            return False
        parsed = parse(f"\\boxed{{{boxed}}}", parsing_timeout=None)
        if len(parsed) > 1 and parsed[1] == answer:  # the seed's shortcut: the extracted string itself
            return True
        gold = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        return bool(verify(gold, parsed, timeout_seconds=None))


def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def check_math(reply: str, answer: str, mode: str, timeout_s: float = VERIFY_TIMEOUT_S) -> tuple[bool, str | None]:
    """(correct, why not) for a final math reply."""
    if last_boxed(reply) is None:
        return False, "no \\boxed{} answer"
    if mode == "strict":
        return strict_match(reply, answer), None
    from turnforge.envs.bfcl.isolation import call_isolated

    result = call_isolated(__name__, "MathVerifier", "verify", {"answer": answer, "reply": reply},
                           timeout_s=timeout_s, memory_bytes=4 << 30)
    if result.timed_out:
        return False, f"math-verify ran past {timeout_s:g} s"
    if result.error is not None:
        return False, f"math-verify failed: {result.error}"
    return bool(result.value), None


def final_program(reply: str) -> str | None:
    """The last ```python block after any `</think>`, when it parses; else None."""
    text = reply.split("</think>")[-1]
    blocks = _PYTHON_BLOCK.findall(text)
    if not blocks:
        return None
    try:
        ast.parse(blocks[-1])
    except SyntaxError:
        return None
    return blocks[-1]


@dataclass
class CodeVerdict:
    passed: int
    total: int
    failures: list[str] = field(default_factory=list)
    timeouts: int = 0

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


_CALL_HARNESS = """

import json as _tf_json, sys as _tf_sys
_tf_args = _tf_json.loads({args!r})
_tf_fn = globals().get({name!r})
if _tf_fn is None and "Solution" in globals():
    _tf_fn = getattr(Solution(), {name!r})
_tf_sys.stdout.write("\\n<<turnforge-result>>" + _tf_json.dumps(_tf_fn(*_tf_args)))
"""


def check_code(program: str, tests: dict, pool: SandboxPool, timeout_s: float) -> CodeVerdict:
    """Run `program` on every test in the sandbox; a timeout or a crash is a failed test."""
    inputs, outputs = tests["inputs"], tests["outputs"]
    verdict = CodeVerdict(0, len(inputs))
    for k, (given, expected) in enumerate(zip(inputs, outputs, strict=True)):
        if "fn_name" in tests:
            code = program + _CALL_HARNESS.format(args=json.dumps(given), name=tests["fn_name"])
            result = pool.run(code, timeout=timeout_s)
            got = result.stdout.rpartition("<<turnforge-result>>")[2] if "<<turnforge-result>>" in result.stdout else None
            ok = result.ok and got is not None and _same_value(got, expected)
        else:
            result = pool.run(program, stdin=given, timeout=timeout_s)
            ok = result.ok and _same_lines(result.stdout, expected)
        verdict.timeouts += result.timed_out
        if ok:
            verdict.passed += 1
        elif len(verdict.failures) < 3:
            why = "timed out" if result.timed_out else (result.stderr.strip().splitlines() or ["wrong output"])[-1]
            verdict.failures.append(f"test {k + 1}: {why[:200]}")
    return verdict


def _same_lines(got: str, expected: str) -> bool:
    return [line.rstrip() for line in got.strip().splitlines()] == [line.rstrip() for line in expected.strip().splitlines()]


def _same_value(got_json: str, expected) -> bool:
    try:
        got = json.loads(got_json)
    except ValueError:
        return False
    return got == expected or (isinstance(got, list) and isinstance(expected, list) and got == list(expected))
