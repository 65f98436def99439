"""Scale-out on engines users already run (docs/scaling.md): Ray for rollouts and evaluation
(`turnforge.scale.ray_rollout`, imported only with `--ray`) and `accelerate launch` for training
(`turnforge.scale.processes`: which process writes the run's files, and where the others wait).
"""

from turnforge.scale.config import ScaleConfig

__all__ = ["ScaleConfig"]
