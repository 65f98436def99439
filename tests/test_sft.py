"""SFT stage on the tiny model: parameters move, the loss is TRL's masked cross-entropy, the run dir is right.

The model and tokenizer are built here (random Qwen3, byte-level BPE with the Qwen chat tokens and TRL's
Qwen3-Instruct-2507 chat template): nothing is downloaded.
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from transformers.masking_utils import find_packed_sequence_indices

from turnforge.data.sft import SFTExample
from turnforge.models import LoraSpec
from turnforge.train import sft as sft_module
from turnforge.train.sft import (
    METRICS_FILE,
    MODEL_DIR,
    BatchRowPacker,
    SFTSettings,
    SharedPrefixSFTTrainer,
    build_dataset,
    build_trainer,
    fit_to_length,
    run_sft,
    sft_config,
    shared_prefix_length,
)
from turnforge.types import Message, Score, StopReason, Trajectory, Turn

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1 and a countertop 1.",
    "Your task is to: put a clean apple in the fridge.",
    "ACTION: go to countertop 1",
    "ACTION: take apple 1 from countertop 1",
    "On the countertop 1, you see an apple 1 and a knife 2. You pick up the apple 1.",
    "Nothing happens. The fridge 1 is closed. You open the fridge 1.",
    'system user assistant tool <tool_call> </tool_call> <tool_response> </tool_response> {"name": "arguments"}',
]
# (user observation, assistant reply) pairs: a household-like episode.
EPISODE = [
    ("Your task is to: put a clean apple in the fridge.", "ACTION: go to countertop 1"),
    ("On the countertop 1, you see an apple 1.", "ACTION: take apple 1 from countertop 1"),
    ("You pick up the apple 1.", "ACTION: go to fridge 1"),
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe_trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, bpe_trainer)
    template = resources.files("trl").joinpath("chat_templates/qwen3_instruct_2507.jinja").read_text()
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=template
    )


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tokenizer) -> Path:
    """A random 2-layer Qwen3 saved with its tokenizer, the `model` every run_sft test starts from."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny_base")
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def chat(episode=EPISODE) -> list[dict]:
    messages = [{"role": "system", "content": "You are a household agent."}]
    for observation, reply in episode:
        messages += [{"role": "user", "content": observation}, {"role": "assistant", "content": reply}]
    return messages


