"""Pipeline stages: one module per `[[stages]]` kind, each holding its typed config and its `run()`, and
registering both once (`turnforge.stages.registry.register_stage`).

    collect.py  rollouts whose episodes become training data       eval.py     an evaluation (eval/<name>/)
    sft.py      supervised fine-tuning                             dpo.py      DPO on mined round-wise pairs
    rft.py      rejection fine-tuning (sample, keep, SFT)          grpo.py     multi-turn GRPO
    envtune.py  Environment Tuning: GRPO through phases

A new kind is one new file here ending with `register_stage(Config, run)`: every module of this package but
the shared ones (`SHARED_MODULES`) is imported below, in name order, and registers its kind.
"""

from __future__ import annotations

import importlib
import pkgutil

from turnforge.stages.context import ModelRef, RunContext, stage_folder
from turnforge.stages.eval import EVAL_DIR
from turnforge.stages.registry import StageKind, StageRunner, register_stage, stage_kind, stage_kinds

SHARED_MODULES = frozenset({"config", "context", "registry"})
"""Modules of this package that are no stage kind (the config bases, the run context, the registry)."""

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module not in SHARED_MODULES:
        importlib.import_module(f"{__name__}.{_module}")

__all__ = [
    "EVAL_DIR",
    "ModelRef",
    "RunContext",
    "StageKind",
    "StageRunner",
    "register_stage",
    "stage_folder",
    "stage_kind",
    "stage_kinds",
]
