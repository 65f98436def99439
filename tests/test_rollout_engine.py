"""The episode-coroutine engine: a waiting episode stalls only itself, roles are batched across episodes,
envs are always closed, and the results equal the lock-step loop's (kept in benchmarks/rollout_engine.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from functools import partial
from pathlib import Path

import pytest

from turnforge.envs.base import UsesRoles, get_env_spec, load_tasks, make_env
from turnforge.envs.household import HouseholdEnv
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.queue import Role, RoleStats
from turnforge.policies.scripted import ExpertPolicy, RandomPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Message, StopReason

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout_engine.py"


def _lockstep():
    spec = importlib.util.spec_from_file_location("rollout_engine_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=12)


def _outcomes(trajs):
    return [{k: v for k, v in t.to_dict().items() if k != "timings"} for t in trajs]


@pytest.mark.parametrize("policy", [ExpertPolicy(), RandomPolicy(seed=3)], ids=["expert", "random"])
def test_same_trajectories_as_the_lockstep_loop(tasks, policy):
    old = _lockstep().lockstep_episodes(policy, partial(make_env, "household"), tasks, 2,
                                         RolloutLimits(max_turns=12, max_open=5), SamplingParams())
    new = run_episodes(policy, partial(make_env, "household"), tasks, 2, RolloutLimits(max_turns=12, max_open=5))
    assert _outcomes(new) == _outcomes(sorted(old, key=lambda t: [x.id for x in tasks].index(t.task_id)))


def test_greedy_and_seeded_hf_episodes_equal_the_lockstep_loop(tiny_model_dir, tasks):
    """Batches are formed from whichever episodes wait; with quick envs they are the lock-step rounds, so the same
    seed samples the same tokens (the prefix cache on)."""
    from turnforge.policies.hf import HFPolicy

    lockstep = _lockstep().lockstep_episodes
    limits = RolloutLimits(max_turns=4, max_format_errors=None, max_open=4)
    for params in (SamplingParams(temperature=0.0, max_new_tokens=8), SamplingParams(max_new_tokens=8, seed=11)):
        runs = []
        for engine in ("lockstep", "new"):
            policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4)
            env = partial(make_env, "household", max_steps=4)
            if engine == "lockstep":
                runs.append(lockstep(policy, env, tasks[:6], 1, limits, params, policy.renderer))
            else:
                runs.append(run_episodes(policy, env, tasks[:6], 1, limits, params, renderer=policy.renderer))
        old, new = runs
        for a, b in zip(sorted(old, key=lambda t: t.task_id), sorted(new, key=lambda t: t.task_id), strict=True):
            assert [t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns]
            assert a.messages == b.messages


HOUSEHOLD_DEFAULTS = get_env_spec("household").defaults()
"""What make_env gives the household env unasked: the subclasses below are built directly."""


class WaitsForAnother(HouseholdEnv):
    """Task `waiter`'s first step blocks until task `other` has finished: a lock-step loop would never end."""

    blocks = True  # it says its steps may wait, so the rollout runs them in worker threads

    def __init__(self, waiter: str, released: threading.Event):
        super().__init__(**HOUSEHOLD_DEFAULTS)
        self.waiter, self.released = waiter, released

    def step(self, reply):
        if self.task.id == self.waiter and self.steps == 0:
            assert self.released.wait(timeout=30), "the other episodes were stalled by this one's step"
        return super().step(reply)


def test_a_waiting_step_stalls_only_its_own_episode(tasks):
    released = threading.Event()
    order = []

    def finished(traj):
        order.append(traj.task_id)
        if traj.task_id == tasks[1].id:
            released.set()

    trajs = run_episodes(ExpertPolicy(), lambda: WaitsForAnother(tasks[0].id, released), tasks[:3], 1,
                         RolloutLimits(max_open=3), on_finish=finished)
    assert all(t.stop_reason is StopReason.success for t in trajs)
    assert order.index(tasks[1].id) < order.index(tasks[0].id)  # finished while the waiter was blocked
    assert [t.task_id for t in trajs] == [t.id for t in tasks[:3]]  # returned in task order all the same


class EchoUser:
    """A scripted `user` model: answers with the agent's action and the batch it came in."""

    name = "echo-user"
    renderer = None

    def __init__(self):
        self.batches: list[int] = []

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        self.batches.append(len(prompts))
        return [Generation(text=f"you did: {p.messages[-1].content} ({p.task.id}/{p.sample})") for p in prompts]


