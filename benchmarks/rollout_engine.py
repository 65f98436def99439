"""The episode-coroutine engine vs the lock-step loop it replaced: same policies, envs and tasks, in one run.

`lockstep_episodes` below is the previous `run_episodes` kept for this comparison (not in src/): each round
opens episodes up to `max_open`, makes ONE batched `generate` call for every open episode, then steps every
env (inline, or with `--lockstep-workers N` in a pool of N threads) before the next round starts. It uses the
same per-episode functions as the new engine (`turnforge.episode`: `step_episode`, `to_trajectory`), so the two differ in scheduling only.

Three scenarios (each prints seconds, episodes/s, the ratio, and whether the episodes are identical):
  a. household + the tiny hf model on CPU, prefix cache on, greedy: is the new engine any slower?
  b. household with `step_delay_ms=20` (each step sleeps 20 ms, standing in for a sandbox or a simulated
     user) and 64 open episodes, expert policy: episodes/s, and wall time vs the summed delays;
  c. two roles: an env whose every step asks a `user` model (the tiny hf model) to answer the agent; the new
     engine batches the user's generations across episodes (mean batch size reported), the lock-step loop
     calls the user one episode at a time from inside `step`, as an env had to before roles existed.

    .venv/bin/python benchmarks/rollout_engine.py              # all three (~3 min on 2 CPU cores)
    .venv/bin/python benchmarks/rollout_engine.py --only b
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.envs.household import HouseholdEnv
from turnforge.episode import Episode, RolloutLimits, fail_episode, step_episode, to_trajectory
from turnforge.policies.base import Policy, Prompt, SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.policies.queue import Role, RoleStats
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.tiny_model import build_tiny_model
from turnforge.types import Message, Trajectory

# ---- the lock-step loop, as it was ------------------------------------------------------------------------


def lockstep_episodes(policy, env_factory, tasks, samples, limits, params, renderer=None, workers=0):
    queue = deque(Episode(t, s, i) for i, (t, s) in enumerate((t, s) for t in tasks for s in range(samples)))
    finished: list[Trajectory] = []
    idle, open_eps = [], []
    pool = ThreadPoolExecutor(workers) if workers else None
    run_all = (lambda fn, xs: list(pool.map(fn, xs))) if pool else (lambda fn, xs: [fn(x) for x in xs])
    while queue or open_eps:
        opened = [queue.popleft() for _ in range(min(len(queue), limits.max_open - len(open_eps)))]
        for ep in opened:
            ep.env = idle.pop() if idle else None
        run_all(lambda ep: _lockstep_reset(ep, env_factory, renderer), opened)
        open_eps += opened
        live = [ep for ep in open_eps if not ep.closed]
        if live:
            prompts = [Prompt(ep.messages, ep.task, ep.sample, len(ep.turns), ep.ids if renderer else None,
                              ep.tools, ep.env) for ep in live]
            t0 = time.perf_counter()
            gens = policy.generate(prompts, params)
            for ep in live:
                ep.generate_s += (time.perf_counter() - t0) / len(live)
            run_all(lambda pair: step_episode(*pair, limits, renderer), zip(live, gens, strict=True))
        for ep in open_eps:
            if ep.closed:
                finished.append(to_trajectory(ep, 0, policy.name))
                if ep.error is None:
                    idle.append(ep.env)
        open_eps = [ep for ep in open_eps if not ep.closed]
    if pool:
        pool.shutdown()
    return sorted(finished, key=lambda t: (t.task_id, t.sample))


def _lockstep_reset(ep, env_factory, renderer):
    ep.started = time.perf_counter()
    try:
        if ep.env is None:
            ep.env = env_factory()
        ep.messages = list(ep.env.reset(ep.task))
        ep.tools = ep.env.tools()
    except Exception:
        fail_episode(ep)
        return
    if renderer is not None:
        ep.prompt_ids = renderer.prompt_ids(ep.messages, ep.tools)
        ep.ids = list(ep.prompt_ids)


# ---- a two-role env ---------------------------------------------------------------------------------------

USER_SYSTEM = "You own this house. Answer the helper's last command in one short sentence."


class OwnerHousehold(HouseholdEnv):
    """Household whose every step also shows the owner's answer, written by a `user` model.

    With roles (the new engine) the owner is the rollout's `user` role; without (`direct_user`), the env calls
    the user policy itself, one episode at a time, as envs had to before roles existed.
    """

    roles = ("user",)

    def __init__(self, direct_user: Policy | None = None, user_params: SamplingParams | None = None, **options):
        super().__init__(**get_env_spec("household").resolve(options))  # as make_env builds it
        self.direct_user, self.user_params = direct_user, user_params
        self.clients: dict = {}

    def use_roles(self, clients: dict) -> None:
        self.clients = clients

    def step(self, reply):
        result = super().step(reply)
        action = reply.content if isinstance(reply, Message) else "(unreadable)"
        messages = [Message("system", USER_SYSTEM), Message("user", action or "(nothing)")]
        if self.direct_user is not None:
            prompt = Prompt(messages, self.task, 0, self.steps)
            answer = self.direct_user.generate([prompt], self.user_params)[0].text
        else:
            answer = self.clients["user"].generate(messages).text
        obs = result.messages[-1]
        result.messages[-1] = Message(obs.role, f"{obs.content}\nOwner: {answer.strip()[:200]}", obs.tool_call_id, obs.name)
        return result


# ---- scenarios --------------------------------------------------------------------------------------------


def _same(a: list[Trajectory], b: list[Trajectory]) -> bool:
    strip = lambda t: {k: v for k, v in t.to_dict().items() if k != "timings"}  # noqa: E731
    key = lambda t: (t.task_id, t.sample)  # noqa: E731
    return [strip(t) for t in sorted(a, key=key)] == [strip(t) for t in sorted(b, key=key)]


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def scenario_a(model: str, n_tasks: int, max_turns: int, repeats: int) -> dict:
    """Lock-step and engine alternate `repeats` times (fresh policies each time); the ratio is the median of
    the pairs' ratios, so that load from other processes hits both alike."""
    tasks = load_tasks("household", "test", limit=n_tasks)
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    limits = RolloutLimits(max_turns=max_turns, max_format_errors=None, max_open=n_tasks)
    env = partial(make_env, "household")
    ratios, times, outs = [], {"lockstep": [], "engine": []}, {}
    for _ in range(repeats):
        for name in ("lockstep", "engine"):
            policy = HFPolicy(model, device="cpu", dtype="float32", batch_size=n_tasks)
            started = time.perf_counter()
            if name == "lockstep":
                outs[name] = lockstep_episodes(policy, env, tasks, 1, limits, params, policy.renderer)
            else:
                outs[name] = run_episodes(policy, env, tasks, 1, limits, params, renderer=policy.renderer)
            times[name].append(time.perf_counter() - started)
        ratios.append(times["lockstep"][-1] / times["engine"][-1])
    return {"scenario": "a: household + tiny hf (CPU, prefix cache, greedy)", "episodes": len(tasks),
            "repeats": repeats, "lockstep_s": [round(t, 2) for t in times["lockstep"]],
            "engine_s": [round(t, 2) for t in times["engine"]], "ratio_median": round(statistics.median(ratios), 3),
            "identical": _same(outs["lockstep"], outs["engine"])}


