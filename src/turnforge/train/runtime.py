"""What the SFT, DPO and GRPO wrappers share around their TRL trainer: the run-time config fields, the training
dtype, the `metrics.jsonl` callback, resuming from a checkpoint, and saving the model (merged or the adapter).

    out_dir/checkpoints/   TRL's checkpoints (`save_steps` > 0): a rerun resumes from the last (`resume_point`)
    out_dir/metrics.jsonl  one JSON line per logging step, flushed as written (`MetricsFileCallback`)
    out_dir/model/         the trained model: merged, or the LoRA adapter with `merge = false` (`save_trained`)
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, TrainerCallback
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import SFTConfig

from turnforge.launch import is_main_process, launched, wait_for_everyone
from turnforge.models import LoraSpec, merge_and_save
from turnforge.train.settings import CHECKPOINT_DIR, METRICS_FILE, MODEL_DIR

logger = logging.getLogger(__name__)

__all__ = ["CHECKPOINT_DIR", "METRICS_FILE", "MODEL_DIR", "MetricsFileCallback",
           "checkpointing_on", "expanded_cache", "last_complete_checkpoint",
           "resume_point", "runtime_args", "save_trained", "training_dtype", "trl_config", "cpu_bf16_args"]
# transformers 5.x renamed `gradient_checkpointing` to `activation_checkpointing` (the old name warns).
CHECKPOINTING_FIELD = next(
    name for name in ("activation_checkpointing", "gradient_checkpointing") if name in SFTConfig.__dataclass_fields__
)


def checkpointing_on(model) -> bool:
    """Whether activation checkpointing is on for `model`, a PEFT wrapper's too (transformers 5.x renamed the
    property as well)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        value = getattr(model, name, None)  # PeftModel passes unknown attributes on to the model it wraps
        if value is not None:
            return bool(value)
    return False


def runtime_args() -> dict[str, Any]:
    """The TRL config fields every turnforge trainer (SFT, DPO, GRPO) sets the same way for this machine.

    A stage's `trl` table may override them (e.g. `trl = { bf16 = false }`)."""
    on_gpu = torch.cuda.is_available()
    return {
        # TRL defaults bf16=True; CPUs (and pre-Ampere GPUs) train in float32.
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
        "use_cpu": not on_gpu,
        "dataloader_num_workers": 0,
        "disable_tqdm": not sys.stderr.isatty(),  # a progress bar per step floods logs and CI output
        # TRL turns gradient checkpointing on; on CPU the models are small and the ~20% recompute is pure loss.
        CHECKPOINTING_FIELD: on_gpu,
    }


def trl_config(config_cls: type, out_dir: Path, settings: Any) -> Any:
    """TRL's config for `settings`: run-time fields < the settings' own fields (`trl_kwargs`) < its `trl` table."""
    args = {**runtime_args(), **settings.trl_kwargs(), **settings.trl}
    if args.get("bf16") and not torch.cuda.is_available():
        args = cpu_bf16_args(args)
    return config_cls(output_dir=str(Path(out_dir) / CHECKPOINT_DIR), **args)


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN computes bf16 natively on this CPU (AMX or AVX512-BF16)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


CPU_BF16_PAD = 128
"""Sequence lengths are padded to a multiple of this when training autocasts to bf16 on a CPU."""


def cpu_bf16_args(args: dict[str, Any]) -> dict[str, Any]:
    """`bf16 = true` on a CPU: bf16 autocast where the CPU computes bf16 natively (AMX / AVX512-BF16; ~1.5x faster
    steps on the quickstart model), float32 with a warning where it would only be emulated (several times slower).

    Padding to `CPU_BF16_PAD`: oneDNN builds and caches a bf16 kernel per input shape, so unpadded batches of
    varying length re-build kernels every step and grow the process by ~50 MB a step (measured: 3 GB in 40 steps)."""
    if not cpu_has_native_bf16():
        logger.warning("bf16 asked for, but this CPU has no native bf16 (AMX / AVX512-BF16): training in float32, "
                       "several times slower (the quickstart's SFT: 1,544 s on a 2-core AVX2 CPU, 428 s with AVX512-BF16)")
        return {**args, "bf16": False}
    return {"pad_to_multiple_of": CPU_BF16_PAD, **args}


CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
"""What transformers calls a forward pass's key/value cache, as the model's argument and in its output: `cache` in
5.24 (.venv), `past_key_values` in 5.19 (.venv-vllm: vLLM's CPU build needs transformers below 5.20)."""


def forward_cache(output) -> DynamicCache:
    """The key/value cache a forward pass with `use_cache=True` returned (`CACHE_FIELD`)."""
    return getattr(output, CACHE_FIELD)


