"""What serving an env over OpenEnv costs: steps/s through `turnforge env serve` + openenv's client vs in-process.

Workload: the expert's episodes of a split (their replies, played back as raw text), the same in every row:

  in-process   make_env once, then per episode reset(task) -> step(format.parse(reply))* -> score()
  served, N    `turnforge env serve` in a subprocess; N sessions at once (openenv's async GenericEnvClient, one
               WebSocket each, on one event loop), each playing its share of the episodes: reset(task_id) ->
               step({"text": reply})* -> state() (the score)

Every row's rewards are checked equal to the in-process ones. Steps/s counts `step` calls; the time includes the
resets and the scores; each row is the best of `--repeats` runs.

    PYTHONPATH=src .venv/bin/python benchmarks/openenv_overhead.py --episodes 200 --repeats 3
    PYTHONPATH=src .venv/bin/python benchmarks/openenv_overhead.py --env service \
        --env-opt domain=retail --env-opt data_dir=../shared/data/tau2/retail
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

from openenv import GenericEnvClient

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import make_policy
from turnforge.rollout import run_episodes


def expert_episodes(env: str, options: dict, split: str, count: int | None):
    tasks = load_tasks(env, split, limit=count, **options)
    trajectories = run_episodes(make_policy("expert"), lambda: make_env(env, **options), tasks, 1, progress=False)
    return tasks, [[t.messages[i].content for i in t.reply_indices()] for t in trajectories]


def in_process(env_name: str, options: dict, tasks, replies) -> tuple[float, list[float]]:
    env = make_env(env_name, **options)
    started, rewards = time.perf_counter(), []
    for task, texts in zip(tasks, replies, strict=True):
        env.reset(task)
        for text in texts:
            env.step(env.format.parse(text))
        rewards.append(env.score().reward)
    elapsed = time.perf_counter() - started
    env.close()
    return elapsed, rewards


async def served(url: str, sessions: int, tasks, replies) -> tuple[float, list[float]]:
    rewards: list[float] = [0.0] * len(tasks)
    work = list(range(len(tasks)))

    async def session() -> None:
        async with GenericEnvClient(base_url=url) as client:
            while work:
                i = work.pop()
                await client.reset(task_id=tasks[i].id)
                for text in replies[i]:
                    await client.step({"text": text})
                rewards[i] = (await client.state())["score"]["reward"]

    clients = [GenericEnvClient(base_url=url) for _ in range(sessions)]  # warm the imports, not timed
    del clients
    started = time.perf_counter()
    await asyncio.gather(*(session() for _ in range(sessions)))
    return time.perf_counter() - started, rewards


def start_server(env: str, raw_options: list[str], split: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "turnforge", "env", "serve", "--env", env, "--split", split, "--port", "0"]
    for pair in raw_options:
        command += ["--env-opt", pair]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if " at " not in line:
        process.kill()
        raise SystemExit(f"env serve did not start: {line!r}")
    return process, line.split(" at ")[1].split(" ")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="household")
    parser.add_argument("--env-opt", action="append", default=[])
    parser.add_argument("--split", default="test")
    parser.add_argument("--episodes", type=int, default=None, help="first N tasks of the split (default: all)")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--repeats", type=int, default=3, help="each row's best of N runs")
    args = parser.parse_args()
    options = dict(pair.split("=", 1) for pair in args.env_opt)

    tasks, replies = expert_episodes(args.env, options, args.split, args.episodes)
    steps = sum(map(len, replies))
    runs = [in_process(args.env, options, tasks, replies) for _ in range(args.repeats)]
    base_s, base_rewards = min(elapsed for elapsed, _ in runs), runs[0][1]
    rows = [("in-process", base_s)]
    process, url = start_server(args.env, args.env_opt, args.split)
    try:
        for sessions in args.sessions:
            runs = [asyncio.run(served(url, sessions, tasks, replies)) for _ in range(args.repeats)]
            assert all(rewards == base_rewards for _, rewards in runs), "served rewards differ from in-process ones"
            elapsed = min(elapsed for elapsed, _ in runs)
            rows.append((f"served, {sessions} session{'s' * (sessions > 1)}", elapsed))
    finally:
        process.terminate()
        process.wait(timeout=30)

    print(f"{args.env} {args.split}: {len(tasks)} expert episodes, {steps} steps, mean reward "
          f"{sum(base_rewards) / len(base_rewards):.3f} (equal in every row)\n")
    print("| way | s | steps/s | episodes/s | vs in-process |")
    print("|---|---:|---:|---:|---:|")
    for name, elapsed in rows:
        print(f"| {name} | {elapsed:.2f} | {steps / elapsed:,.0f} | {len(tasks) / elapsed:,.1f} | "
              f"{base_s / elapsed:.3f}× |")


if __name__ == "__main__":
    main()
