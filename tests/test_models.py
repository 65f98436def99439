"""Models: load_model with LoRA / adapters, merge_and_save (on the tiny model; its building: test_tiny_model.py)."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel

from turnforge.models import LoraSpec, load_model, merge_and_save


def logits(model, ids=(1, 2, 3, 4, 5)) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits


def test_lora_trains_only_the_adapter_and_merges_back(tiny_model_dir, tmp_path):
    model, tokenizer = load_model(tiny_model_dir, device="cpu", lora=LoraSpec(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    assert isinstance(model, PeftModel)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trainable)
    with torch.no_grad():  # PEFT starts lora_B at zero; move it so the merge has something to merge
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    expected = logits(model)
    out = merge_and_save(model, tokenizer, tmp_path / "merged")
    merged, _ = load_model(out, device="cpu")
    assert not isinstance(merged, PeftModel) and not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), expected, atol=1e-5, rtol=1e-4)

    all_linear, _ = load_model(tiny_model_dir, device="cpu", lora=LoraSpec(r=2))
    adapted = {n.split(".")[-4] for n, p in all_linear.named_parameters() if "lora_A" in n}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_an_adapter_loads_on_its_base_or_as_the_model_itself(tiny_model_dir, tmp_path):
    model, _ = load_model(tiny_model_dir, device="cpu", lora=LoraSpec(r=4, dropout=0.0))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    model.save_pretrained(tmp_path / "adapter")
    expected = logits(model)
    for loaded, _ in (
        load_model(tiny_model_dir, device="cpu", adapter=tmp_path / "adapter"),
        load_model(tmp_path / "adapter", device="cpu"),
    ):
        assert isinstance(loaded, PeftModel)
        torch.testing.assert_close(logits(loaded), expected)
    # adapter + lora: the adapter is merged, a fresh one trains on top (starting at zero: same outputs)
    stacked, _ = load_model(tiny_model_dir, device="cpu", adapter=tmp_path / "adapter", lora=LoraSpec(r=2))
    assert isinstance(stacked, PeftModel)
    torch.testing.assert_close(logits(stacked), expected, atol=1e-5, rtol=1e-4)


def test_load_model_options_and_errors(tiny_model_dir, tmp_path):
    model, tokenizer = load_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16 and tokenizer.pad_token == "<|endoftext|>"
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        load_model(tiny_model_dir, dtype="fp8")
    with pytest.raises(FileNotFoundError, match="missing does not exist; give a local folder"):
        load_model(tmp_path / "missing")  # a path: never tried on the Hub
    with pytest.raises(FileNotFoundError, match="adapter does not exist"):
        load_model(tiny_model_dir, adapter="./adapter")
    for bad, message in [({"r": 0}, "r must be at least 1"), ({"dropout": 1.0}, "dropout"),
                         ({"target_modules": []}, "target_modules is empty")]:
        with pytest.raises(ValueError, match=message):
            LoraSpec(**bad)
    config = LoraSpec(r=8, alpha=16, dropout=0.1, target_modules=["q_proj"]).to_peft()
    assert (config.r, config.lora_alpha, config.lora_dropout, config.target_modules) == (8, 16, 0.1, {"q_proj"})
