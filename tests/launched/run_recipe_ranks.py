"""Run by `accelerate launch` in tests/test_accelerate_launch.py: one recipe, every process; each process writes what
it saw to RANKS_DIR/rank<N>.json (test scaffolding, outside the run directory) for the test to compare.

    accelerate launch --num_processes 2 ... tests/launched/run_recipe_ranks.py RECIPE OUT RANKS_DIR
"""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from rich.console import Console

from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe


def main(recipe: str, out: str, ranks_dir: str) -> None:
    summary = run_recipe(load_recipe(recipe), out, console=Console(quiet=True))
    rank = dist.get_rank() if dist.is_initialized() else 0
    seen = {
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "results": {sid: s["result"] for sid, s in summary["stages"].items()},
        "status": {sid: s["status"] for sid, s in summary["stages"].items()},
    }
    Path(ranks_dir, f"rank{rank}.json").write_text(json.dumps(seen, default=str), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:4])
