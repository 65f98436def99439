"""DPO stage: preference-tune a causal LM on round-wise pairs with TRL's `DPOTrainer`.

Read top to bottom, one call of `run_dpo` does:
  1. read the pairs (`turnforge.data.dpo_pairs.load_pairs`: the seed schema or TRL's, from JSONL, parquet, a
     dataset folder or `hf:NAME`), keep the last `window` turns of each history, and write them as TRL's
     conversational preference rows: `prompt` (the history), `chosen` / `rejected` (one assistant message);
  2. load the start model — an SFT-merged model, or a base + SFT adapter that is merged first — and give TRL a
     fresh LoRA `peft_config`: the reference policy is the same model with the adapter disabled (TRL's PEFT path),
     so no second copy of the weights is held;
  3. train with `DPOTrainer` (sigmoid loss, `beta`): TRL renders prompt and prompt+reply with the chat template
     and puts the loss on the reply's tokens only — the next turn, never the history;
  4. write `out_dir/model/` (merged, or the adapter with `merge = false`) and `out_dir/metrics.jsonl` (one line
     per logging step with `loss`, `rewards/chosen`, `rewards/rejected`, `rewards/margins`, `rewards/accuracies`).

How it departs from the seed (kuririrn/qwen3-4b-agent-trajectory_dpo_v1, Unsloth + TRL): plain TRL + PEFT, no
Unsloth kernels; the seed's numbers (r 64, alpha 128, dropout 0, lr 8e-7, 1 epoch, max length 2048) are in
`recipes/alfworld_dpo.toml`, the defaults here suit the tiny model on a CPU.

    turnforge run alfworld_dpo --out runs/alf-dpo
    python -c "from pathlib import Path; from turnforge.train.dpo import DPOSettings, run_dpo; \
print(run_dpo('tiny', ['runs/alf-dpo/stages/04-dpo/pairs.jsonl'], Path('runs/dpo'), DPOSettings(max_steps=10)))"
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from trl import DPOConfig, DPOTrainer

from turnforge.data.dpo_pairs import Pair, load_pairs
from turnforge.models import LoraSpec, load_model, merge_and_save, resolve_model
from turnforge.models.chat import window_messages
from turnforge.train.sft import (
    CHECKPOINT_DIR,
    METRICS_FILE,
    MODEL_DIR,
    REPORT_TO,
    MetricsFileCallback,
    resume_point,
    runtime_args,
    training_dtype,
)

logger = logging.getLogger(__name__)

LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust", "apo_zero", "apo_down", "sigmoid_norm")


def _default_lora() -> LoraSpec:
    return LoraSpec(r=16, alpha=32, dropout=0.0)


@dataclass
class DPOSettings:
    """Everything the DPO training can be told. The defaults run on a laptop CPU with the tiny model."""

    epochs: float = 1.0
    """Passes over the pairs (fractions allowed); ignored when `max_steps` > 0."""
    max_steps: int = -1
    """Optimizer steps to run; -1 = as many as `epochs` takes."""
    learning_rate: float = 5e-4
    """Peak learning rate (AdamW). 5e-4 moves the tiny model's LoRA; the seed used 8e-7 on Qwen3-4B."""
    beta: float = 0.1
    """DPO temperature: how far the policy may drift from the reference (TRL `beta`; the Iron Guard seed: 0.1)."""
    loss_type: str = "sigmoid"
    """TRL loss: sigmoid (the DPO paper's), ipo, hinge, robust, apo_zero, apo_down, sigmoid_norm."""
    batch_size: int = 4
    """Pairs per device per micro-batch (each pair is two sequences)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    max_length: int = 1024
    """Tokens of prompt + reply; longer sequences are cut at the end, pairs whose prompt alone fills it are dropped."""
    window: int | None = None
    """Keep only the last `window` assistant turns of each history (as the SFT stage and the rollouts do); None = all."""
    lora: LoraSpec | None = field(default_factory=_default_lora)
    """The LoRA adapter to train (reference = adapter disabled); None = full fine-tuning against a frozen copy."""
    merge: bool = True
    """With LoRA: merge the adapter into `out_dir/model` (True) or save the adapter only (False)."""
    warmup_ratio: float = 0.0
    """Fraction of the steps spent warming the learning rate up linearly from 0, in [0, 1)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_scheduler: str = "linear"
    """Learning-rate schedule after warmup (a transformers `lr_scheduler_type`)."""
    logging_steps: int = 10
    """Optimizer steps between two lines of `metrics.jsonl`."""
    save_steps: int = 0
    """Optimizer steps between checkpoints in `out_dir/checkpoints` (a rerun resumes from the last); 0 = none."""
    report_to: str = "none"
    """Where training curves also go: none, tensorboard or wandb."""
    seed: int = 0
    """Seed of the pair order and of the LoRA initialisation."""
    max_pairs: int | None = None
    """Train on the first N pairs only (in input order)."""

    def __post_init__(self) -> None:
        for name, ok, expected in (
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("grad_accum", self.grad_accum >= 1, "at least 1"),
            ("max_length", self.max_length >= 2, "at least 2"),
            ("logging_steps", self.logging_steps >= 1, "at least 1"),
            ("max_steps", self.max_steps == -1 or self.max_steps >= 1, "-1 (run `epochs`) or at least 1"),
            ("epochs", self.max_steps != -1 or self.epochs > 0, "more than 0 when max_steps is -1"),
            ("beta", self.beta > 0, "more than 0"),
            ("loss_type", self.loss_type in LOSS_TYPES, " or ".join(LOSS_TYPES)),
            ("warmup_ratio", 0.0 <= self.warmup_ratio < 1.0, "a fraction in [0, 1)"),
            ("save_steps", self.save_steps >= 0, "0 (no checkpoints) or more"),
            ("report_to", self.report_to in REPORT_TO, " or ".join(REPORT_TO)),
            ("window", self.window is None or self.window >= 1, "None (all) or at least 1"),
            ("max_pairs", self.max_pairs is None or self.max_pairs >= 1, "None (all) or at least 1"),
        ):
            if not ok:
                raise ValueError(f"dpo setting {name}={getattr(self, name)!r}: expected {expected}")