def expanded_cache(prefix, rows: int, config) -> DynamicCache:
    """The keys/values of a prefix run once (one row), expanded (not copied) to `rows` rows that continue it: the
    rows attend to the prefix as a generation step would, and backward sums their gradients into its one run."""
    cache = DynamicCache(config=config)
    for index, layer in enumerate(prefix.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), index)
    return cache


def training_dtype(lora: LoraSpec | None) -> str:
    """Full fine-tuning keeps float32 master weights (bf16 autocast on GPU, like TRL's own loading); LoRA freezes
    the base, so a bf16 copy halves its memory while the adapter trains in float32 (PEFT upcasts it)."""
    on_gpu = torch.cuda.is_available()
    return "bfloat16" if on_gpu and lora is not None and torch.cuda.is_bf16_supported() else "float32"


class MetricsFileCallback(TrainerCallback):
    """Appends each training log (a dict with `loss`) to a JSONL file as one line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The end-of-training summary (train_loss, train_runtime) has no `loss`; the run functions return it.
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        line = {"step": state.global_step, **logs}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=float) + "\n")
            f.flush()


def resume_point(out_dir: Path, also_reset: tuple[str, ...] = ()) -> str | None:
    """The last checkpoint of an interrupted run, keeping metrics.jsonl consistent with it (else starting it anew).

    Without a checkpoint, metrics.jsonl and the files named in `also_reset` (e.g. GRPO's rollouts.jsonl) are
    removed: the run starts from step 0 again. Under `accelerate launch` the main process edits the files."""
    checkpoints = out_dir / CHECKPOINT_DIR
    last = last_complete_checkpoint(checkpoints)
    metrics = out_dir / METRICS_FILE
    if not is_main_process():
        return last
    if last is None:
        for name in (METRICS_FILE, *also_reset):
            (out_dir / name).unlink(missing_ok=True)
        return None
    # Steps logged after the checkpoint will be logged again when they are redone.
    step = int(Path(last).name.split("-")[-1])
    if metrics.exists():
        lines = metrics.read_text(encoding="utf-8").splitlines()
        kept = [ln for ln in lines if (logged := _line_step(ln)) is not None and logged <= step]
        metrics.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    logger.info("resuming from %s", last)
    return last


def last_complete_checkpoint(checkpoints: Path) -> str | None:
    """The newest `checkpoint-N` folder whose trainer_state.json reads: the Trainer writes that file after the
    weights, optimizer and RNG state, so a run killed while saving leaves a folder without it (or with it cut
    short), which `get_last_checkpoint` would still pick."""
    # By hand: transformers' get_last_checkpoint picks the highest step folder whatever it holds.
    found = []
    for folder in checkpoints.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if checkpoints.is_dir() else ():
        step = folder.name.rsplit("-", 1)[-1]
        if folder.is_dir() and step.isdigit():
            found.append((int(step), folder))
    for _, folder in sorted(found, reverse=True):
        try:
            json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            logger.warning("checkpoint %s was not finished (killed while saving?): not resumed from", folder)
            continue
        return str(folder)
    return None


def _line_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a kill


def save_trained(trainer: Any, tokenizer: Any, out_dir: Path, lora: LoraSpec | None, merge: bool) -> Path:
    """Write `out_dir/model`: the LoRA adapter alone (`merge = false`), else the merged (or fully trained) model."""
    model_dir = out_dir / MODEL_DIR
    # FSDP and DeepSpeed ZeRO shard the weights: TRL's save_model gathers them (every process takes part).
    sharded = getattr(trainer, "is_fsdp_enabled", False) or getattr(trainer, "is_deepspeed_enabled", False)
    if (lora is not None and not merge) or (lora is None and sharded):
        trainer.save_model(str(model_dir))  # the adapter (adapter_config.json + weights) and the tokenizer
    elif trainer.is_world_process_zero():  # under `accelerate launch`, one process writes
        merge_and_save(trainer.model, tokenizer, model_dir)
    wait_for_everyone()  # no process reads the model (the next stage, phase) before it is written
    return model_dir


def train_loss(result: Any) -> float:
    """TRL's `training_loss`, the mean over the processes under `accelerate launch`: transformers gathers the loss
    only at logging steps and adds the steps after the last one from each process's own losses, so each process
    reports another value (measured: RFT's 2 steps with no logging step, 4.16 on the main process vs 4.85 in one
    process over the same global batch; per step the logged losses agreed). The processes' mean is the one-process
    figure (their gathered parts are equal, and the mean of their own parts is the gathered value)."""
    loss = float(result.training_loss)
    if not launched():
        return loss
    from accelerate.utils import gather_object

    losses = gather_object([loss])
    return sum(losses) / len(losses)