def token_exact_trajectory(tokenizer, episode=EPISODE) -> Trajectory:
    """A trajectory as the rollout records it with a renderer: prompt ids, then generated + observation ids."""
    messages = chat(episode)

    def ids(upto: int, generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages[:upto], tokenize=False, add_generation_prompt=generation_prompt
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt_ids = ids(2, True)
    turns, seen = [], list(prompt_ids)
    for i, (_, reply) in enumerate(episode):
        generated = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seen += generated
        last = i == len(episode) - 1
        after = ids(2 * i + 3, False) if last else ids(2 * i + 4, True)
        observation = after[len(seen) :]
        seen += observation
        turns.append(
            Turn(
                text=reply,
                generated_ids=generated,
                logprobs=[0.0] * len(generated),
                observation_ids=observation,
            )
        )
    return Trajectory(
        task_id="t0",
        env="household",
        category="pick_clean_then_place",
        split="train",
        messages=[Message.from_dict(m) for m in messages],
        turns=turns,
        score=Score(success=True, reward=1.0, progress=1.0),
        stop_reason=StopReason.success,
        prompt_ids=prompt_ids,
    )


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def state_dict(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def fast(**kw) -> SFTSettings:
    """Settings for a two-step run: a high learning rate so two steps move every weight visibly."""
    return SFTSettings(**{"max_steps": 2, "batch_size": 2, "logging_steps": 1, "learning_rate": 1e-2, **kw})


def test_full_sft_changes_every_parameter_and_logs_each_step(tmp_path, tokenizer, base_dir):
    data = write_jsonl(tmp_path / "trajectories.jsonl", [token_exact_trajectory(tokenizer).to_json()] * 4)
    out = tmp_path / "sft"
    result = run_sft(str(base_dir), [str(data)], out, fast())

    assert result["steps"] == 2 and result["examples"] == 4 and result["train_loss"] > 0
    before, after = state_dict(base_dir), state_dict(out / MODEL_DIR)
    assert before.keys() == after.keys()
    unchanged = [name for name in before if torch.equal(before[name], after[name])]
    assert unchanged == []
    assert (out / MODEL_DIR / "tokenizer.json").exists()

    lines = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["loss"] > 0 and "learning_rate" in line and "epoch" in line for line in lines)


def test_lora_trains_the_adapter_only(tmp_path, tokenizer, base_dir):
    data = write_jsonl(tmp_path / "trajectories.jsonl", [token_exact_trajectory(tokenizer).to_json()] * 4)
    lora = LoraSpec(r=4, alpha=8, dropout=0.0)

    adapter_run = run_sft(str(base_dir), [str(data)], tmp_path / "adapter", fast(lora=lora, merge=False))
    assert adapter_run["steps"] == 2
    adapter_dir = tmp_path / "adapter" / MODEL_DIR
    assert (adapter_dir / "adapter_config.json").exists()
    adapter = load_file(adapter_dir / "adapter_model.safetensors")
    lora_b = [w for name, w in adapter.items() if "lora_B" in name]
    assert lora_b and all(w.abs().sum() > 0 for w in lora_b)  # PEFT starts B at zero: nonzero = trained

    run_sft(str(base_dir), [str(data)], tmp_path / "merged", fast(lora=lora, merge=True))
    before, merged = state_dict(base_dir), state_dict(tmp_path / "merged" / MODEL_DIR)
    assert before.keys() == merged.keys()  # the adapter is merged away, no lora_ keys left
    linear = [n for n in before if n.endswith("proj.weight")]
    frozen = [n for n in before if n not in linear]  # embeddings and norms: no adapter, so frozen
    assert linear and frozen
    assert all(not torch.equal(before[n], merged[n]) for n in linear)
    assert all(torch.equal(before[n], merged[n]) for n in frozen)


def masked_cross_entropy(model, input_ids: list[list[int]], masks: list[list[int]]) -> torch.Tensor:
    """Mean over tokens t with mask[t] == 1 of -log p(ids[t] | ids[:t]), written out by hand."""
    total, count = torch.tensor(0.0), 0
    for ids, mask in zip(input_ids, masks, strict=True):
        logits = model(input_ids=torch.tensor([ids])).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        for t in range(1, len(ids)):
            if mask[t]:
                total, count = total - logp[t - 1, ids[t]], count + 1
    return total / count


def test_loss_is_cross_entropy_on_completion_tokens_only(tmp_path, tokenizer, base_dir):
    # prompt (0) | assistant (1) | observation (0) | assistant (1) | trailing observation (0)
    input_ids = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26]]
    masks = [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0]]
    dataset = datasets.Dataset.from_dict({"input_ids": input_ids, "completion_mask": masks})
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    trainer = build_trainer(model, tokenizer, dataset, tmp_path, SFTSettings(batch_size=2))

    def trainer_loss(rows) -> torch.Tensor:
        batch = trainer.data_collator(rows)
        with torch.no_grad():
            return trainer.compute_loss(trainer.model, dict(batch))

    rows = [trainer.train_dataset[i] for i in range(2)]
    with torch.no_grad():
        expected = masked_cross_entropy(trainer.model, input_ids, masks)
    loss = trainer_loss(rows)
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)

    # Tokens after the last completion token are masked: whatever they are, the loss is bit-identical.
    altered = [dict(row) for row in rows]
    altered[0]["input_ids"] = [*input_ids[0][:10], 99, 98]
    altered[1]["input_ids"] = [*input_ids[1][:4], 97, 96, 95]
    assert torch.equal(trainer_loss(altered), loss)


