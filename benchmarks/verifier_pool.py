"""math-verify verdicts/s and p99 latency at 1 and 64 open episodes: the shared pool of warm checker children
vs a fresh interpreter per check, in one run (issue 40).

Each open episode is a thread that checks one final answer after another (`\\boxed{\\frac{k}{2}}` against
`k/2`, all correct; every verdict is asserted). Ways:
  fresh   `subprocess.run([python, "-c", ...])` per check: an interpreter that imports math-verify and runs
          `MathVerifier.verify` (what a child per open episode cost before issue 40, without its 10 s wall)
  pool    `check_math(reply, answer, "math_verify")`: the process's shared pool (`turnforge.envs.isolation`,
          min(cores, 8) children, math-verify imported once per child; the pool is warmed outside the timing)
Latency is from the episode asking to its verdict (waiting for a free child included); verdicts/s = checks /
wall time of the batch. The ways take turns in `--rounds` rounds, so both see the same load; `over 10 s` is
the share of checks that the old 10 s wall clock would have graded wrong.

    PYTHONPATH=src .venv/bin/python benchmarks/verifier_pool.py --rounds 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from turnforge.envs.code.checking import check_math
from turnforge.envs.isolation import pool_size

FRESH = (
    "import sys\nfrom turnforge.envs.code.checking import MathVerifier\n"
    "sys.exit(0 if MathVerifier().verify(sys.argv[1], sys.argv[2]) else 1)"
)


def case(k: int) -> tuple[str, str]:
    return f"So the answer is \\boxed{{\\frac{{{k}}}{{2}}}}.", f"{k / 2:g}"


def fresh(k: int) -> bool:
    reply, answer = case(k)
    return subprocess.run([sys.executable, "-c", FRESH, answer, reply], capture_output=True, timeout=600).returncode == 0


def pooled(k: int) -> bool:
    return check_math(*case(k), "math_verify") == (True, None)


def timed_batch(check, checks: int, open_episodes: int) -> tuple[float, list[float]]:
    """(wall seconds, per-check latencies) of `checks` checks from `open_episodes` threads."""
    def one(k: int) -> float:
        start = time.perf_counter()
        assert check(k), f"check {k} gave a wrong verdict"
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(open_episodes) as executor:
        latencies = list(executor.map(one, range(1, checks + 1)))
    return time.perf_counter() - start, latencies


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="turns the two ways take")
    parser.add_argument("--fresh-checks", type=int, default=8, help="per open episode and round, fresh way")
    parser.add_argument("--pool-checks", type=int, default=40, help="per open episode and round, pool way (1 episode)")
    args = parser.parse_args()
    pooled(1)  # warm: the pool's children start and import math-verify outside the timing
    timed_batch(pooled, 4 * pool_size(), pool_size())
    print(f"pool size {pool_size()}; {args.rounds} rounds")
    print("| open episodes | way | checks | verdicts/s | p50 latency s | p99 latency s | over 10 s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for open_episodes in (1, 64):
        totals = {"fresh": [0.0, []], "pool": [0.0, []]}
        n_fresh = args.fresh_checks * (1 if open_episodes == 1 else 8)  # 64 at once: 64 fresh checks a round
        n_pool = args.pool_checks * (1 if open_episodes == 1 else 16)
        for _ in range(args.rounds):
            for name, check, n in (("fresh", fresh, n_fresh), ("pool", pooled, n_pool)):
                wall, latencies = timed_batch(check, n, open_episodes)
                totals[name][0] += wall
                totals[name][1] += latencies
        rates = {}
        for name, (wall, latencies) in totals.items():
            rates[name] = len(latencies) / wall
            over = sum(t > 10.0 for t in latencies) / len(latencies)
            print(f"| {open_episodes} | {name} | {len(latencies)} | {rates[name]:.1f} | "
                  f"{sorted(latencies)[len(latencies) // 2]:.3f} | {p99(latencies):.3f} | {over:.0%} |")
        print(f"| {open_episodes} | pool / fresh | | **{rates['pool'] / rates['fresh']:.0f}×** | | | |")


if __name__ == "__main__":
    main()
