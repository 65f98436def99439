"""Verdicts on a final reply: math by its last `\\boxed{}`, code by running its last ```python block on tests.

Math, two modes (`math_verify=` option):
- `strict`: the seed's training reward (verl `math_dapo.compute_score(strict_box_verify=True)`): the last
  `\\boxed{...}` in the last 300 characters, compared to the answer as an exact string.
- `math_verify`: math-verify's `parse`/`verify`, gold first (`livecodebench/code_math.math_verify_reward_function`).
  math-verify times itself out with `signal.alarm`, which raises off the main thread (the rollout runs
  this env in worker threads): so it runs with its own timeouts off, in the process's shared pool of warm
  checker children (`turnforge.envs.isolation`, shared with BFCL's MathAPI) under a CPU budget. What is a
  verdict and what is not (issue 40):
  - a check past VERIFY_CPU_S of CPU or VERIFY_MEMORY_BYTES is a wrong answer ("too expensive to check"),
    as math-verify's own timeout is: a cost of the reply (e.g. `\\boxed{9^{9^{9^9}}}`), the same on any machine;
  - a check that gave no answer (hung or starved past the pool's wall clock, the child died) or raised is no
    verdict: `CheckerUnavailable` propagates and the episode ends as an env error (redone on resume).

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
from turnforge.envs.isolation import CheckerUnavailable, call_isolated

MATH_MODES = ("math_verify", "strict")
VERIFY_CPU_S = 10.0  # CPU seconds per check; a typical one takes ~0.01-0.1
VERIFY_MEMORY_BYTES = 4 << 30
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


def check_math(reply: str, answer: str, mode: str) -> tuple[bool, str | None]:
    """(correct, why not) for a final math reply; raises CheckerUnavailable when math-verify gave no verdict."""
    if last_boxed(reply) is None:
        return False, "no \\boxed{} answer"
    if mode == "strict":
        return strict_match(reply, answer), None
    result = call_isolated(__name__, "MathVerifier", "verify", {"answer": answer, "reply": reply},
                           cpu_s=VERIFY_CPU_S, memory_bytes=VERIFY_MEMORY_BYTES)
    if result.over_budget is not None:
        limit = f"{VERIFY_CPU_S:g} CPU s" if result.over_budget == "cpu" else f"{VERIFY_MEMORY_BYTES >> 30} GiB"
        return False, f"math-verify needed more than {limit} for this answer (too expensive to check)"
    if result.error is not None:
        raise CheckerUnavailable(f"math-verify raised on answer {answer!r}: {result.error}; no verdict")
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
