"""TRL's fused LM head re-patched to score only the labelled positions on a CPU (`turnforge.train.lm_head`)."""

from __future__ import annotations

import copy

import datasets
import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

import turnforge.train.lm_head as lm_head
from turnforge.models import load_model

OUTPUTS = ("log_probs", "entropy", "is_top1")
# bf16 keeps 8 significant bits: one rounding is off by up to 2^-8 of the value. Under autocast the two heads give
# the kernels other shapes (the labelled rows only vs all), which oneDNN blocks and rounds differently (Intel AMX
# does; AMD's avx512_bf16 happened not to), and each layer's backward rounds again on what the layer above left. So a
# gradient may differ by two roundings a layer, in norm relative to its tensor's (measured on a Xeon with AMX: up to
# 2.4 x 2^-8, in layer 0 of 4). A missed row moves a gradient by its share of the rows (a third here); a single
# position is below this bound, and the float32 case holds that.
def bf16_gradient_bound(layers: int) -> float:
    return 2 * layers * 2**-8


@pytest.fixture()
def models(tiny_model_dir):
    """Two copies of the tiny model with TRL's fused head; the second re-patched."""
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    trls, ours = model, copy.deepcopy(model)
    for m in (trls, ours):
        add_fused_lm_head(m, temperature=0.7, outputs=OUTPUTS)
    assert lm_head.patch_model(ours)
    return trls, ours


def batch(labelled: slice = slice(150, None)) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 900, (3, 220), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[:, labelled] = ids[:, labelled]
    labels[1, 200:] = -100  # rows label different counts
    return ids, labels


@pytest.mark.parametrize("autocast", [False, True])
def test_labelled_positions_only_give_trls_outputs_loss_and_gradients(models, autocast):
    ids, labels = batch()
    results = []
    for model in models:
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (trl, trl_grads), (ours, our_grads) = results
    assert ours.loss.item() == pytest.approx(trl.loss.item(), rel=1e-6)
    for field in ("log_probs", "entropy"):
        assert torch.allclose(getattr(ours, field), getattr(trl, field), atol=1e-5), field
    assert torch.equal(ours.is_top1, trl.is_top1)
    assert torch.equal(ours.label_mask, labels[:, 1:] != -100)
    assert (ours.log_probs[~ours.label_mask] == 0).all() and (ours.entropy[~ours.label_mask] == 0).all()
    for name, grad in trl_grads.items():
        if autocast:
            bound = bf16_gradient_bound(models[0].config.num_hidden_layers)
            assert (our_grads[name] - grad).norm() <= bound * grad.norm(), name
        else:
            assert torch.allclose(our_grads[name], grad, rtol=1e-4, atol=1e-7), name


def test_only_the_labelled_rows_rounded_up_reach_the_kernel(models, monkeypatch):
    """69 + 69 + 49 labelled positions of 3 x 219: the kernel sees 256 rows (two blocks of 128), not 657."""
    seen = []
    apply = lm_head.ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        seen.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(lm_head.ChunkedLogProbFunction, "apply", spy)
    ids, labels = batch()
    models[1](input_ids=ids, labels=labels, fused_lm_head=True)
    assert seen == [256]


def test_no_label_gives_a_zero_loss_that_backward_runs_through(models):
    ids, labels = batch(slice(0, 0))
    out = models[1](input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    assert out.loss.item() == 0.0 and not out.label_mask.any()


def test_plain_forward_and_generate_are_untouched(models):
    ids, _ = batch()
    trl, ours = models
    assert torch.equal(ours(input_ids=ids).logits, trl(input_ids=ids).logits)
    out = ours.generate(input_ids=ids[:1, :10], max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 13)


def test_patching_twice_keeps_one_wrapper_and_a_model_without_trls_head_is_left_alone(models, tiny_model_dir):
    ours = models[1]
    forward = ours.forward
    assert lm_head.patch_model(ours) and ours.forward == forward
    bare, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    assert not lm_head.patch_model(bare)


def test_sft_trainer_scores_labelled_positions_only(tiny_model_dir, tmp_path):
    from turnforge.train.settings import SFTSettings
    from turnforge.train.sft import build_trainer

    model, tokenizer = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    data = datasets.Dataset.from_list([{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]}])
    trainer = build_trainer(model, tokenizer, data, tmp_path, SFTSettings(max_steps=1, batch_size=1))
    assert getattr(trainer.model.forward.__func__, "_labelled_only", False)


def test_a_model_accelerate_has_wrapped_keeps_trls_head(tiny_model_dir, caplog):
    """TRL hands a reference model to accelerate in its constructor; its autocast wrapper is left in front."""
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    add_fused_lm_head(model, outputs=OUTPUTS)
    model._original_forward = model.forward  # what accelerate's prepare_model records before wrapping
    wrapped = model.forward
    with caplog.at_level("WARNING"):
        assert not lm_head.patch_model(model)
    assert model.forward == wrapped and not caplog.records