def scenario_b(n_tasks: int, delay_ms: int) -> dict:
    tasks = load_tasks("household", "test", limit=n_tasks)
    limits = RolloutLimits(max_open=64)
    env = partial(make_env, "household", step_delay_ms=delay_ms)
    params = SamplingParams()
    lock, s_lock = _timed(lambda: lockstep_episodes(ExpertPolicy(), env, tasks, 1, limits, params))
    lock_pool, s_pool = _timed(lambda: lockstep_episodes(ExpertPolicy(), env, tasks, 1, limits, params, workers=64))
    new, s_new = _timed(lambda: run_episodes(ExpertPolicy(), env, tasks, 1, limits, params))
    steps = sum(t.env_steps for t in new)
    delays = steps * delay_ms / 1000
    return {"scenario": f"b: household step_delay_ms={delay_ms}, 64 open, expert", "episodes": len(tasks),
            "env_steps": steps, "summed_delays_s": round(delays, 2),
            "lockstep_s": round(s_lock, 2), "lockstep_pool64_s": round(s_pool, 2), "engine_s": round(s_new, 2),
            "ratio_vs_lockstep": round(s_lock / s_new, 2), "ratio_vs_lockstep_pool64": round(s_pool / s_new, 2),
            "engine_wall_over_delays": round(s_new / delays, 3),
            "identical": _same(lock, new) and _same(lock_pool, new)}


def scenario_c(model: str, n_tasks: int, max_turns: int) -> dict:
    tasks = load_tasks("household", "test", limit=n_tasks)
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    user_params = SamplingParams(temperature=0.0, max_new_tokens=16)
    limits = RolloutLimits(max_turns=max_turns, max_format_errors=None, max_open=n_tasks)
    agent = HFPolicy(model, device="cpu", dtype="float32", batch_size=n_tasks)
    user = HFPolicy(model, device="cpu", dtype="float32", batch_size=n_tasks, prefix_sharing=False)
    direct = partial(OwnerHousehold, direct_user=user, user_params=user_params)
    lock, s_lock = _timed(lambda: lockstep_episodes(agent, direct, tasks, 1, limits, params, agent.renderer))
    stats: dict[str, RoleStats] = {}
    new, s_new = _timed(lambda: run_episodes(
        agent, OwnerHousehold, tasks, 1, limits, params, renderer=agent.renderer,
        roles={"user": Role(user, user_params)}, stats=stats))
    return {"scenario": "c: agent + hf user role (tiny model, CPU)", "episodes": len(tasks),
            "user_requests": stats["user"].requests, "user_calls": stats["user"].calls,
            "user_mean_batch": round(stats["user"].mean_batch, 2),
            "agent_mean_batch": round(stats["agent"].mean_batch, 2),
            "lockstep_direct_user_s": round(s_lock, 2), "engine_s": round(s_new, 2),
            "ratio": round(s_lock / s_new, 2), "identical": _same(lock, new)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: build the untrained tiny model)")
    parser.add_argument("--only", choices=("a", "b", "c"), action="append")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5, help="alternations of scenario a")
    args = parser.parse_args()
    which = args.only or ["a", "b", "c"]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or (str(build_tiny_model(f"{tmp}/tiny")) if {"a", "c"} & set(which) else None)
        rows = []
        if "a" in which:
            rows.append(scenario_a(model, args.tasks, args.max_turns, args.repeats))
        if "b" in which:
            rows.append(scenario_b(128, args.delay_ms))
        if "c" in which:
            rows.append(scenario_c(model, args.tasks, args.max_turns))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
