"""DPO training on the tiny model: parameters move, the chosen-vs-rejected margin grows, the loss is on the reply.

The pairs are fixed household decision points: after the first observation, a valid "go to" (chosen) against
"fly to the moon" (rejected, the env answers "Nothing happens.").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from turnforge.data.dpo_pairs import Pair, save_pairs
from turnforge.envs.base import load_tasks, make_env
from turnforge.models import load_model
from turnforge.train.dpo import DPOSettings, build_trainer, preference_dataset, run_dpo
from turnforge.train.sft import METRICS_FILE, MODEL_DIR


def _fixed_pairs(n: int = 4) -> list[Pair]:
    env, pairs = make_env("household"), []
    for task in load_tasks("household", "test", limit=n):
        history = [m.to_dict() for m in env.reset(task)]
        chosen = env.format.render(env.expert_reply())
        pairs.append(Pair(history, chosen, "ACTION: fly to the moon", "invalid_action", None, task.id, 0, "expert"))
    return pairs


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    return save_pairs(_fixed_pairs(2), tmp_path_factory.mktemp("pairs") / "pairs.jsonl")


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]


def test_training_moves_parameters_and_grows_the_chosen_margin(tiny_model_dir, pairs_file, tmp_path):
    """Four steps on the same two pairs: merged weights differ from the start, the margin rises from 0."""
    settings = DPOSettings(max_steps=4, logging_steps=1, batch_size=2, learning_rate=2e-3, lr_scheduler="constant")
    summary = run_dpo(str(tiny_model_dir), [str(pairs_file)], tmp_path, settings)
    assert summary["steps"] == 4 and summary["pairs"] == 2 and summary["by_reason"] == {"invalid_action": 2}
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(tmp_path / MODEL_DIR / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("q_proj" in k for k in changed)  # the merged LoRA moved the adapted weights
    lines = _metrics(tmp_path)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/margins"} <= set(lines[0])
    margins = [m["rewards/margins"] for m in lines]
    assert margins[0] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is its reference (LoRA B = 0)
    assert margins[-1] > 0.05 and margins == sorted(margins)
    assert summary["margin_first"] == margins[0] and summary["margin_last"] == margins[-1]


def test_unmerged_adapter_is_saved_as_an_adapter(tiny_model_dir, pairs_file, tmp_path):
    run_dpo(str(tiny_model_dir), [str(pairs_file)], tmp_path, DPOSettings(max_steps=1, merge=False))
    assert (tmp_path / MODEL_DIR / "adapter_config.json").is_file()
    model, _ = load_model(tmp_path / MODEL_DIR)  # base + adapter, loadable like any model folder
    assert model is not None


def test_loss_is_on_the_next_turn_only(tiny_model_dir, tmp_path):
    lm, tokenizer = load_model(tiny_model_dir, dtype="float32", device="cpu")
    pairs = _fixed_pairs(1)
    trainer = build_trainer(lm, tokenizer, preference_dataset(pairs, DPOSettings()), tmp_path, DPOSettings())
    row = trainer.train_dataset[0]
    assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(row["chosen_ids"]).startswith(pairs[0].chosen + "<|im_end|>")
    assert tokenizer.decode(row["rejected_ids"]).startswith("ACTION: fly to the moon<|im_end|>")


def test_window_keeps_the_last_turns_of_the_history():
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(3):
        history += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"o{i}"}]
    ds = preference_dataset([Pair(history, "c", "r", "loop")], DPOSettings(window=1))
    assert [m["content"] for m in ds[0]["prompt"]] == ["s", "task", "a2", "o2"]


def test_bad_settings_and_no_pairs_are_clear_errors():
    with pytest.raises(ValueError, match="dpo setting beta=0"):
        DPOSettings(beta=0)
    with pytest.raises(ValueError, match="loss_type"):
        DPOSettings(loss_type="nope")
    with pytest.raises(ValueError, match="no pairs"):
        preference_dataset([], DPOSettings())
