"""GRPO with vLLM for real: `use_vllm = true` in TRL's colocate mode on vLLM's CPU build (issue 52, requirement 4).

TRL builds the engine (`vllm_mode = "colocate"`: `vllm.LLM` in the trainer's process, its `external_launcher`
executor), syncs the trained weights into it before each generation batch (`VLLMGeneration.sync_weights`), and
turnforge's rollout function plays the episodes on it (`VLLMPolicy.from_llm`). On vLLM's CPU backend that sync goes
through vLLM's in-place reload (`trl_internals.reload_colocated_weights_on_cpu`: TRL's own write fails there). Two
steps on the tiny model change every parameter, and before each batch a fixed token sequence is scored both by the
engine (`prompt_logprobs`) and by the trained model: after step 1 the engine's log-probabilities have moved, to the
trained model's.

Server mode (`trl vllm-serve`): see test_trl_vllm_serve_cannot_sync_weights_without_cuda and docs/decisions.md.

    .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_grpo.py
"""

from __future__ import annotations

import json

import pytest
import torch

from turnforge.envs.base import load_tasks
from turnforge.models import load_model
from turnforge.policies.teacher import VLLMTeacher, token_logprobs
from turnforge.train.grpo import EpisodeRollouts, train_on_episodes
from turnforge.train.grpo_trainer import EpisodeGRPOTrainer
from turnforge.train.settings import ROLLOUTS_FILE, GRPOSettings
from vllm_engines import colocate_memory_share, needs_vllm_engine

pytestmark = [pytest.mark.vllm, needs_vllm_engine]

ENV_OPTIONS = {"format": "act_line", "max_steps": 3}
BF16_TOL = 0.05
"""TRL builds the colocated engine with vLLM's `dtype="auto"`, which runs a float32 checkpoint in bfloat16: the
engine's and the trainer's log-probabilities of the same tokens are that far apart (measured: 0.011)."""


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


class ProbedRollouts(EpisodeRollouts):
    """The rollout function, which first scores `probe` with TRL's vLLM engine and with the model being trained."""

    def __init__(self, *args, probe: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.probe, self.scores = probe, []

    def __call__(self, prompts, trainer):
        engine = VLLMTeacher.from_llm(trainer.vllm_generation.llm).score([self.probe], [1])[0]
        model = trainer.accelerator.unwrap_model(trainer.model)
        trained = token_logprobs(model, [self.probe], [1])[0]
        self.scores.append((engine, trained))
        return super().__call__(prompts, trainer)


def test_two_colocated_vllm_grpo_steps_train_and_the_engine_generates_with_the_trained_weights(
        household_sft_model_dir, tmp_path):
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    settings = GRPOSettings(
        steps=2, tasks_per_step=2, num_generations=4, max_new_tokens=12, learning_rate=1e-2,
        rewards={"outcome": 1.0, "format": 1.0, "tool_call": 1.0}, use_vllm=True,
        trl={"vllm_mode": "colocate", "vllm_gpu_memory_utilization": colocate_memory_share()},
    )
    _, tokenizer = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    probe = tokenizer("ACTION: go to countertop 1\nACTION: take mug 1 from countertop 1")["input_ids"]
    made: list[ProbedRollouts] = []

    def rollouts(tok):
        made.append(ProbedRollouts("household", ENV_OPTIONS, tasks, tok, settings, tmp_path / ROLLOUTS_FILE,
                                   probe=probe))
        return made[0]

    result, _ = train_on_episodes("grpo", str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path,
                                  settings, None, EpisodeGRPOTrainer, rollouts)
    assert result.global_step == 2
    before, _ = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    after, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after.named_parameters())
    assert [n for n, p in before.named_parameters() if torch.equal(p, trained[n])] == []
    batches = [json.loads(line) for line in (tmp_path / ROLLOUTS_FILE).read_text().splitlines()]
    assert len(batches) == 2 and all(b["episodes"] == 8 for b in batches)
    (engine_0, model_0), (engine_1, model_1) = made[0].scores
    apart = [gap(engine_0, model_0), gap(engine_1, model_1)]  # the engine in bfloat16, the trainer in float32
    moved = gap(engine_1, engine_0)
    # After step 1 the engine holds the trained weights: its log-probabilities moved, to the trained model's.
    assert max(apart) < BF16_TOL and moved > 10 * max(apart), (apart, moved)


def test_async_grpo_on_the_colocated_engine_trains_within_the_staleness_bound(household_sft_model_dir, tmp_path):
    """max_staleness = 1 with use_vllm (colocate): the worker's groups play on TRL's engine beside training (its calls
    one at a time, `SerialBatches`; TRL's weight sync between two of them), no group is trained more than 1 step
    stale, and TRL's own importance-sampling correction weighs the loss (its metrics are logged)."""
    from turnforge.train.grpo import run_grpo

    tasks = load_tasks("household", "train", limit=8, **ENV_OPTIONS)
    settings = GRPOSettings(
        steps=3, tasks_per_step=2, num_generations=2, max_new_tokens=12, learning_rate=1e-2, max_staleness=1,
        rewards={"outcome": 1.0, "format": 1.0, "tool_call": 1.0}, use_vllm=True,
        trl={"vllm_mode": "colocate", "vllm_gpu_memory_utilization": colocate_memory_share()},
    )
    result = run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 3 and result["episodes"] == 12
    before, _ = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    after, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after.named_parameters())
    assert [n for n, p in before.named_parameters() if torch.equal(p, trained[n])] == []
    batches = [json.loads(line) for line in (tmp_path / ROLLOUTS_FILE).read_text().splitlines()]
    assert [b["step"] for b in batches] == [1, 2, 3]
    assert all(int(age) <= 1 for b in batches for age in b["staleness"])
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("sampling/importance_sampling_ratio/mean" in m for m in metrics)
    assert not any("async/is_ratio_mean" in m for m in metrics)  # TRL's correction, not a second one