class OwnerHousehold(HouseholdEnv):
    """Each observation gets the `user` role's answer to the agent's action."""

    roles = ("user",)

    def __init__(self):
        super().__init__(**HOUSEHOLD_DEFAULTS)

    def use_roles(self, clients):
        self.user = clients["user"]

    def step(self, reply):
        result = super().step(reply)
        answer = self.user.generate([Message("system", "You own the house."), Message("user", reply.content)])
        obs = result.messages[-1]
        result.messages[-1] = Message(obs.role, f"{obs.content}\n{answer.text}")
        return result


def test_user_role_requests_are_batched_across_episodes_and_routed_back(tasks):
    user = EchoUser()
    stats: dict[str, RoleStats] = {}
    assert isinstance(OwnerHousehold(), UsesRoles)
    trajs = run_episodes(ExpertPolicy(), OwnerHousehold, tasks, 2, RolloutLimits(max_open=8),
                         roles={"user": Role(user)}, stats=stats)
    assert all(t.score.success for t in trajs)
    for traj in trajs:  # each answer went to the episode that asked
        observations = [m.content for m in traj.messages[3::2]]
        actions = [m.content.removeprefix("ACTION: ") for m in traj.messages[2::2]]
        assert all(o.endswith(f"you did: {a} ({traj.task_id}/{traj.sample})") for o, a in zip(observations, actions, strict=True))
    steps = sum(t.env_steps for t in trajs)
    assert stats["user"].requests == steps == sum(user.batches)
    assert max(user.batches) == 8 and stats["user"].mean_batch > 4  # 8 open episodes ask together


def test_a_missing_role_is_a_clear_error_and_roles_cannot_run_inline(tasks):
    with pytest.raises(ValueError, match=r"needs a policy for model role\(s\) \['user'\]"):
        run_episodes(ExpertPolicy(), OwnerHousehold, tasks[:2], 1)
    with pytest.raises(ValueError, match="cannot be stepped inline"):
        run_episodes(ExpertPolicy(), OwnerHousehold, tasks[:2], 1, RolloutLimits(env_workers=0),
                     roles={"user": Role(EchoUser())})


class CountingHousehold(HouseholdEnv):
    made: list = []

    def __init__(self, explode: str | None = None):
        super().__init__(**HOUSEHOLD_DEFAULTS)
        self.explode, self.closed = explode, 0
        CountingHousehold.made.append(self)

    def step(self, reply):
        if self.task.id == self.explode:
            raise RuntimeError("boom")
        return super().step(reply)

    def close(self):
        self.closed += 1


def test_every_env_is_closed_once_also_after_an_error(tasks):
    CountingHousehold.made = []
    trajs = run_episodes(ExpertPolicy(), lambda: CountingHousehold(tasks[2].id), tasks[:8], 1, RolloutLimits(max_open=3))
    assert [t.stop_reason for t in trajs].count(StopReason.env_error) == 1
    assert len(CountingHousehold.made) >= 3 and all(env.closed == 1 for env in CountingHousehold.made)


class BrokenPolicy:
    name = "broken"
    renderer = None

    def generate(self, prompts, params):
        raise KeyError("backend bug")


def test_a_policy_exception_stops_the_run_and_still_closes_envs(tasks):
    CountingHousehold.made = []
    with pytest.raises(KeyError, match="backend bug"):
        run_episodes(BrokenPolicy(), CountingHousehold, tasks[:4], 1)
    assert CountingHousehold.made and all(env.closed == 1 for env in CountingHousehold.made)


def test_callable_from_inside_a_running_event_loop(tasks):
    async def inside():
        return run_episodes(ExpertPolicy(), partial(make_env, "household"), tasks[:2], 1)

    trajs = asyncio.run(inside())
    assert [t.score.success for t in trajs] == [True, True]



class ServerLikePolicy:
    """A backend that answers many requests at once (like an HTTP server): each call sleeps, then answers."""

    name = "server-like"
    renderer = None
    max_in_flight = 4

    def __init__(self):
        self.lock, self.now, self.most, self.sizes = threading.Lock(), 0, 0, []

    def generate(self, prompts, params):
        import time

        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.sizes.append(len(prompts))
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        return ExpertPolicy().generate(prompts, params)


def test_a_server_backend_gets_one_request_per_call_up_to_its_limit(tasks):
    policy = ServerLikePolicy()
    trajs = run_episodes(policy, partial(make_env, "household"), tasks[:8], 1, RolloutLimits(max_open=8))
    assert all(t.score.success for t in trajs)
    assert set(policy.sizes) == {1} and 1 < policy.most <= 4
