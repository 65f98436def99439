"""Shared fixtures. The tiny model is built once per test session, offline, into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 (random weights, household tokenizer, Qwen3-4B-Instruct-2507 chat template); do not modify."""
    from turnforge.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
