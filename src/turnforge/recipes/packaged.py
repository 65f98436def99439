"""The recipes shipped inside the package (src/turnforge/recipes/*.toml), found by bare name: `turnforge run quickstart`.

A module of its own, importing nothing: `turnforge run --help` lists them without loading the stage kinds.
"""

from __future__ import annotations

from pathlib import Path


def packaged_recipes() -> dict[str, Path]:
    """name -> path of the recipes shipped inside the package (src/turnforge/recipes/*.toml)."""
    here = Path(__file__).parent
    return {p.stem: p for p in sorted(here.glob("*.toml"))}
