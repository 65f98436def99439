"""SFT stage: fine-tune a causal LM on agent trajectories or chat conversations with TRL's `SFTTrainer`.

Read top to bottom, one call of `run_sft` does:
  1. read the data: trajectory JSONL lines (from `turnforge collect` / `turnforge eval`), conversational
     records (`{"messages": [...], "tools": [...]}`) from JSONL, or a `datasets` dataset (`hf:NAME[:SPLIT]`,
     a `save_to_disk` folder, a local parquet/JSON dataset);
  2. turn each record into `SFTExample`s (`input_ids` + `completion_mask`, 1 on the tokens the assistant
     wrote) with `turnforge.data.sft`: token-exact trajectories keep the exact ids the policy saw,
     conversations are rendered with the model's chat template and masked on assistant turns;
  3. fit them to `max_length` (truncated at the end, like TRL's `keep_start`; an example left with no
     assistant token is skipped), with every dropped or cut example counted and logged;
  4. train with TRL `SFTTrainer(completion_only_loss=True)`: full fine-tuning or LoRA (`peft_config`),
     packing, gradient accumulation, checkpoints, `report_to`;
  5. write `out_dir/model/` (the merged model, or the LoRA adapter, + tokenizer) and
     `out_dir/metrics.jsonl` (one JSON line per logging step, flushed as it is written).

How it departs from plain TRL:
  - The data is tokenized here, not by TRL: TRL receives `{"input_ids", "completion_mask"}` rows, so its
    `completion_only_loss` turns the mask into `-100` labels and the loss is TRL's own (nothing
    reimplemented). Re-tokenizing a trajectory's text could give other ids than the ones the model
    sampled; pre-tokenized rows keep them exact.
  - Over-long examples are cut here, before TRL, because TRL truncates (and drops fully masked rows)
    without saying how many; here the counts are logged and returned.
  - A callback writes `metrics.jsonl`, the run directory's machine-readable training log.
  - Nothing is deduplicated or filtered by success: choosing the trajectories (RFT, successes only) is
    the data stage's job; this stage trains on what it is given.

The command (a recipe stage `kind = "sft"` calls `run_sft`):

    turnforge run recipes/quickstart.toml
    python -c "from pathlib import Path; from turnforge.train.sft import SFTSettings, run_sft; \
print(run_sft('tiny', ['runs/expert/episodes.jsonl'], Path('runs/sft'), SFTSettings(max_steps=20)))"
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import PreTrainedTokenizerBase, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from turnforge.data.sft import SFTExample, conversation_examples, trajectory_examples
from turnforge.models import LoraSpec, load_model, merge_and_save, resolve_model
from turnforge.types import Trajectory

logger = logging.getLogger(__name__)

MODEL_DIR = "model"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
REPORT_TO = ("none", "tensorboard", "wandb")
# A Trajectory JSON line has these keys (types.Trajectory.to_dict); a conversational record has `messages` only.
TRAJECTORY_KEYS = frozenset({"task_id", "turns", "score", "stop_reason"})
JSONL_SUFFIXES = (".jsonl", ".json")
DATASET_SUFFIXES = {".parquet": "parquet"}
# transformers 5.x renamed `gradient_checkpointing` to `activation_checkpointing` (the old name warns).
CHECKPOINTING_FIELD = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in SFTConfig.__dataclass_fields__
)


@dataclass
class SFTSettings:
    """Everything the SFT stage can be told. The defaults run on a laptop CPU with the tiny model."""

    epochs: float = 1.0
    """Passes over the data (fractions allowed); ignored when `max_steps` > 0."""
    max_steps: int = -1
    """Optimizer steps to run; -1 = as many as `epochs` takes."""
    learning_rate: float = 5e-4
    """Peak learning rate (AdamW). 5e-4 suits LoRA and the tiny model; full fine-tuning of a 4B model wants ~1e-5."""
    batch_size: int = 8
    """Sequences (or packed rows) per device per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; effective batch = batch_size x grad_accum x devices."""
    max_length: int = 1024
    """Tokens per example: longer examples are cut at the end (counted and logged); with packing, the row length."""
    packing: bool = False
    """Pack several examples into each `max_length` row (TRL best-fit-decreasing, no cross-example attention)."""
    lora: LoraSpec | None = None
    """LoRA adapter to train (r, alpha, dropout, target modules); None = full fine-tuning."""
    merge: bool = True
    """With LoRA: merge the adapter into the weights of `out_dir/model` (True) or save the adapter only (False)."""
    window: int | None = None
    """Keep only the last `window` assistant turns of each conversation in context (one example per turn); None = all."""
    warmup_ratio: float = 0.0
    """Fraction of the steps spent warming the learning rate up linearly from 0, in [0, 1)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_scheduler: str = "cosine"
    """Learning-rate schedule after warmup (a transformers `lr_scheduler_type`: cosine, linear, constant, ...)."""
    logging_steps: int = 10
    """Optimizer steps between two lines of `metrics.jsonl` (and of tensorboard / wandb)."""
    save_steps: int = 0
    """Optimizer steps between checkpoints in `out_dir/checkpoints` (a rerun resumes from the last); 0 = none."""
    report_to: str = "none"
    """Where training curves also go: none, tensorboard (under out_dir/checkpoints/runs) or wandb."""
    seed: int = 0
    """Seed of the data order and of the LoRA initialisation."""
    max_examples: int | None = None
    """Train on the first N examples only (in input order, after fitting to `max_length`; reading stops there)."""

    def __post_init__(self) -> None:
        for name, ok, expected in (
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("grad_accum", self.grad_accum >= 1, "at least 1"),
            ("max_length", self.max_length >= 1, "at least 1"),
            ("logging_steps", self.logging_steps >= 1, "at least 1"),
            ("max_steps", self.max_steps == -1 or self.max_steps >= 1, "-1 (run `epochs`) or at least 1"),
            ("epochs", self.max_steps != -1 or self.epochs > 0, "more than 0 when max_steps is -1"),
            ("warmup_ratio", 0.0 <= self.warmup_ratio < 1.0, "a fraction in [0, 1)"),
            ("save_steps", self.save_steps >= 0, "0 (no checkpoints) or more"),
            ("report_to", self.report_to in REPORT_TO, " or ".join(REPORT_TO)),
            ("max_examples", self.max_examples is None or self.max_examples >= 1, "None (all) or at least 1"),
        ):
            if not ok:
                raise ValueError(f"sft setting {name}={getattr(self, name)!r}: expected {expected}")


