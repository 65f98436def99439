"""Code-env tasks: problems from a JSONL file (`data=FILE`) or generated (`generate=N`), each a `Task`.

File lines (`--env-opt data=problems.jsonl`): every line has `id` and `problem`; a math line has `answer`
(a string); a code line has `tests`, either `{"inputs": [stdin, ...], "outputs": [stdout, ...]}` or
`{"fn_name": "f", "inputs": [[args...], ...], "outputs": [value, ...]}`; `category` is optional (default
`math` or `code`). A file has no splits of its own: every split gets all its lines.

Generated problems (`generate=N`): N per split, from a seeded generator per split (train and test never
share a seed, so they are disjoint draws): arithmetic, algebra (a linear equation, exact fraction answers)
and number theory (modular powers, gcd/lcm, digit sums) for math; small programs with tests for code.
Each carries `expert_code`, a correct program the expert runs through the tool before answering.
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from pathlib import Path

from turnforge.types import Task

CATEGORIES = ("math", "code")
SPLITS = ("train", "test")


def load_file(path: str, split: str) -> list[Task]:
    """Every line of a problems JSONL file as a Task; a malformed line is an error naming file:line."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"code env: no problems file {path!r}")
    tasks, seen = [], set()
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
        _validate(row, where)
        if row["id"] in seen:
            raise ValueError(f"{where}: id {row['id']!r} appears twice")
        seen.add(row["id"])
        category = row.get("category") or ("math" if "answer" in row else "code")
        tasks.append(Task(id=str(row["id"]), env="code", split=split, category=category, data=row))
    return tasks


def _validate(row: object, where: str) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a line must be a JSON object")
    for key in ("id", "problem"):
        if not isinstance(row.get(key), str | int) or row.get(key) == "":
            raise ValueError(f"{where}: missing {key!r} (every line needs 'id' and 'problem')")
    if ("answer" in row) == ("tests" in row):
        raise ValueError(f"{where}: a line needs exactly one of 'answer' (math) or 'tests' (code)")
    if "answer" in row and not isinstance(row["answer"], str):
        raise ValueError(f"{where}: 'answer' must be a string, got {type(row['answer']).__name__}")
    if "tests" in row:
        tests = row["tests"]
        if not isinstance(tests, dict) or not isinstance(tests.get("inputs"), list) \
                or not isinstance(tests.get("outputs"), list):
            raise ValueError(f"{where}: 'tests' must be an object with 'inputs' and 'outputs' lists")
        if len(tests["inputs"]) != len(tests["outputs"]) or not tests["inputs"]:
            raise ValueError(f"{where}: 'tests' needs as many outputs as inputs, at least one")
        if "fn_name" in tests:
            if not isinstance(tests["fn_name"], str) or not all(isinstance(a, list) for a in tests["inputs"]):
                raise ValueError(f"{where}: with 'fn_name', every input must be a list of arguments")
        elif not all(isinstance(v, str) for v in tests["inputs"] + tests["outputs"]):
            raise ValueError(f"{where}: stdin/stdout tests need string inputs and outputs (or give 'fn_name')")


