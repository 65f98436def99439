"""Environments: the Env protocol, the registry behind `--env`, and one package per family."""

from turnforge.envs.base import Env, EnvSpec, list_envs, load_tasks, make_env

__all__ = ["Env", "EnvSpec", "list_envs", "load_tasks", "make_env"]