def test_conversational_records_from_jsonl_and_dataset_folder(tmp_path, tokenizer, base_dir, caplog):
    records = [{"messages": chat()}] * 3 + [{"messages": chat()[:2]}]  # the last has no assistant turn
    jsonl = write_jsonl(tmp_path / "chats.jsonl", [json.dumps(r) for r in records])
    folder = tmp_path / "chats_ds"
    datasets.Dataset.from_list([{"messages": chat()}]).save_to_disk(str(folder))

    with caplog.at_level(logging.WARNING, logger="turnforge.train.sft"):
        dataset, counts = build_dataset([str(jsonl), str(folder)], tokenizer, SFTSettings())
    assert counts.records == 5 and counts.skipped_no_assistant == 1
    assert counts.by_source == {str(jsonl): 3, str(folder): 1}
    assert "no assistant turn" in caplog.text
    # The loss tokens are the assistant replies (and their end-of-turn token), nothing else.
    ids, mask = dataset[0]["input_ids"], dataset[0]["completion_mask"]
    learned = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    for _, reply in EPISODE:
        assert reply in learned
    assert "household agent" not in learned and "countertop 1, you see" not in learned

    result = run_sft(str(base_dir), [str(jsonl)], tmp_path / "sft", fast(max_steps=1))
    assert result["steps"] == 1 and result["examples"] == 3 and result["skipped_no_assistant"] == 1


def test_over_long_examples_are_cut_or_skipped_and_counted(tmp_path, tokenizer, caplog):
    example = SFTExample(input_ids=list(range(10)), completion_mask=[0] * 4 + [1] * 6)
    assert fit_to_length(example, 10) is example
    assert fit_to_length(example, 6) == SFTExample(list(range(6)), [0, 0, 0, 0, 1, 1])
    assert fit_to_length(example, 4) is None  # only prompt left: nothing to learn

    line = token_exact_trajectory(tokenizer).to_json()
    data = write_jsonl(tmp_path / "t.jsonl", [line] * 2)
    n_tokens = len(build_dataset([str(data)], tokenizer, SFTSettings())[0][0]["input_ids"])
    with caplog.at_level(logging.WARNING, logger="turnforge.train.sft"):
        dataset, counts = build_dataset([str(data)], tokenizer, SFTSettings(max_length=n_tokens - 5))
    assert counts.truncated == 2 and len(dataset) == 2
    assert all(len(ids) == n_tokens - 5 for ids in dataset["input_ids"])
    assert "2 examples truncated" in caplog.text

    with pytest.raises(ValueError, match="no training examples"):
        build_dataset([str(data)], tokenizer, SFTSettings(max_length=4))


def test_bad_data_is_a_clear_error(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="at least one data source"):
        build_dataset([], tokenizer, SFTSettings())
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match="unknown file format '.txt'"):
        build_dataset([str(tmp_path / "x.txt")], tokenizer, SFTSettings())
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        build_dataset([str(tmp_path / "missing.jsonl")], tokenizer, SFTSettings())
    bad = write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"prompt": "hi", "completion": "yo"})])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: neither a trajectory"):
        build_dataset([str(bad)], tokenizer, SFTSettings())
    starts_with_reply = write_jsonl(tmp_path / "chat.jsonl", [json.dumps({"messages": chat()[2:3]})] * 2)
    with pytest.raises(ValueError, match=r"chat.jsonl:1: cannot read this record"):
        build_dataset([str(starts_with_reply)], tokenizer, SFTSettings())
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match="no training examples"):
        build_dataset([str(empty)], tokenizer, SFTSettings())
    with pytest.raises(ValueError, match="report_to"):
        SFTSettings(report_to="mlflow")


def test_rerun_resumes_from_the_last_checkpoint(tmp_path, tokenizer, base_dir):
    data = write_jsonl(tmp_path / "t.jsonl", [token_exact_trajectory(tokenizer).to_json()] * 4)
    out = tmp_path / "sft"
    run_sft(str(base_dir), [str(data)], out, fast(save_steps=1))
    assert (out / "checkpoints" / "checkpoint-2").is_dir()
    result = run_sft(str(base_dir), [str(data)], out, fast(save_steps=1, max_steps=3))
    assert result["steps"] == 3
    steps = [json.loads(line)["step"] for line in (out / METRICS_FILE).read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_a_checkpoint_killed_while_saving_is_not_resumed_from(tmp_path):
    """Step 30's folder lacks trainer_state.json and step 40's is cut short (a kill while saving): the run resumes
    from step 20, and the metrics logged after it are dropped (they will be logged again)."""
    from turnforge.train.runtime import resume_point

    checkpoints = tmp_path / "checkpoints"
    for step, state in ((10, "{}"), (20, '{"global_step": 20}'), (30, None), (40, '{"global_st')):
        (checkpoints / f"checkpoint-{step}").mkdir(parents=True)
        if state is not None:
            (checkpoints / f"checkpoint-{step}" / "trainer_state.json").write_text(state)
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (10, 20, 30)))
    assert resume_point(tmp_path) == str(checkpoints / "checkpoint-20")
    assert [json.loads(line)["step"] for line in (tmp_path / METRICS_FILE).read_text().splitlines()] == [10, 20]


