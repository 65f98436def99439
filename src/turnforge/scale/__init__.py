"""Scale-out of rollouts and evaluation on Ray (docs/scaling.md): `[scale]` (`ScaleConfig`) and
`turnforge.scale.ray_rollout` (imported only with `--ray`). Training under `accelerate launch` needs only
`turnforge.launch` (which process writes the run's files, and where the others wait).
"""

from turnforge.scale.config import ScaleConfig

__all__ = ["ScaleConfig"]