@dataclass
class DataCounts:
    """What happened to the input on its way to the trainer (logged, and returned by `run_sft`)."""

    records: int = 0
    """Trajectory lines / conversational records read."""
    skipped_no_assistant: int = 0
    """Records with no assistant token to learn from."""
    truncated: int = 0
    """Examples cut to `max_length` that kept at least one assistant token."""
    skipped_too_long: int = 0
    """Examples whose assistant tokens all lay past `max_length`."""
    tokens: int = 0
    """Tokens in the examples kept (each example counted once)."""
    by_source: dict[str, int] = field(default_factory=dict)
    """Examples taken from each data source."""


# ---------------------------------------------------------------------------------------------------------------
# 1-3. Data: sources -> records -> SFTExamples -> a `datasets.Dataset` of input_ids + completion_mask


def read_records(source: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield `(where, record)` from one data source; `where` names the file and line (or row) for errors."""
    if source.startswith("hf:"):
        name, _, split = source[3:].partition(":")
        rows = datasets.load_dataset(name, split=split or "train")
        yield from ((f"{source} row {i}", dict(row)) for i, row in enumerate(rows))
        return
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(
            f"sft data {source!r} not found: give a JSONL file, a dataset folder or hf:NAME[:SPLIT]"
        )
    if path.is_dir():
        rows = _dataset_folder(path)
        yield from ((f"{path} row {i}", dict(row)) for i, row in enumerate(rows))
    elif path.suffix in JSONL_SUFFIXES:
        yield from _jsonl_records(path)
    elif path.suffix in DATASET_SUFFIXES:
        rows = datasets.load_dataset(DATASET_SUFFIXES[path.suffix], data_files=str(path), split="train")
        yield from ((f"{path} row {i}", dict(row)) for i, row in enumerate(rows))
    else:
        known = ", ".join([*JSONL_SUFFIXES, *DATASET_SUFFIXES])
        raise ValueError(
            f"sft data {path}: unknown file format {path.suffix!r}; expected one of {known} or a folder"
        )


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{where}: not a JSON line ({e.msg}); sft data files hold one JSON object a line"
                ) from e
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _dataset_folder(path: Path) -> datasets.Dataset:
    """A `save_to_disk` folder (its train split if it holds several), else any folder `load_dataset` reads."""
    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(
                    f"sft data {path}: a DatasetDict without a 'train' split (splits: {list(loaded)})"
                )
            loaded = loaded["train"]
        return loaded
    return datasets.load_dataset(str(path), split="train")


def record_examples(
    where: str, record: dict[str, Any], tokenizer: PreTrainedTokenizerBase, window: int | None
) -> list[SFTExample]:
    """The examples of one record: a Trajectory JSON line or a conversational record (`messages`, `tools`).

    No assistant turn: no example. A record that cannot be read is an error naming `where`.
    """
    try:
        if record.keys() >= TRAJECTORY_KEYS:
            return trajectory_examples(Trajectory.from_dict(record), tokenizer, window=window)
        if "messages" in record:
            messages = [_drop_nulls(m) for m in record["messages"] or []]
            tools = record.get("tools")
            if isinstance(tools, str):  # datasets on the Hub often store the tool schemas as one JSON string
                tools = json.loads(tools) if tools.strip() else None
            return conversation_examples(messages, tools or None, tokenizer, window=window)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: cannot read this record ({type(e).__name__}: {e})") from e
    raise ValueError(
        f"{where}: neither a trajectory (keys {sorted(TRAJECTORY_KEYS)}) nor a conversational record "
        f"('messages'); its keys are {sorted(record)}"
    )


def _drop_nulls(message: dict[str, Any]) -> dict[str, Any]:
    # Arrow gives every message every key of the column (None where absent); chat templates test presence.
    return {k: v for k, v in message.items() if v is not None}


def fit_to_length(example: SFTExample, max_length: int) -> SFTExample | None:
    """Cut `example` to its first `max_length` tokens (TRL's `keep_start`); None when no assistant token is left."""
    if len(example.input_ids) <= max_length:
        return example
    cut = SFTExample(
        input_ids=example.input_ids[:max_length], completion_mask=example.completion_mask[:max_length]
    )
    return cut if any(cut.completion_mask) else None


def source_examples(
    data: list[str], tokenizer: PreTrainedTokenizerBase, window: int | None, counts: DataCounts
) -> Iterator[tuple[str, SFTExample]]:
    """Yield `(source, example)` for every example with an assistant token; count records and skips in `counts`."""
    for source in data:
        counts.by_source.setdefault(source, 0)
        for where, record in read_records(source):
            counts.records += 1
            examples = [
                e for e in record_examples(where, record, tokenizer, window) if any(e.completion_mask)
            ]
            counts.skipped_no_assistant += not examples
            yield from ((source, example) for example in examples)


def build_dataset(
    data: list[str], tokenizer: PreTrainedTokenizerBase, settings: SFTSettings
) -> tuple[datasets.Dataset, DataCounts]:
    """Read every source into one `datasets.Dataset` of `input_ids` + `completion_mask`, counting what was dropped."""
    if not data:
        raise ValueError(
            "sft needs at least one data source (a JSONL file, a dataset folder or hf:NAME[:SPLIT])"
        )
    counts = DataCounts()
    rows: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": []}
    for source, example in source_examples(data, tokenizer, settings.window, counts):
        fitted = fit_to_length(example, settings.max_length)
        if fitted is None:
            counts.skipped_too_long += 1
            continue
        counts.truncated += fitted is not example
        counts.tokens += len(fitted.input_ids)
        counts.by_source[source] += 1
        rows["input_ids"].append(list(fitted.input_ids))
        rows["completion_mask"].append(list(fitted.completion_mask))
        if len(rows["input_ids"]) == settings.max_examples:
            logger.warning("sft data: stopped reading at max_examples=%d", settings.max_examples)
            break
    _log_counts(counts, settings, n_examples=len(rows["input_ids"]))
    if not rows["input_ids"]:
        raise ValueError(
            f"no training examples in {data}: {counts.records} records read, {counts.skipped_no_assistant} without "
            f"an assistant turn, {counts.skipped_too_long} with no assistant token within max_length="
            f"{settings.max_length}"
        )
    return datasets.Dataset.from_dict(rows), counts


def _log_counts(counts: DataCounts, settings: SFTSettings, n_examples: int) -> None:
    logger.info("sft data: %d records -> %d examples %s", counts.records, n_examples, counts.by_source)
    if counts.skipped_no_assistant:
        logger.warning("sft data: skipped %d records with no assistant turn", counts.skipped_no_assistant)
    if counts.truncated or counts.skipped_too_long:
        logger.warning(
            "sft data: %d examples truncated to max_length=%d, %d skipped (no assistant token within it)",
            counts.truncated,
            settings.max_length,
            counts.skipped_too_long,
        )


# ---------------------------------------------------------------------------------------------------------------
# 4. Training: TRL SFTTrainer with a metrics.jsonl callback


class MetricsFileCallback(TrainerCallback):
    """Appends each training log (a dict with `loss`) to a JSONL file as one line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The end-of-training summary (train_loss, train_runtime) has no `loss`; run_sft returns it instead.
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        line = {"step": state.global_step, **logs}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=float) + "\n")
            f.flush()


def training_dtype(lora: LoraSpec | None) -> str:
    """Full fine-tuning keeps float32 master weights (bf16 autocast on GPU, like TRL's own loading); LoRA freezes
    the base, so a bf16 copy halves its memory while the adapter trains in float32 (PEFT upcasts it)."""
    on_gpu = torch.cuda.is_available()
    return "bfloat16" if on_gpu and lora is not None and torch.cuda.is_bf16_supported() else "float32"


def sft_config(out_dir: Path, settings: SFTSettings) -> SFTConfig:
    """TRL's config for `settings`: completion-only loss on the pre-tokenized mask, CPU-safe precision."""
    return SFTConfig(
        output_dir=str(out_dir / CHECKPOINT_DIR),
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps,
        learning_rate=settings.learning_rate,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        max_length=settings.max_length,
        packing=settings.packing,
        completion_only_loss=True,  # labels = input_ids where completion_mask == 1, else -100 (TRL builds them)
        warmup_steps=settings.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the total steps
        weight_decay=settings.weight_decay,
        lr_scheduler_type=settings.lr_scheduler,
        logging_steps=settings.logging_steps,
        save_strategy="steps" if settings.save_steps > 0 else "no",
        save_steps=settings.save_steps or 500,
        save_total_limit=2,  # resuming needs the last checkpoint only; full checkpoints of a 4B model are big
        report_to=[] if settings.report_to == "none" else [settings.report_to],
        seed=settings.seed,
        **runtime_args(),
    )


def runtime_args() -> dict:
    """The TRL config fields every turnforge trainer (SFT, DPO, GRPO) sets the same way for this machine."""
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


def build_trainer(
    model, tokenizer: PreTrainedTokenizerBase, dataset: datasets.Dataset, out_dir: Path, settings: SFTSettings
) -> SFTTrainer:
    """An `SFTTrainer` on a pre-tokenized `input_ids` + `completion_mask` dataset, logging to `metrics.jsonl`."""
    return SFTTrainer(
        model=model,
        args=sft_config(out_dir, settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=settings.lora.to_peft() if settings.lora is not None else None,
        callbacks=[MetricsFileCallback(out_dir / METRICS_FILE)],
    )


def resume_point(out_dir: Path) -> str | None:
    """The last checkpoint of an interrupted run, keeping metrics.jsonl consistent with it (else starting it anew)."""
    checkpoints = out_dir / CHECKPOINT_DIR
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    metrics = out_dir / METRICS_FILE
    if last is None:
        metrics.unlink(missing_ok=True)
        return None
    # Steps logged after the checkpoint will be logged again when they are redone.
    step = int(Path(last).name.split("-")[-1])
    if metrics.exists():
        lines = metrics.read_text(encoding="utf-8").splitlines()
        kept = [ln for ln in lines if (logged := _line_step(ln)) is not None and logged <= step]
        metrics.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    logger.info("sft: resuming from %s", last)
    return last


def _line_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line cut short by a kill


# ---------------------------------------------------------------------------------------------------------------
# 5. The stage


def run_sft(model: str, data: list[str], out_dir: Path, settings: SFTSettings) -> dict:
    """Fine-tune `model` on `data`; writes `out_dir/model/` and `out_dir/metrics.jsonl`; returns a summary.

    `model` is a local path, a Hub id or "tiny". The summary: `train_loss` (mean over the steps this call ran),
    `steps` (the optimizer step reached), `examples`, `tokens` (in the training examples, each counted once),
    `wall_s`, and the data counts. A rerun resumes from the last checkpoint in `out_dir/checkpoints`.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = resolve_model(model, out_dir / "cache")
    # Loaded on the CPU: the Trainer moves it to its device (one GPU per process under `accelerate launch`).
    lm, tokenizer = load_model(path, dtype=training_dtype(settings.lora), device="cpu")
    dataset, counts = build_dataset(data, tokenizer, settings)

    resume = resume_point(out_dir)
    trainer = build_trainer(lm, tokenizer, dataset, out_dir, settings)
    result = trainer.train(resume_from_checkpoint=resume)

    model_dir = out_dir / MODEL_DIR
    if settings.lora is not None and not settings.merge:
        trainer.save_model(str(model_dir))  # the adapter (adapter_config.json + weights) and the tokenizer
    elif trainer.is_world_process_zero():  # under `accelerate launch`, one process writes
        merge_and_save(trainer.model, tokenizer, model_dir)
    return {
        "train_loss": float(result.training_loss),
        "steps": int(result.global_step),
        "examples": len(dataset),
        "tokens": counts.tokens,
        "wall_s": round(time.perf_counter() - start, 3),
        "records": counts.records,
        "skipped_no_assistant": counts.skipped_no_assistant,
        "truncated": counts.truncated,
        "skipped_too_long": counts.skipped_too_long,
    }
