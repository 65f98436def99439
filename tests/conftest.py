"""Shared fixtures. The tiny model is built once per test session, offline, into a temporary folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def one_cpu_thread_count_per_test():
    """The OpenMP thread count follows the cores other processes leave free (`turnforge.machine.CpuThreads`); a test
    compares computations for exact equality, which another count may round differently, so it holds one count."""
    from turnforge.machine import held_cpu_threads

    with held_cpu_threads():
        yield


@pytest.fixture(scope="session")
def build_tiny(tmp_path_factory: pytest.TempPathFactory):
    """`build_tiny_model` that builds each tiny model (envs, size, seed, family) once per session and copies it where it
    is asked for: dozens of in-process runs and fixtures each built theirs (3.5-9 s apiece on 2 cores), and a build is
    deterministic (test_tiny_model.py builds twice and compares)."""
    import turnforge.tiny_model as tiny

    original, cache, built = tiny.build_tiny_model, tmp_path_factory.mktemp("tiny-builds"), {}

    def build_once(out_dir, envs=tiny.HOUSEHOLD, size="tiny", seed=0, family="qwen3") -> Path:
        key = json.dumps([[list(pair) for pair in envs], size, seed, family], sort_keys=True, default=str)
        if key not in built:
            built[key] = original(cache / str(len(built)), envs, size, seed, family)
        out_dir = Path(out_dir)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(built[key], out_dir)
        return out_dir

    return build_once


@pytest.fixture(scope="session", autouse=True)
def tiny_models_built_once(build_tiny):
    """Recipes, evals and servers resolve `tiny[:FAMILY]` (`resolve_model`) through `build_tiny`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("turnforge.tiny_model.build_tiny_model", build_tiny)
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(build_tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 (random weights, household tokenizer, Qwen3-4B-Instruct-2507 chat template); do not modify."""
    return build_tiny(tmp_path_factory.mktemp("models") / "tiny")


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


QUICKSTART_BUDGET = [
    "stages.collect.tasks=12",
    "stages.sft.max_steps=2",
    "stages.sft.batch_size=4",
    "stages.sft.logging_steps=1",
    *(
        f"stages.{e}.{k}"
        for e in ("base", "eval-sft", "eval-rft", "eval-grpo")
        for k in ("tasks=6", "max_turns=3", "max_new_tokens=16")
    ),
    *(f"stages.rft.{k}" for k in ("tasks=3", "samples=2", "max_turns=3", "max_new_tokens=16")),
    *(f"stages.grpo.{k}" for k in ("steps=1", "tasks_per_step=2", "num_generations=2", "max_turns=3",
                                   "max_new_tokens=16")),
]
"""The quickstart on a tiny budget (~1 min on 2 cores): every stage kind of it runs, for a real run directory."""


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """(run directory, summary) of the quickstart on `QUICKSTART_BUDGET`, run once per session; do not modify
    (re-running it, which skips every stage, is fine)."""
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    out = tmp_path_factory.mktemp("quickstart") / "qs"
    summary = run_recipe(load_recipe("quickstart", overrides=QUICKSTART_BUDGET), out, console=Console(quiet=True))
    return out, summary


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter (r 4 on q_proj, v_proj) with random non-zero weights on the tiny model: it changes what the
    model writes. Do not modify."""
    import torch
    from peft import LoraConfig, get_peft_model

    from turnforge.models.loading import load_model

    torch.manual_seed(0)
    model, _ = load_model(str(tiny_model_dir), device="cpu")
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    out = tmp_path_factory.mktemp("adapter") / "lora"
    lora.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vllm_with_adapter(tiny_model_dir: Path, tiny_adapter_dir: Path):
    """`--policy vllm` on the tiny model with `tiny_adapter_dir` served on it: vLLM's engine in this process, one per
    session (it takes ~1 min to start on 2 cores); `VLLMPolicy.from_llm(p.llm, p.tokenizer)` is the base model on
    the same engine. vLLM tests only (tests/vllm_engines.py)."""
    from turnforge.policies.vllm import VLLMPolicy
    from vllm_engines import TEST_ENGINE

    policy = VLLMPolicy(str(tiny_model_dir), adapter=str(tiny_adapter_dir), max_lora_rank=8, **TEST_ENGINE)
    yield policy
    policy.llm.llm_engine.engine_core.shutdown()
