"""The field's standard interfaces: OpenEnv (serve any env, `openenv:URL` as an env) and TRL's environment_factory."""