def test_batch_row_packer_places_examples_first_fit_decreasing():
    """Lengths 25, 12, 7, 20 in rows of 32: 25 opens row 0 (7 left), 20 opens row 1 (12 left), 12 fills row 1,
    7 fills row 0. An example longer than the capacity sets the capacity: 40 fills row 0, 3 opens row 1."""
    packer = BatchRowPacker(pad_token_id=0, capacity=32, pad_to_multiple_of=8)
    assert packer.rows([25, 12, 7, 20]) == [[0, 2], [3, 1]]
    assert packer.rows([40, 3]) == [[0], [1]]

    examples = [{"input_ids": [n] * n, "labels": [n] * n} for n in (5, 3, 2)]
    batch = BatchRowPacker(pad_token_id=0, capacity=6, pad_to_multiple_of=4)(examples)
    # rows: [5] and [3, 2], padded to 8 (the longest row, 5, rounded up to a multiple of 4)
    assert batch["input_ids"].tolist() == [[5, 5, 5, 5, 5, 0, 0, 0], [3, 3, 3, 2, 2, 0, 0, 0]]
    # the padding continues each row's last example (no label; causal attention keeps it out of its view)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 3, 4]]
    assert batch["labels"].tolist() == [[-100, 5, 5, 5, 5, -100, -100, -100], [-100, 3, 3, -100, 2, -100, -100, -100]]
    assert "attention_mask" not in batch  # transformers reads the boundaries from the position ids only then
    assert find_packed_sequence_indices(batch["position_ids"]).tolist() == [[0] * 8, [0, 0, 0, 1, 1, 1, 1, 1]]
    # rows of one example each: no boundaries, so attention is plain causal (SDPA skips the upper triangle)
    one_each = BatchRowPacker(pad_token_id=0, capacity=5, pad_to_multiple_of=4)(examples[:2])
    assert one_each["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]]
    assert find_packed_sequence_indices(one_each["position_ids"]) is None


def test_packing_keeps_examples_apart(tmp_path, tokenizer, base_dir):
    """Unpacked (3 rows), packed by TRL (one padding-free row) and packed per batch (2 rows): the same loss."""
    input_ids = [
        [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
        [20, 21, 22, 23, 24, 25, 26],
        list(range(30, 55)),
    ]
    masks = [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0], [0] * 10 + [1] * 15]
    dataset = datasets.Dataset.from_dict({"input_ids": input_ids, "completion_mask": masks})
    losses = []
    for packing, rows in ((False, 3), (True, 1), ("batch", 2)):
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        settings = SFTSettings(batch_size=3, packing=packing, max_length=32)
        trainer = build_trainer(model, tokenizer, dataset, tmp_path / f"packing_{packing}", settings)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
        assert batch["input_ids"].shape[0] == rows
        with torch.no_grad():
            losses.append(trainer.compute_loss(trainer.model, dict(batch)))
    assert torch.allclose(losses[0], losses[1], atol=1e-5), losses
    assert torch.allclose(losses[0], losses[2], atol=1e-5), losses


def test_batch_packing_trains_and_changes_every_parameter(tmp_path, tokenizer, base_dir):
    data = write_jsonl(tmp_path / "trajectories.jsonl", [token_exact_trajectory(tokenizer).to_json()] * 6)
    n = len(build_dataset([str(data)], tokenizer, SFTSettings())[0][0]["input_ids"])
    tokens = {}
    for packing in (False, "batch"):
        out = tmp_path / f"sft_{packing}"
        # rows of n tokens: each holds one of the (identical) examples, so both runs compute 3 rows of n a step
        result = run_sft(str(base_dir), [str(data)], out, fast(batch_size=3, max_length=n, packing=packing))
        assert result["steps"] == 2
        before, after = state_dict(base_dir), state_dict(out / MODEL_DIR)
        assert [name for name in before if torch.equal(before[name], after[name])] == []
        tokens[packing] = [json.loads(line)["num_tokens"] for line in (out / METRICS_FILE).read_text().splitlines()]
    assert tokens[False] == tokens["batch"] == [3 * n, 6 * n]


def test_shared_prefix_length_stops_before_the_token_ahead_of_the_first_label():
    """Rows share tokens 0-4; the first label is at position 4, predicted from position 3: the prefix is 0-2."""
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 0], [1, 2, 3, 4, 5, 8, 9, 9]])
    labels = torch.full_like(ids, -100)
    labels[0, 4:7] = ids[0, 4:7]
    labels[1, 6:] = ids[1, 6:]
    mask = torch.tensor([[1] * 7 + [0], [1] * 8])
    assert shared_prefix_length(ids, labels, mask, block=1) == 3
    assert shared_prefix_length(ids, labels, mask, block=2) == 2  # rounded down to whole blocks
    assert shared_prefix_length(ids[:1], labels[:1], mask[:1], block=1) == 0  # one row: nothing to share
    late = torch.full_like(ids, -100)
    late[:, 7] = 5
    assert shared_prefix_length(ids, late, mask, block=1) == 5  # the rows part at position 5
    padded = mask.clone()
    padded[1, 1] = 0
    assert shared_prefix_length(ids, late, padded, block=1) == 1  # a masked token is not shared


