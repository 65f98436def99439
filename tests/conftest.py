"""Shared fixtures. The tiny model is built once per test session, offline, into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 (random weights, household tokenizer, Qwen3-4B-Instruct-2507 chat template); do not modify."""
    from turnforge.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def household_sft_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after 20 SFT steps on 40 expert household episodes: it writes `ACTION:` lines that
    sometimes parse, so sampled episodes differ in reward (what GRPO and RFT tests need). Do not modify."""
    from turnforge.envs.base import load_tasks, make_env
    from turnforge.policies import make_policy
    from turnforge.rollout import run_episodes
    from turnforge.train.sft import SFTSettings, run_sft

    out = tmp_path_factory.mktemp("household_sft")
    tasks = load_tasks("household", "train", limit=40, format="act_line")
    episodes = run_episodes(make_policy("expert"), lambda: make_env("household", format="act_line"), tasks, 1)
    data = out / "expert.jsonl"
    data.write_text("".join(e.to_json() + "\n" for e in episodes), encoding="utf-8")
    settings = SFTSettings(max_steps=20, batch_size=4, learning_rate=5e-3, max_length=512, logging_steps=20)
    run_sft(str(tiny_model_dir), [str(data)], out / "sft", settings)
    return out / "sft" / "model"
