"""The vllm policy with a stand-in engine (no GPU, no vLLM): what it hands the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from turnforge.policies.base import CONTEXT_LENGTH, VLLM_INSTALL, Prompt, SamplingParams
from turnforge.policies.vllm import VLLMPolicy
from turnforge.types import Task


class StandInLLM:
    """`vllm.LLM`'s surface the policy uses: its engine's max_model_len and model, and `generate` (an empty reply
    but the end-of-turn token), which records the prompts it was given."""

    def __init__(self, model: str, max_model_len: int, eos: int):
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len, model=model))
        self.eos, self.prompts = eos, []

    def generate(self, inputs, sampling, **_):
        self.prompts += [i["prompt_token_ids"] for i in inputs]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[self.eos], logprobs=None)]) for _ in inputs]


def test_a_prompt_past_max_model_len_is_refused_before_the_engine(tiny_model_dir, monkeypatch):
    """Issue 40 (9): vLLM's engine raises on a prompt past max_model_len (every episode of the call fails with it)
    and cuts a reply at it; the policy refuses such a prompt by the rule every backend shares (`context_refusal`)."""
    fake = SimpleNamespace(inputs=SimpleNamespace(TokensPrompt=lambda prompt_token_ids: {"prompt_token_ids":
                                                                                         prompt_token_ids}),
                           SamplingParams=lambda **kw: kw)
    monkeypatch.setattr("turnforge.policies.vllm.import_vllm", lambda: fake)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    llm = StandInLLM(str(tiny_model_dir), max_model_len=50, eos=tokenizer.eos_token_id)
    policy = VLLMPolicy.from_llm(llm, tokenizer)
    task = Task("t", "household", "test", "c")
    short, long = (Prompt(messages=[], task=task, sample=s, turn=0, ids=[7] * n) for s, n in ((0, 42), (1, 43)))
    with pytest.warns(RuntimeWarning, match="maximum context length is 50 tokens; the messages take 43 and max_tokens is 8"):
        replies = policy.generate([long, short], SamplingParams(max_new_tokens=8))
    assert [r.finish_reason for r in replies] == [CONTEXT_LENGTH, "stop"] and llm.prompts == [[7] * 42]


def test_a_missing_vllm_is_said_in_one_line_before_the_tiny_model_is_built(tmp_path, monkeypatch):
    """Issue 60: `--policy vllm --model tiny` without vLLM built the tiny model (~30 s) before saying so."""
    import importlib.util

    from typer.testing import CliRunner

    from turnforge.cli import app

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    out = tmp_path / "e"
    result = CliRunner().invoke(app, ["eval", "--env", "household", "--policy", "vllm", "--model", "tiny", "--tasks",
                                      "1", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.strip()] == [f"error: {VLLM_INSTALL}"]
    assert not (out / "models").exists()


@pytest.mark.vllm
def test_vllms_cpu_build_from_a_path_with_a_space_is_one_line(monkeypatch):
    """vLLM LD_PRELOADs torch's libgomp from the environment's path (a space-separated list) and torch's C++ compile
    splits it: every engine died at start under "/tmp/ci6/a dir/main". Now the start is refused in one line."""
    import sys

    pytest.importorskip("vllm")
    from turnforge.policies.vllm import import_vllm

    monkeypatch.setattr(sys, "prefix", "/tmp/a dir/main/.venv-vllm")
    with pytest.raises(ValueError, match=r"cannot run from '/tmp/a dir/main/.venv-vllm': the path has a space"):
        import_vllm()