def preference_dataset(pairs: list[Pair], settings: DPOSettings) -> datasets.Dataset:
    """TRL's conversational preference rows of `pairs` (histories windowed), the first `max_pairs` of them."""
    if not pairs:
        raise ValueError("dpo has no pairs to train on: mine some from rollouts or give a pair dataset")
    pairs = pairs[: settings.max_pairs] if settings.max_pairs else pairs
    keep = (lambda messages: window_messages(messages, settings.window)) if settings.window else None
    return datasets.Dataset.from_list([p.to_trl(keep) for p in pairs])


def dpo_config(out_dir: Path, settings: DPOSettings) -> DPOConfig:
    """TRL's config for `settings`, with the same device and precision choices as the SFT stage."""
    return DPOConfig(
        output_dir=str(out_dir / CHECKPOINT_DIR),
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        beta=settings.beta,
        loss_type=[settings.loss_type],
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        max_length=settings.max_length,
        warmup_steps=settings.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the total steps
        weight_decay=settings.weight_decay,
        lr_scheduler_type=settings.lr_scheduler,
        logging_steps=settings.logging_steps,
        save_strategy="steps" if settings.save_steps > 0 else "no",
        save_steps=settings.save_steps or 500,
        save_total_limit=2,
        report_to=[] if settings.report_to == "none" else [settings.report_to],
        seed=settings.seed,
        **runtime_args(),
    )


def build_trainer(lm, tokenizer, dataset: datasets.Dataset, out_dir: Path, settings: DPOSettings) -> DPOTrainer:
    """A `DPOTrainer` on preference rows; with LoRA its reference is the model with the adapter disabled."""
    return DPOTrainer(
        model=lm,
        args=dpo_config(out_dir, settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=settings.lora.to_peft() if settings.lora is not None else None,
        callbacks=[MetricsFileCallback(out_dir / METRICS_FILE)],
    )


def _start_model(model: str, adapter: str | None, out_dir: Path, settings: DPOSettings):
    """The model DPO starts from, with any SFT adapter merged into it (the seed's "SFT-merged" start)."""
    path = resolve_model(model, out_dir / "cache")
    lm, tokenizer = load_model(path, dtype=training_dtype(settings.lora), device="cpu", adapter=adapter)
    if adapter is not None:
        lm = lm.merge_and_unload()
    return lm, tokenizer


def run_dpo(model: str, data: list[str], out_dir: Path, settings: DPOSettings, adapter: str | None = None) -> dict:
    """DPO-train `model` (+ merged `adapter`) on the pairs in `data`; writes `out_dir/model` and `metrics.jsonl`.

    Returns a summary: `train_loss`, `steps`, `pairs` (trained on), `dropped_too_long`, `by_reason`, the first
    and last logged `rewards/margins`, and `wall_s`. A rerun resumes from the last checkpoint (with `save_steps`).
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = [p for source in data for p in load_pairs(source)]
    dataset = preference_dataset(pairs, settings)
    lm, tokenizer = _start_model(model, adapter, out_dir, settings)

    resume = resume_point(out_dir)
    trainer = build_trainer(lm, tokenizer, dataset, out_dir, settings)
    dropped = len(dataset) - len(trainer.train_dataset)
    if dropped:
        logger.warning("dpo: %d pairs dropped, their prompt alone fills max_length=%d", dropped, settings.max_length)
    result = trainer.train(resume_from_checkpoint=resume)

    model_dir = out_dir / MODEL_DIR
    if settings.lora is not None and not settings.merge:
        trainer.save_model(str(model_dir))
    elif trainer.is_world_process_zero():
        merge_and_save(trainer.model, tokenizer, model_dir)
    margins = [h["rewards/margins"] for h in trainer.state.log_history if "rewards/margins" in h]
    used = pairs[: len(dataset)]
    return {
        "train_loss": float(result.training_loss),
        "steps": int(result.global_step),
        "pairs": len(trainer.train_dataset),
        "dropped_too_long": dropped,
        "by_reason": dict(Counter(p.reason for p in used)),
        "margin_first": margins[0] if margins else None,
        "margin_last": margins[-1] if margins else None,
        "wall_s": round(time.perf_counter() - start, 3),
    }
