"""Run by `accelerate launch` in tests/test_accelerate_launch.py: the `turnforge` command line itself, in every process,
recording what each process played (test scaffolding, written outside the run directory).

    accelerate launch --num_processes 2 ... tests/launched/run_cli_ranks.py RANKS_DIR run RECIPE --out OUT

Each process writes RANKS_DIR/rank<N>.json at exit: its world size and backend, and per training stage the
episodes its rollout function handed TRL ((task id, generated ids) of each), so that the test can tell the
processes played different episodes. The command's own output is what the test reads from stdout.
"""

import atexit
import json
import os
import sys
from pathlib import Path

from turnforge.train.grpo_rollouts import EpisodeRollouts

played: dict[str, list] = {}
_to_trl = EpisodeRollouts._to_trl


def recording_to_trl(self, episodes):
    stage = Path(self.log_path).parent.name if self.log_path is not None else "?"
    played.setdefault(stage, []).extend([t.task_id, [i for turn in t.turns for i in turn.generated_ids]] for t in episodes)
    return _to_trl(self, episodes)


def write(ranks_dir: str) -> None:
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    seen = {
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "played": played,
    }
    Path(ranks_dir, f"rank{rank}.json").write_text(json.dumps(seen), encoding="utf-8")


if __name__ == "__main__":
    EpisodeRollouts._to_trl = recording_to_trl
    atexit.register(write, sys.argv[1])
    from turnforge.cli import app

    app(sys.argv[2:], prog_name="turnforge")
