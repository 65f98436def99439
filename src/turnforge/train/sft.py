"""SFT stage: fine-tune a causal LM on agent trajectories or chat conversations with TRL's `SFTTrainer`.

Read top to bottom, one call of `run_sft` does:
  1. read the data: trajectory JSONL lines (from `turnforge collect` / `turnforge eval`), conversational
     records (`{"messages": [...], "tools": [...]}`) from JSONL, or a `datasets` dataset (`hf:NAME[:SPLIT]`,
     a `save_to_disk` folder, a local parquet/JSON dataset);
  2. turn each record into `SFTExample`s (`input_ids` + `completion_mask`, 1 on the policy's replies only)
     with `turnforge.data.sft`: token-exact trajectories keep the exact ids the policy saw,
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
  - `packing = "batch"` and `"prefix"` are batch layouts TRL does not have (`BatchRowPacker`,
    `SharedPrefixSFTTrainer`): the same loss, less padding or a shared prefix computed once.
  - A callback writes `metrics.jsonl`, the run directory's machine-readable training log.
  - Nothing is deduplicated or filtered by success: choosing the trajectories (RFT, successes only) is
    the data stage's job; this stage trains on what it is given.

The command (a recipe stage `kind = "sft"` calls `run_sft`):

    turnforge run recipes/quickstart.toml
    python -c "from pathlib import Path; from turnforge.train.sft import SFTSettings, run_sft; \
print(run_sft('tiny', ['runs/expert/episodes.jsonl'], Path('runs/sft'), SFTSettings(max_steps=20)))"
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import datasets
import torch
from transformers import PreTrainedTokenizerBase
from trl import SFTConfig, SFTTrainer

from turnforge.data.sft import DataCounts, fit_to_length, source_examples
from turnforge.models import load_model
from turnforge.tiny_model import resolve_model
from turnforge.train.lm_head import score_labelled_only
from turnforge.train.runtime import (
    CACHE_FIELD,
    CHECKPOINTING_FIELD,
    METRICS_FILE,
    MODEL_DIR,
    MetricsFileCallback,
    expanded_cache,
    forward_cache,
    resume_point,
    save_trained,
    train_loss,
    training_dtype,
    trl_config,
)
from turnforge.train.settings import SFTSettings
from turnforge.train.trl_internals import add_train_tokens, metric_lists, train_tokens

logger = logging.getLogger(__name__)

__all__ = [
    "METRICS_FILE",
    "MODEL_DIR",
    "BatchRowPacker",
    "SFTSettings",
    "SharedPrefixSFTTrainer",
    "build_dataset",
    "build_trainer",
    "run_sft",
    "shared_prefix_length",
    "sft_config",
]


# ---------------------------------------------------------------------------------------------------------------
# 1-3. Data: sources -> records -> SFTExamples (turnforge.data.sft) -> a `datasets.Dataset`


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


def sft_config(out_dir: Path, settings: SFTSettings) -> SFTConfig:
    """TRL's config for `settings`: completion-only loss on the pre-tokenized mask, CPU-safe precision.

    With `packing = "prefix"` the machine's default activation checkpointing (on with a GPU) is turned off, since
    the shared prefix's cache cannot be recomputed; set on in the stage's `trl` table, `build_trainer` refuses it."""
    config = trl_config(SFTConfig, out_dir, settings)
    if settings.packing == "prefix" and CHECKPOINTING_FIELD not in settings.trl:
        setattr(config, CHECKPOINTING_FIELD, False)
    return config


class BatchRowPacker:
    """Collates a batch by packing its examples into as few rows as fit, each keeping its own position ids.

    TRL's padding-free collator flattens a whole batch into one row, which only FlashAttention's varlen kernels
    run cheaply; with SDPA or eager attention (a CPU) that row gets one dense (tokens x tokens) mask. Here a row
    holds at most `capacity` tokens (or the batch's longest example), rows are padded to the longest row
    (rounded up to `pad_to_multiple_of`), and no attention mask is returned: transformers then reads the
    example boundaries from the restarting position ids and masks each example apart, row by row. The examples
    of a step are the ones an unpacked batch would hold, so the loss (a mean over the same label tokens) is the
    unpacked loss; only the padding is gone."""

    def __init__(self, pad_token_id: int, capacity: int, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id, self.capacity, self.multiple = pad_token_id, capacity, pad_to_multiple_of or 1

    def rows(self, lengths: list[int]) -> list[list[int]]:
        """First-fit decreasing: the indices of the examples in each row, longest examples placed first."""
        # By hand: TRL's best-fit packing (`trl.pack_dataset`) packs a whole dataset's pyarrow columns, not a batch.
        capacity = max(self.capacity, *lengths)
        rows: list[list[int]] = []
        room: list[int] = []
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            slot = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
            if slot is None:
                rows.append([])
                room.append(capacity)
                slot = len(rows) - 1
            rows[slot].append(i)
            room[slot] -= lengths[i]
        return rows

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(example["input_ids"]) for example in examples]
        rows = self.rows(lengths)
        width = max(sum(lengths[i] for i in row) for row in rows)
        width = -(-width // self.multiple) * self.multiple
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                end = start + lengths[i]
                input_ids[r, start:end] = torch.tensor(examples[i]["input_ids"])
                labels[r, start:end] = torch.tensor(examples[i]["labels"])
                labels[r, start] = -100  # the previous example's last token must not learn to predict this one
                position_ids[r, start:end] = torch.arange(lengths[i])
                start = end
            # The padding continues the row's last example (its outputs have no label, and causal attention keeps
            # it out of that example's view): a batch whose rows each hold one example then needs no mask at all.
            position_ids[r, start:] = torch.arange(lengths[row[-1]], lengths[row[-1]] + width - start)
        return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


class BatchPackedSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer on `BatchRowPacker` batches. TRL counts a batch with position ids and no attention mask as
    its own padding-free layout, one row, so its `num_tokens` would count one row of several: counted here as
    every row's width (padding included, as TRL counts a padding-free row), through TRL's private token counter
    (`trl_internals.add_train_tokens`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        counted = train_tokens(self)
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        rows = inputs["input_ids"].shape[0]
        if train_tokens(self) != counted and rows > 1:
            add_train_tokens(self, counted, rows)
        return result


def shared_prefix_length(input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None, block: int) -> int:
    """How many leading tokens every row of a batch shares and none learns, rounded down to a multiple of `block`.

    A token at position t is predicted from position t - 1, so the prefix stops before the token ahead of the
    first label: its outputs feed no loss. Rounding to `block` keeps the prefix and the rest at a few shapes
    (oneDNN builds a kernel per new shape; see `train.runtime.cpu_bf16_args`)."""
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    learnt = (labels != -100).any(dim=0)
    stop = min(
        int(same.logical_not().nonzero()[0]) if not same.all() else same.numel(),
        int(learnt.nonzero()[0]) - 1 if learnt.any() else same.numel(),
        input_ids.shape[1] - 1,  # at least one position left to run row by row
    )
    return max(stop, 0) // block * block


def prefix_chunks(labels: torch.Tensor, mask: torch.Tensor, prefix: int, rows_per_chunk: int,
                  block: int) -> list[tuple[list[int], int]]:
    """How `SharedPrefixSFTTrainer` runs a batch after its shared `prefix`: (rows, width) per chunk, the rows sorted
    longest first, `rows_per_chunk` at a time, each chunk cut to its longest row (the rest past the prefix rounded up
    to `block`, at most the batch's width). A row ends after its last real token or label, whichever is later."""
    real = mask.bool() | (labels != -100)
    ends = [int(row.nonzero()[-1]) + 1 if row.any() else prefix + 1 for row in real]
    order = sorted(range(labels.shape[0]), key=lambda r: ends[r], reverse=True)
    chunks = []
    for at in range(0, len(order), rows_per_chunk):
        rows = order[at : at + rows_per_chunk]
        rest = max(max(ends[r] for r in rows) - prefix, 1)
        chunks.append((rows, min(prefix + -(-rest // block) * block, labels.shape[1])))
    return chunks


class SharedPrefixSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer that runs the prefix every row of a batch shares (the system prompt, the task's opening) once.

    The prefix is one row through the model; its keys/values are expanded to every row, and the rest of each row
    attends to them (`cache`), as a generation step would. Nothing in the prefix is learnt (it stops before the
    first label), so the loss is the same sum over the same label tokens; its gradient reaches the prefix's
    weights through the expanded keys/values, summed over the rows, as the unshared batch sums them.

    The rest of the rows run `ROWS_PER_CHUNK` at a time, sorted by length, each chunk cut to its own longest row
    (rounded up to `PREFIX_BLOCK`): a batch padded to its longest episode was 40 % padding in the quickstart.
    TRL's `compute_loss` runs unchanged on each chunk (its fused head takes the labels from there), each chunk's
    loss divided by the whole batch's label count, so their sum is the batch's loss; the chunks' entropy and
    token-accuracy entries are merged into the batch's, weighted by their label counts."""

    PREFIX_BLOCK = 64
    ROWS_PER_CHUNK = 2  # fastest of 8, 4, 2 and 1 on the quickstart (BENCHMARKS.md)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids, labels, mask = inputs["input_ids"], inputs["labels"], inputs.get("attention_mask")
        p = shared_prefix_length(ids, labels, mask, self.PREFIX_BLOCK)
        if p == 0 or return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if mask is None:
            mask = torch.ones_like(ids)  # the mask spans the cached prefix and the rest
        if num_items_in_batch is None:  # TRL's own divisor for a batch: its label count
            num_items_in_batch = (labels[:, 1:] != -100).sum()
        prefix = forward_cache(model(input_ids=ids[:1, :p], use_cache=True, logits_to_keep=1))
        metrics = metric_lists(self)
        marks = {name: len(metrics[name]) for name in ("entropy", "mean_token_accuracy")}
        loss, weights = None, []
        for rows, width in prefix_chunks(labels, mask, p, self.ROWS_PER_CHUNK, self.PREFIX_BLOCK):
            cache = expanded_cache(prefix, len(rows), self.accelerator.unwrap_model(model).config)
            positions = torch.arange(p, width, device=ids.device).expand(len(rows), -1)
            chunk_labels = labels[rows, p:width]
            chunk = {**inputs, "input_ids": ids[rows, p:width], "labels": chunk_labels, "position_ids": positions,
                     CACHE_FIELD: cache, "attention_mask": mask[rows, :width]}
            part = super().compute_loss(model, chunk, False, num_items_in_batch)
            loss = part if loss is None else loss + part
            weights.append(int((chunk_labels[:, 1:] != -100).sum()))
        for name, mark in marks.items():  # one entry per batch, as TRL logs it
            values = metrics[name][mark:]
            if len(values) == len(weights) > 1:
                metrics[name][mark:] = [sum(v * w for v, w in zip(values, weights, strict=True)) / max(sum(weights), 1)]
        return loss


def build_trainer(
    model, tokenizer: PreTrainedTokenizerBase, dataset: datasets.Dataset, out_dir: Path, settings: SFTSettings
) -> SFTTrainer:
    """An `SFTTrainer` on a pre-tokenized `input_ids` + `completion_mask` dataset, logging to `metrics.jsonl`."""
    config = sft_config(out_dir, settings)
    collator, trainer_cls = None, SFTTrainer
    if settings.packing == "batch":
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        collator = BatchRowPacker(pad, settings.max_length, config.pad_to_multiple_of)
        trainer_cls = BatchPackedSFTTrainer
    elif settings.packing == "prefix":
        if getattr(config, CHECKPOINTING_FIELD):  # it recomputes layers in backward, and a cache cannot be re-filled
            raise ValueError(
                f'packing = "prefix" hands the shared prefix to the rows as a KV cache, which {CHECKPOINTING_FIELD} '
                f"cannot recompute (on by default on a GPU): set trl = {{ {CHECKPOINTING_FIELD} = false }} or another "
                "packing"
            )
        trainer_cls = SharedPrefixSFTTrainer
    trainer = trainer_cls(
        model=model,
        args=config,
        data_collator=collator,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=settings.lora.to_peft() if settings.lora is not None else None,
        callbacks=[MetricsFileCallback(out_dir / METRICS_FILE)],
    )
    score_labelled_only(trainer)
    return trainer


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

    save_trained(trainer, tokenizer, out_dir, settings.lora, settings.merge)
    return {
        "train_loss": train_loss(result),
        "steps": int(result.global_step),
        "examples": len(dataset),
        "tokens": counts.tokens,
        "wall_s": round(time.perf_counter() - start, 3),
        "records": counts.records,
        "skipped_no_assistant": counts.skipped_no_assistant,
        "truncated": counts.truncated,
        "skipped_too_long": counts.skipped_too_long,
    }
