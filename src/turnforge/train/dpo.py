"""DPO stage: preference-tune a causal LM on round-wise pairs with TRL's `DPOTrainer`.

Read top to bottom, one call of `run_dpo` does:
  1. read the pairs (`turnforge.data.dpo_pairs.load_pairs`: the seed schema or TRL's, from JSONL, parquet, a
     dataset folder or `hf:NAME`);
  2. load the start model — an SFT-merged model, or a base + SFT adapter that is merged first — and give TRL a
     fresh LoRA `peft_config`: the reference policy is the same model with the adapter disabled (TRL's PEFT path),
     so no second copy of the weights is held;
  3. tokenize each pair as the rollouts render (`preference_dataset`, `chat_renderer`: the last `window` turns of
     the history up to the assistant header, each reply with the end token its template writes), so a pair trains
     the ids an episode of the model's family holds;
  4. train with `DPOTrainer` (sigmoid loss, `beta`) on those ids, the loss on the reply's tokens only — the next
     turn, never the history;
  5. write `out_dir/model/` (merged, or the adapter with `merge = false`) and `out_dir/metrics.jsonl` (one line
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
from pathlib import Path

import datasets
from trl import DPOConfig

from turnforge.data.dpo_pairs import Pair, load_pairs
from turnforge.formats.chat_template import chat_renderer, window_messages
from turnforge.models import load_model
from turnforge.tiny_model import resolve_model
from turnforge.train.lm_head import score_labelled_only
from turnforge.train.runtime import (
    METRICS_FILE,
    MODEL_DIR,
    MetricsFileCallback,
    resume_point,
    save_trained,
    train_loss,
    training_dtype,
    trl_config,
)
from turnforge.train.settings import DPO_LOSS_TYPES as LOSS_TYPES
from turnforge.train.settings import DPOSettings
from turnforge.train.trl_internals import TokenizedDPOTrainer

logger = logging.getLogger(__name__)

__all__ = ["LOSS_TYPES", "METRICS_FILE", "MODEL_DIR", "DPOSettings", "build_trainer", "preference_dataset", "run_dpo"]


def preference_dataset(pairs: list[Pair], settings: DPOSettings, tokenizer) -> datasets.Dataset:
    """The first `max_pairs` of `pairs` as TRL's tokenized preference rows (`prompt_ids`, `chosen_ids`,
    `rejected_ids`), rendered by the rollouts' renderer (`chat_renderer`): the history (windowed) up to the assistant
    header, each reply as the model writes it with the end token its template writes after it. So a pair trains the
    ids an episode of its model holds, in every family: a thinking model's earlier reasoning stays in the prompt (TRL's
    training template), gpt-oss's replies are its harmony messages, GLM's and Gemma 4's end on their own tokens."""
    if not pairs:
        raise ValueError("dpo has no pairs to train on: mine some from rollouts or give a pair dataset")
    pairs = pairs[: settings.max_pairs] if settings.max_pairs else pairs
    renderer = chat_renderer(tokenizer)
    rows = []
    for pair in pairs:
        history = window_messages(pair.messages, settings.window)
        row = {"prompt_ids": renderer.prompt_ids(history, pair.tools)}
        for key, text in (("chosen_ids", pair.chosen), ("rejected_ids", pair.rejected)):
            row[key] = renderer.completion_ids([*history, {"role": "assistant", "content": text}], pair.tools)
        rows.append(row)
    return datasets.Dataset.from_list(rows)


def dpo_config(out_dir: Path, settings: DPOSettings) -> DPOConfig:
    """TRL's config for `settings`, with the same device and precision choices as the SFT stage."""
    return trl_config(DPOConfig, out_dir, settings)


def build_trainer(lm, tokenizer, dataset: datasets.Dataset, out_dir: Path, settings: DPOSettings) -> TokenizedDPOTrainer:
    """A `DPOTrainer` on tokenized preference rows (`preference_dataset`); with LoRA its reference is the model with
    the adapter disabled."""
    trainer = TokenizedDPOTrainer(
        model=lm,
        args=dpo_config(out_dir, settings),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=settings.lora.to_peft() if settings.lora is not None else None,
        callbacks=[MetricsFileCallback(out_dir / METRICS_FILE)],
    )
    score_labelled_only(trainer)
    return trainer


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
    lm, tokenizer = _start_model(model, adapter, out_dir, settings)
    dataset = preference_dataset(pairs, settings, tokenizer)

    resume = resume_point(out_dir)
    trainer = build_trainer(lm, tokenizer, dataset, out_dir, settings)
    dropped = len(dataset) - len(trainer.train_dataset)
    if dropped:
        logger.warning("dpo: %d pairs dropped, their prompt alone fills max_length=%d", dropped, settings.max_length)
    result = trainer.train(resume_from_checkpoint=resume)

    save_trained(trainer, tokenizer, out_dir, settings.lora, settings.merge)
    margins = [h["rewards/margins"] for h in trainer.state.log_history if "rewards/margins" in h]
    used = pairs[: len(dataset)]
    return {
        "train_loss": train_loss(result),
        "steps": int(result.global_step),
        "pairs": len(trainer.train_dataset),
        "dropped_too_long": dropped,
        "by_reason": dict(Counter(p.reason for p in used)),
        "margin_first": margins[0] if margins else None,
        "margin_last": margins[-1] if margins else None,
        "wall_s": round(time.perf_counter() - start, 3),
    }