def generate(n: int, split: str, seed: int = 0) -> list[Task]:
    """`n` generated problems of `split`, alternating math and code, the same for the same (n, split, seed)."""
    rng = random.Random(f"turnforge-code-{split}-{seed}")
    tasks = []
    for i in range(n):
        maker = MATH_MAKERS[i // 2 % len(MATH_MAKERS)] if i % 2 == 0 else CODE_MAKERS[i // 2 % len(CODE_MAKERS)]
        row = maker(rng)
        category = "math" if "answer" in row else "code"
        row["id"] = f"gen-{split}-{i}"
        tasks.append(Task(id=row["id"], env="code", split=split, category=category, data=row))
    return tasks


# ---- math: exact answers, and the program that computes each ---------------------------------------------

def _arithmetic(rng: random.Random) -> dict:
    a, b, c, d = (rng.randint(100, 9999) for _ in range(4))
    k = rng.randint(2, 9)
    expr = f"{a} * {b} - {c} * {d} + {a} // {k}"
    return {"problem": f"Compute {expr} (// is integer division).", "answer": str(a * b - c * d + a // k),
            "expert_code": f"print({expr})", "kind": "arithmetic"}


def _linear(rng: random.Random) -> dict:
    a, b, c = rng.choice([2, 3, 4, 5, 6, 7, 9, 11]), rng.randint(-50, 50), rng.randint(-50, 50)
    x = Fraction(c - b, a)
    answer = str(x.numerator) if x.denominator == 1 else f"\\frac{{{x.numerator}}}{{{x.denominator}}}"
    code = ("from fractions import Fraction\n"
            f"x = Fraction({c} - ({b}), {a})\n"
            "print(x.numerator if x.denominator == 1 else f'\\\\frac{{{x.numerator}}}{{{x.denominator}}}')")
    return {"problem": f"Solve for x: {a}x + ({b}) = {c}. Give x as an integer or a reduced fraction.",
            "answer": answer, "expert_code": code, "kind": "algebra"}


def _modpow(rng: random.Random) -> dict:
    a, e, m = rng.randint(2, 99), rng.randint(50, 5000), rng.randint(7, 997)
    return {"problem": f"What is the remainder when {a}^{{{e}}} is divided by {m}?", "answer": str(pow(a, e, m)),
            "expert_code": f"pow({a}, {e}, {m})", "kind": "number_theory"}


def _gcd_lcm(rng: random.Random) -> dict:
    a, b = rng.randint(100, 100000), rng.randint(100, 100000)
    return {"problem": f"Find gcd({a}, {b}) + lcm({a}, {b}).", "answer": str(math.gcd(a, b) + math.lcm(a, b)),
            "expert_code": f"import math\nmath.gcd({a}, {b}) + math.lcm({a}, {b})", "kind": "number_theory"}


def _digit_sum(rng: random.Random) -> dict:
    n = rng.randint(20, 200)
    return {"problem": f"What is the sum of the digits of {n}! ?",
            "answer": str(sum(map(int, str(math.factorial(n))))),
            "expert_code": f"import math\nsum(int(d) for d in str(math.factorial({n})))", "kind": "number_theory"}


MATH_MAKERS = (_arithmetic, _linear, _modpow, _gcd_lcm, _digit_sum)

# ---- code: a reference solution (also the expert's program) and tests computed from it -----------------

_SUM_STDIN = "import sys\nnums = list(map(int, sys.stdin.read().split()))\nprint(sum(nums))\n"
_SECOND = ("def second_largest(nums):\n    values = sorted(set(nums))\n"
           "    return values[-2] if len(values) > 1 else None\n")
_PALINDROME = ("class Solution:\n    def is_palindrome(self, s):\n"
               "        t = [c.lower() for c in s if c.isalnum()]\n        return t == t[::-1]\n")
_REVERSE = "import sys\nfor line in sys.stdin.read().splitlines():\n    print(' '.join(reversed(line.split())))\n"
_FIZZ = ("def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n"
         "        out.append('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i))\n"
         "    return out\n")


def _sum_stdin(rng: random.Random) -> dict:
    cases = [[rng.randint(-1000, 1000) for _ in range(rng.randint(1, 8))] for _ in range(3)]
    return {"problem": "Read whitespace-separated integers from standard input and print their sum.",
            "tests": {"inputs": [" ".join(map(str, c)) + "\n" for c in cases], "outputs": [f"{sum(c)}\n" for c in cases]},
            "expert_code": _SUM_STDIN, "kind": "stdin"}


def _second_largest(rng: random.Random) -> dict:
    cases = [[rng.randint(-50, 50) for _ in range(rng.randint(2, 9))] for _ in range(3)] + [[4, 4]]
    expected = [sorted(set(c))[-2] if len(set(c)) > 1 else None for c in cases]
    return {"problem": "Write a function `second_largest(nums)` that returns the second largest distinct value "
                       "of a list of integers, or None when there is none.",
            "tests": {"fn_name": "second_largest", "inputs": [[c] for c in cases], "outputs": expected},
            "expert_code": _SECOND, "kind": "function"}


def _palindrome(rng: random.Random) -> dict:
    words = ["A man, a plan, a canal: Panama", "race a car", "No lemon, no melon", "turnforge", "Was it a rat I saw?"]
    cases = rng.sample(words, 3)
    expected = [[c.lower() for c in w if c.isalnum()] == [c.lower() for c in w if c.isalnum()][::-1] for w in cases]
    return {"problem": "Complete `class Solution` with a method `is_palindrome(self, s)` that says whether `s` "
                       "reads the same backwards, ignoring case and non-alphanumeric characters.",
            "tests": {"fn_name": "is_palindrome", "inputs": [[w] for w in cases], "outputs": expected},
            "expert_code": _PALINDROME, "kind": "function"}


def _reverse_words(rng: random.Random) -> dict:
    vocab = ["alpha", "beta", "gamma", "delta", "tool", "call", "agent", "sandbox"]
    cases = ["\n".join(" ".join(rng.choices(vocab, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 3)))
             for _ in range(3)]
    outputs = ["\n".join(" ".join(reversed(line.split())) for line in c.splitlines()) + "\n" for c in cases]
    return {"problem": "For every line of standard input, print its words in reverse order.",
            "tests": {"inputs": [c + "\n" for c in cases], "outputs": outputs}, "expert_code": _REVERSE, "kind": "stdin"}


def _fizzbuzz(rng: random.Random) -> dict:
    ns = [rng.randint(1, 30) for _ in range(3)]

    def reference(n: int) -> list[str]:
        return ["FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i)
                for i in range(1, n + 1)]

    return {"problem": "Write `fizzbuzz(n)` returning the list of strings for 1..n: 'Fizz' for multiples of 3, "
                       "'Buzz' for multiples of 5, 'FizzBuzz' for both, else the number.",
            "tests": {"fn_name": "fizzbuzz", "inputs": [[n] for n in ns], "outputs": [reference(n) for n in ns]},
            "expert_code": _FIZZ, "kind": "function"}


CODE_MAKERS = (_sum_stdin, _second_largest, _palindrome, _reverse_words, _fizzbuzz)
