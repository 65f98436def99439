"""`ScaleConfig`: where rollouts run — in this process (the default) or fanned out over Ray actors.

The CLI's `--ray ADDRESS --workers N --worker-cpus C --worker-gpus G` and a recipe's `[scale]` table build it.
It never changes results (a run resumes with or without Ray), so it is not part of a run's identity.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ScaleConfig(BaseModel):
    """`[scale]`: the Ray fan-out of collection, evaluation and RFT sampling (unset `ray`: in-process)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    ray: str | None = None
    """"auto" (the Ray instance in RAY_ADDRESS or running on this machine, else a new local one) or an address
    (`ray://head:10001`, `10.0.0.5:6379`); unset = no Ray (it is not even imported)."""
    workers: int = Field(default=1, ge=1)
    """Ray actors that each build the env and the policy (a replica of an hf/vllm model) and play a share of the
    episodes; an openai:URL policy is a shared server that every worker calls."""
    worker_cpus: float = Field(default=1.0, ge=0.0)
    """CPUs Ray reserves per worker (fractions allowed: a worker that mostly waits on a slow env needs little)."""
    worker_gpus: float = Field(default=0.0, ge=0.0)
    """GPUs Ray reserves per worker: 1 for an hf/vllm replica per GPU, 0 for scripted and openai policies."""

    @model_validator(mode="after")
    def _ray_for_workers(self) -> ScaleConfig:
        if self.ray is None and self.workers > 1:
            raise ValueError(f"workers = {self.workers} needs ray (\"auto\" or an address); without it rollouts run "
                             "in this process")
        if self.ray is not None and not self.ray.strip():
            raise ValueError('ray must be "auto" or a Ray address (e.g. ray://head:10001)')
        return self

    @property
    def uses_ray(self) -> bool:
        return self.ray is not None