@pytest.mark.parametrize("rows_per_chunk", [4, 2, 1])
def test_shared_prefix_gives_the_unshared_loss_and_gradient(tmp_path, tokenizer, base_dir, monkeypatch, rows_per_chunk):
    """Three episodes that share the system prompt and the first observation: the batch computed with the prefix
    run once gives the plain batch's loss, every parameter's gradient and its logged entropy and token accuracy
    (float32), in one chunk of rows or in two (the longest two, then the shortest, each cut to its own width)."""
    monkeypatch.setattr(SharedPrefixSFTTrainer, "PREFIX_BLOCK", 1)
    monkeypatch.setattr(SharedPrefixSFTTrainer, "ROWS_PER_CHUNK", rows_per_chunk)
    episodes = [EPISODE, EPISODE[:2], [EPISODE[0], ("You pick up the apple 1.", "ACTION: go to countertop 1")]]
    data = write_jsonl(tmp_path / "t.jsonl", [token_exact_trajectory(tokenizer, e).to_json() for e in episodes])
    grads, losses, logged = [], [], []
    for packing in (False, "prefix"):
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        settings = SFTSettings(batch_size=3, packing=packing, max_length=256)
        dataset, _ = build_dataset([str(data)], tokenizer, settings)
        trainer = build_trainer(model, tokenizer, dataset, tmp_path / f"prefix_{packing}", settings)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
        first_label = int((batch["labels"] != -100).any(dim=0).nonzero()[0])
        assert shared_prefix_length(batch["input_ids"], batch["labels"], batch["attention_mask"], 1) == first_label - 1
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=(batch["labels"] != -100).sum())
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
        logged.append({k: trainer._metrics["train"][k] for k in ("entropy", "mean_token_accuracy", "num_tokens")})
    assert isinstance(trainer, SharedPrefixSFTTrainer)
    assert torch.allclose(losses[0], losses[1], rtol=1e-5), losses
    assert logged[1]["num_tokens"] == logged[0]["num_tokens"]
    for key in ("entropy", "mean_token_accuracy"):
        assert len(logged[1][key]) == 1 and logged[1][key][0] == pytest.approx(logged[0][key][0], rel=1e-5), key
    for name, grad in grads[0].items():
        assert grad.abs().sum() > 0, name
        assert torch.allclose(grad, grads[1][name], rtol=1e-4, atol=1e-7), name


