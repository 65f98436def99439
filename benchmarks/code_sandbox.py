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
math-verify: `check_math(reply, answer, "math_verify")` from T threads, each check in an isolation child
(math-verify with its own signal timeouts off, our timeout around it).

    PYTHONPATH=src .venv/bin/python benchmarks/code_sandbox.py --calls 200 --workers 2
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


def fresh(code: str, expected: str, calls: int, threads: int) -> float:
    def one(_):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.stdout == expected, out

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(calls)))
    return calls / (time.perf_counter() - start)


def pooled(pool: SandboxPool, code: str, expected: str, calls: int, threads: int) -> float:
    def one(_):
        result = pool.run(code)
        assert result.stdout == expected, result

    one(0)  # warm
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as executor:
        list(executor.map(one, range(calls)))
    return calls / (time.perf_counter() - start)


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
    parser.add_argument("--checks", type=int, default=200)
    args = parser.parse_args()
    with SandboxPool(size=args.workers) as pool:
        print(f"isolation: {pool.isolation}; {args.calls} calls, {args.workers} workers/threads")
        print("| workload | fresh `python -c` calls/s | pooled sandbox calls/s | ratio |")
        print("|---|---:|---:|---:|")
        for name, (code, expected) in WORKLOADS.items():
            a = fresh(code, expected, args.calls, args.workers)
            b = pooled(pool, code, expected, args.calls, args.workers)
            print(f"| {name} | {a:.1f} | {b:.1f} | **{b / a:.1f}×** |")
    for threads in (1, args.workers):
        print(f"math-verify, {threads} thread(s): {math_verify_rate(args.checks, threads):.1f} checks/s")


if __name__ == "__main__":
    main()
