"""Served throughput: `turnforge serve` answering N chat requests at concurrency 1, 8 and 32, in one run.

Concurrency 1 is one request at a time (each `generate` call holds one prompt); at 8 and 32 the server's
batching queue gathers the requests that arrive while the model is busy into one batched call. Same model,
same requests (the first prompts of household test tasks), greedy, `max_tokens` fixed; requests go through
the official `openai` client from a thread pool, as the openai policy sends them.

    PYTHONPATH=src .venv/bin/python benchmarks/served_throughput.py [--model DIR] [--requests 64] [--max-tokens 24]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.serve import ServedModel, running_server


def prompts(n: int) -> list[list[dict]]:
    env = make_env("household")
    return [[m.to_dict() for m in env.reset(task)] for task in load_tasks("household", "test", limit=n)]


def measure(url: str, messages: list[list[dict]], concurrency: int, max_tokens: int) -> dict:
    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)

    def ask(m: list[dict]) -> int:
        reply = client.chat.completions.create(model="tiny", messages=m, temperature=0, max_tokens=max_tokens)
        return reply.usage.completion_tokens

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(ask, messages[:concurrency]))  # warm-up: threads, connections, first calls
        started = time.perf_counter()
        tokens = sum(pool.map(ask, messages))
        seconds = time.perf_counter() - started
    return {"concurrency": concurrency, "requests": len(messages), "tokens": tokens, "seconds": seconds,
            "requests_per_s": len(messages) / seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the tiny model, built offline)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    model = args.model
    if model is None:
        from turnforge.tiny_model import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp() + "/tiny"))
    served = ServedModel(model, name="tiny", device="cpu")
    messages = prompts(args.requests)
    with running_server(served) as url:
        rows = [measure(url, messages, c, args.max_tokens) for c in args.concurrency]
    base = rows[0]
    print("| concurrency | requests | tokens | seconds | requests/s | tokens/s | vs one at a time |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['requests']} | {r['tokens']} | {r['seconds']:.2f} | "
              f"{r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x |")


if __name__ == "__main__":
    main()