def test_shared_prefix_training_changes_every_parameter(tmp_path, tokenizer, base_dir, monkeypatch):
    monkeypatch.setattr(SharedPrefixSFTTrainer, "PREFIX_BLOCK", 4)
    shared = []
    monkeypatch.setattr(sft_module, "shared_prefix_length", lambda *a: shared.append(shared_prefix_length(*a)) or shared[-1])
    data = write_jsonl(tmp_path / "trajectories.jsonl", [token_exact_trajectory(tokenizer).to_json()] * 6)
    out = tmp_path / "sft_prefix"
    result = run_sft(str(base_dir), [str(data)], out, fast(batch_size=3, packing="prefix"))
    assert result["steps"] == 2
    assert len(shared) == 2 and min(shared) > 0  # each step ran its batch's prefix once
    before, after = state_dict(base_dir), state_dict(out / MODEL_DIR)
    assert [name for name in before if torch.equal(before[name], after[name])] == []


def test_shared_prefix_refuses_activation_checkpointing(tmp_path, tokenizer, base_dir):
    from turnforge.train.runtime import CHECKPOINTING_FIELD

    dataset = datasets.Dataset.from_dict({"input_ids": [[5, 6, 7]], "completion_mask": [[0, 1, 1]]})
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    settings = SFTSettings(packing="prefix", trl={CHECKPOINTING_FIELD: True})
    with pytest.raises(ValueError, match=f"prefix.*{CHECKPOINTING_FIELD} = false"):
        build_trainer(model, tokenizer, dataset, tmp_path, settings)


def test_shared_prefix_turns_the_gpu_default_checkpointing_off(tmp_path, monkeypatch):
    # The quickstart recipe (packing = "prefix") on a GPU: the machine default turns checkpointing on, the
    # layout turns it off; other packings keep the machine's default.
    from turnforge.train import runtime
    from turnforge.train.runtime import CHECKPOINTING_FIELD

    gpu_defaults = runtime.runtime_args()
    monkeypatch.setattr(runtime, "runtime_args", lambda: {**gpu_defaults, CHECKPOINTING_FIELD: True})
    assert getattr(sft_config(tmp_path, SFTSettings(packing="prefix")), CHECKPOINTING_FIELD) is False
    assert getattr(sft_config(tmp_path, SFTSettings(packing="batch")), CHECKPOINTING_FIELD) is True
    assert getattr(sft_config(tmp_path, SFTSettings()), CHECKPOINTING_FIELD) is True


def test_packing_setting_is_checked():
    with pytest.raises(ValueError, match="sft setting packing='rows': expected"):  # pydantic's, wrapping SettingsError
        SFTSettings(packing="rows")


def test_hf_source_and_max_examples(tmp_path, tokenizer, monkeypatch, caplog):
    """`hf:NAME:SPLIT` goes to `datasets.load_dataset(NAME, split=SPLIT)` (stubbed here: no download)."""
    asked = []

    def fake_load_dataset(name, split):
        asked.append((name, split))
        return datasets.Dataset.from_list([{"messages": chat(), "tools": "[]"}] * 5)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dataset, counts = build_dataset(["hf:org/agent-chats:dev", "hf:org/more"], tokenizer, SFTSettings())
    assert asked == [("org/agent-chats", "dev"), ("org/more", "train")]
    assert len(dataset) == 10 and counts.by_source == {"hf:org/agent-chats:dev": 5, "hf:org/more": 5}

    with caplog.at_level(logging.WARNING, logger="turnforge.train.sft"):
        dataset, counts = build_dataset(["hf:org/more"], tokenizer, SFTSettings(max_examples=3))
    assert len(dataset) == 3 and "max_examples=3" in caplog.text


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_a_cpu_pads_batches_or_falls_back_to_float32(tmp_path, monkeypatch, caplog, native):
    from turnforge.train import runtime
    from turnforge.train.sft import sft_config

    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level(logging.WARNING, logger="turnforge.train.runtime"):
        config = sft_config(tmp_path, SFTSettings(max_steps=1, trl={"bf16": True}))
    assert config.bf16 is native
    assert config.pad_to_multiple_of == (runtime.CPU_BF16_PAD if native else None)
    assert ("no native bf16" in caplog.text) is (not native)
    kept = sft_config(tmp_path, SFTSettings(max_steps=1, trl={"bf16": True, "pad_to_multiple_of": 8}))
    assert kept.pad_to_multiple_of == 8
    assert sft_config(tmp_path, SFTSettings(max_steps=1)).pad_to_multiple_of is None  # float32: nothing changes
