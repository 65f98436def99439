"""The model roles an env declares (a `user` simulator, a `judge`), built from the specs in its options.

An env never builds a model: its registry entry says which options name a role (`EnvSpec.model_roles`, e.g.
`--env-opt user=hf:PATH`), and whoever runs episodes (the eval runner, the GRPO rollouts) builds them here and
passes them to `run_episodes(roles=...)`.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.base import get_env_spec
from turnforge.policies import PolicySpec, make_policy
from turnforge.policies.base import SamplingParams
from turnforge.policies.queue import Role


def env_roles(
    env: str, options: dict[str, Any], params: SamplingParams, seed: int, agent_spec: str,
    policy_options: dict[str, Any] | None = None,
) -> dict[str, Role]:
    """The model roles env `env` asks for with these options (its spec's `model_roles`, e.g. a `user`
    simulator named by `--env-opt user=hf:PATH`), built here and passed to `run_episodes(roles=...)`.

    Each role gets the agent's sampling settings with the role's own overrides (e.g. the user's temperature)
    and the agent's device / dtype / batch size; a role the spec hands over ready-made (a replayed user) is
    used as it is.
    """
    shared = {k: v for k, v in (policy_options or {}).items() if k in ("device", "dtype", "batch_size")}
    roles = {}
    for role, (spec, overrides) in get_env_spec(env).roles(options, agent_spec).items():
        in_process = isinstance(spec, str) and PolicySpec.parse(spec).kind in ("hf", "vllm")
        policy = make_policy(spec, seed=seed, **(shared if in_process else {})) if isinstance(spec, str) else spec
        roles[role] = Role(policy, params.replace(**overrides))
    return roles
