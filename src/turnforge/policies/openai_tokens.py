"""Token-exact requests to an OpenAI-compatible server: `openai:URL` with a tokenizer (`--tokenizer PATH_OR_ID`).

Through chat completions the server renders each prompt from the messages, so from an episode's second turn on it
re-tokenizes the replies the model wrote, and the tokenizer may split their text into other ids than the model
sampled (the untrained tiny model's runs of newlines do): the model then reads another prompt than an in-process
backend gives it, and a greedy episode drifts from the hf policy's (0 of 10 equal from turn 2, issue 60).

With the served model's tokenizer the policy renders the prompts here instead, as the hf and vllm policies do
(`Prompt.ids`: each turn extends the last one's exact ids, the model's own reply ids included), and sends the ids
as `prompt` to `/v1/completions` (OpenAI's legacy completions take token ids; so do vLLM and SGLang). The reply
comes back as ids (vLLM's `return_token_ids`) and is cut at the first end-of-turn id or stop string exactly as in
process (`finish_generation`), so a greedy episode through `vllm serve` is the in-process engine's, token for token,
and its prompt ids are recorded (a token-exact episode, fit for training data).

    .venv-vllm/bin/vllm serve MODEL --dtype float32 --kv-cache-memory-bytes 2G
    turnforge eval --env household --policy openai:http://127.0.0.1:8000/v1 --tokenizer MODEL --out runs/via-vllm
"""

from __future__ import annotations

from typing import Any

from turnforge.policies.base import BackendError, Generation, Prompt, SamplingParams, explores, prompt_ids


class TokenPrompts:
    """What the openai policy sends and reads in token mode: a `/v1/completions` body with the rendered prompt's ids,
    and the reply's ids cut as the in-process backends cut theirs."""

    def __init__(self, tokenizer: str):
        from transformers import AutoTokenizer

        from turnforge.formats.chat_template import chat_renderer
        from turnforge.models.loading import check_model_folder
        from turnforge.policies.vllm import generation_config, stop_ids_of  # neither imports vllm

        check_model_folder(tokenizer)  # a missing local folder is refused before the Hub is asked
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        except OSError as e:  # transformers' "not found" (locally and on the Hub, or no network)
            raise FileNotFoundError(f"--tokenizer {tokenizer}: cannot load a tokenizer there ({e}); give the served "
                                    "model's folder or Hub id") from None
        self.renderer = chat_renderer(self.tokenizer)
        self.stop_ids = stop_ids_of(self.tokenizer, generation_config(tokenizer))

    def body(self, prompt: Prompt, params: SamplingParams, model: str, seed: int) -> dict[str, Any]:
        """The `/v1/completions` request of one prompt (OpenAI's fields; vLLM's extensions: `extensions`)."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids(prompt, self.renderer),
            "temperature": params.temperature if explores(params, prompt) else 0.0,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "seed": seed,
            "logprobs": 0,  # the sampled token's log-probability only
        }
        if params.stop:
            body["stop"] = list(params.stop)
        return body

    def extensions(self, params: SamplingParams) -> dict[str, Any]:
        """vLLM's sampling extensions that make the reply the in-process one: its ids, the model's end-of-turn ids as
        stops, special tokens and stop strings kept in the text (as the hf and vllm policies keep them)."""
        extra: dict[str, Any] = {"return_token_ids": True, "stop_token_ids": self.stop_ids,
                                 "skip_special_tokens": False, "include_stop_str_in_output": True}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        return extra

    def generation(self, choice: dict[str, Any], params: SamplingParams, url: str) -> Generation:
        """The reply of one `/v1/completions` choice: its ids cut at the first stop (`finish_generation`)."""
        from turnforge.policies.hf import finish_generation

        if choice.get("token_ids") is None:
            raise BackendError(f"{url} returned no token ids for a token-id prompt (vLLM's `return_token_ids`): "
                               "--tokenizer needs a server that returns them (vllm serve); without --tokenizer the "
                               "server renders the chat itself")
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) if x is not None else 0.0
                    for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
        logprobs += [0.0] * (len(ids) - len(logprobs))
        return finish_generation(ids, logprobs, self.stop_ids, params.stop, self.tokenizer)
