"""Env options declare their ranges: a value that makes no sense is one clear error before anything runs
(issue 17: `max_steps=0`, `receptacles=-1`, `max_rounds=0`, `timeout=0` ... used to give a silent 0 %)."""

from __future__ import annotations

from functools import partial

import pytest

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes


@pytest.mark.parametrize(
    ("env", "option", "value", "expected"),
    [
        ("household", "max_steps", "0", "at least 1"),
        ("household", "max_steps", "-5", "at least 1"),
        ("household", "receptacles", "-1", "at least 0.1"),
        ("household", "distractors", "-1", "at least 0"),
        ("household", "closed", "5", "in 0..1"),
        ("household", "step_delay_ms", "-20", "at least 0"),
        ("bfcl", "max_steps_per_turn", "0", "at least 1"),
        ("dbbench", "max_rounds", "0", "at least 1"),
        ("dbbench", "timeout", "0", "at least 0.01"),
        ("dbbench", "timeout", "-1", "at least 0.01"),
        ("sql", "generate", "0", r"in 1\.\.100000"),
    ],
)
def test_out_of_range_options_are_refused_by_name(env, option, value, expected):
    with pytest.raises(ValueError, match=rf"option '{option}': .* out of range; it must be {expected}"):
        get_env_spec(env).coerce_options({option: value})


def test_the_smallest_allowed_household_still_plays():
    options = {"receptacles": 0.1, "distractors": 0, "closed": 0.0, "max_steps": 50}
    tasks = load_tasks("household", "test", limit=6, **options)
    trajs = run_episodes(ExpertPolicy(), partial(make_env, "household", **options), tasks, 1)
    assert all(t.score.success for t in trajs)
