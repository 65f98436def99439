"""The one registry of stage kinds: kind -> (typed config class, run function).

A stage kind is one file, `stages/<kind>.py`, holding its config class and its `run()`, and ending with

    register_stage(MyStageConfig, run_my_stage)

The kind's name is the default of its config's `kind` field. `stages/__init__.py` imports every kind module,
so that the recipe loader (which validates `[[stages]]` tables with `stage_kind(kind).config`) and the
pipeline (which runs them with `stage_kind(kind).run`) see the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.stages.config import StageConfig
from turnforge.stages.context import RunContext

StageRunner = Callable[[Any, int, Path, RunContext], dict[str, Any]]
"""`run(stage, index, stage_dir, ctx) -> result`: the result (JSON) is stored in the stage's done.json; paths
in it are relative to the run directory."""


@dataclass(frozen=True)
class StageKind:
    """One `[[stages]]` kind: its typed config class and the function that runs a stage of it."""

    kind: str
    config: type[StageConfig]
    run: StageRunner


_KINDS: dict[str, StageKind] = {}


def register_stage(config: type[StageConfig], run: StageRunner) -> StageKind:
    """Register a stage kind, named by the default of `config`'s `kind` field; a kind is registered once."""
    kind = config.model_fields["kind"].default
    if not isinstance(kind, str):
        raise TypeError(f"{config.__name__}.kind needs a default: the kind's name")
    if kind in _KINDS:
        raise ValueError(f"stage kind {kind!r} is registered twice ({_KINDS[kind].config.__name__}, {config.__name__})")
    _KINDS[kind] = StageKind(kind, config, run)
    return _KINDS[kind]


def stage_kind(kind: str) -> StageKind | None:
    """The registered kind `kind`, or None."""
    return _KINDS.get(kind)


_LISTED_FIRST = ("collect", "sft", "rft", "dpo", "grpo", "envtune", "eval")
"""The order messages list kinds in (design.md §7, a pipeline's order); other kinds follow by name."""


def stage_kinds() -> tuple[str, ...]:
    """Every registered kind: those of design.md §7 in pipeline order, then the others by name."""
    return tuple(sorted(_KINDS, key=lambda k: (_LISTED_FIRST.index(k) if k in _LISTED_FIRST else len(_LISTED_FIRST), k)))
