"""Calls per second of the code env's pooled sandbox vs a fresh `python -c` subprocess per call, in one run;
and math-verify checks per second in parallel isolation children.

Workloads (each call a separate program, its stdout checked):
  tiny    `print(sum(range(1000)))`
  import  `import json, math, collections; print(math.factorial(30) % 97)` — what model code often imports
Ways:
  fresh    `subprocess.run([python, "-c", code], capture_output=True)`: no isolation at all (the floor an
           unpooled runner pays: an interpreter start per call)
  pooled   `SandboxPool(size).run(code)` from `threads` = size threads: a fork of a ready worker, plus the
           isolation (namespaces, uid, rlimits, kill-all-of-uid, private /tmp wiped) on every call
The two ways take turns in `--rounds` rounds of calls/rounds calls each (both see the same load from whatever
else runs on the machine); calls/s = all calls of a way / its summed time.
math-verify: `check_math(reply, answer, "math_verify")` from T threads, each check in an isolation child
(math-verify with its own signal timeouts off, our timeout around it).

    PYTHONPATH=src .venv/bin/python benchmarks/code_sandbox.py --calls 300 --workers 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from turnforge.envs.code.checking import check_math
from turnforge.envs.code.sandbox import SandboxPool

WORKLOADS = {
    "tiny": ("print(sum(range(1000)))", "499500\n"),
    "import": ("import json, math, collections\nprint(math.factorial(30) % 97)", f"{__import__('math').factorial(30) % 97}\n"),
}


def fresh(code: str, expected: str):
    def one(_):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout == expected, out

    return one


def pooled(pool: SandboxPool, code: str, expected: str):
    def one(_):
        result = pool.run(code)
        assert result.stdout == expected, result

    return one


def rates(ways: list, calls: int, threads: int, rounds: int) -> list[float]:
    """Calls per second of each way, the ways taking turns in `rounds` rounds (so they share the load)."""
    spent = [0.0] * len(ways)
    with ThreadPoolExecutor(threads) as executor:
        for way in ways:  # warm
            list(executor.map(way, range(threads)))
        for _ in range(rounds):
            for i, way in enumerate(ways):
                start = time.perf_counter()
                list(executor.map(way, range(calls // rounds)))
                spent[i] += time.perf_counter() - start
    return [calls // rounds * rounds / t for t in spent]


def math_verify_rate(checks: int, threads: int) -> float:
    cases = [(f"So the answer is \\boxed{{\\frac{{{k}}}{{2}}}}.", f"{k / 2}") for k in range(checks)]
    with ThreadPoolExecutor(threads) as executor:  # start one child per thread outside the timing
        list(executor.map(lambda c: check_math(c[0], c[1], "math_verify"), cases[:threads] * 2))
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as executor:
        verdicts = list(executor.map(lambda c: check_math(c[0], c[1], "math_verify")[0], cases))
    rate = checks / (time.perf_counter() - start)
    assert all(verdicts), verdicts
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="pool size = threads for both ways")
    parser.add_argument("--rounds", type=int, default=10, help="turns the two ways take")
    parser.add_argument("--checks", type=int, default=200)
    args = parser.parse_args()
    with SandboxPool(size=args.workers) as pool:
        print(f"isolation: {pool.isolation}; {args.calls} calls, {args.workers} workers/threads")
        print("| workload | fresh `python -c` calls/s | pooled sandbox calls/s | ratio |")
        print("|---|---:|---:|---:|")
        for name, (code, expected) in WORKLOADS.items():
            a, b = rates([fresh(code, expected), pooled(pool, code, expected)], args.calls, args.workers, args.rounds)
            print(f"| {name} | {a:.1f} | {b:.1f} | **{b / a:.1f}×** |")
    for threads in (1, args.workers):
        print(f"math-verify, {threads} thread(s): {math_verify_rate(args.checks, threads):.1f} checks/s")


if __name__ == "__main__":
    main()
