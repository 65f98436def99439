"""The hf policy on a CUDA device, with and without prefix sharing (every tensor follows the model's device).

Marked `gpu`: deselected by default, run with `pytest -m gpu` where a GPU exists.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.base import SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.rollout import RolloutLimits, run_episodes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_cuda_rollouts_with_and_without_prefix_sharing_agree(tiny_model_dir, fmt):
    tasks = load_tasks("household", "test", limit=8)
    limits = RolloutLimits(max_turns=5, max_format_errors=None, max_open=8)
    env = partial(make_env, "household", format=fmt, max_steps=5)
    runs = {}
    for cached in (True, False):
        policy = HFPolicy(str(tiny_model_dir), device="cuda", dtype="float32", prefix_sharing=cached)
        assert policy.device.type == "cuda"
        params = SamplingParams(temperature=0.0, max_new_tokens=12)
        runs[cached] = run_episodes(policy, env, tasks, 1, limits, params, renderer=policy.renderer)
    for a, b in zip(runs[True], runs[False], strict=True):
        assert len(a.turns) == len(b.turns) == 5
        for x, y in zip(a.turns, b.turns, strict=True):
            assert x.generated_ids == y.generated_ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-3)


def test_cuda_sampling_runs_and_reports_finite_logprobs(tiny_model_dir):
    policy = HFPolicy(str(tiny_model_dir), device="cuda", dtype="bfloat16")
    tasks = load_tasks("household", "test", limit=4)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=12, seed=3)
    trajs = run_episodes(policy, partial(make_env, "household", max_steps=3), tasks, 2,
                         RolloutLimits(max_turns=3, max_format_errors=None), params, renderer=policy.renderer)
    assert len(trajs) == 8
    for traj in trajs:
        for turn in traj.turns:
            assert len(turn.logprobs) == len(turn.generated_ids) > 0
            assert all(lp <= 0.0 and lp == lp for lp in turn.logprobs)
