"""DPO training on the tiny model: parameters move, the chosen-vs-rejected margin grows, the loss is on the reply.

The pairs are fixed household decision points: after the first observation, a valid "go to" (chosen) against
"fly to the moon" (rejected, the env answers "Nothing happens.").
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run_documents import assert_documented
from turnforge.data.dpo_pairs import PAIR_KEYS, Pair, save_pairs
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


def test_sft_weight_adds_the_chosen_replies_nll_to_the_preference_loss(tiny_model_dir, pairs_file, tmp_path):
    """At step 1 the policy is its reference, so the sigmoid loss is ln 2; the "sft" term adds w x the chosen
    reply's mean token NLL: the excess over ln 2 is positive and doubles when w does."""
    first = {}
    for weight in (0.0, 0.5, 1.0):
        settings = DPOSettings(max_steps=1, logging_steps=1, batch_size=2, sft_weight=weight)
        run_dpo(str(tiny_model_dir), [str(pairs_file)], tmp_path / str(weight), settings)
        first[weight] = _metrics(tmp_path / str(weight))[0]["loss"]
    assert first[0.0] == pytest.approx(math.log(2), abs=1e-4)
    excess = {w: first[w] - math.log(2) for w in (0.5, 1.0)}
    assert excess[0.5] > 0.1 and excess[1.0] == pytest.approx(2 * excess[0.5], rel=1e-3), first


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
    trainer = build_trainer(lm, tokenizer, preference_dataset(pairs, DPOSettings(), tokenizer), tmp_path, DPOSettings())
    row = trainer.train_dataset[0]
    assert tokenizer.decode(row["prompt_ids"]).endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(row["chosen_ids"]).startswith(pairs[0].chosen + "<|im_end|>")
    assert tokenizer.decode(row["rejected_ids"]).startswith("ACTION: fly to the moon<|im_end|>")


def test_window_keeps_the_last_turns_of_the_history(tiny_model_dir):
    tokenizer = load_model(tiny_model_dir, dtype="float32", device="cpu")[1]
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(3):
        history += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"o{i}"}]
    ds = preference_dataset([Pair(history, "c", "r", "loop")], DPOSettings(window=1), tokenizer)
    kept = [history[i] for i in (0, 1, 6, 7)]
    assert ds[0]["prompt_ids"] == tokenizer.apply_chat_template(kept, add_generation_prompt=True)["input_ids"]
    assert ds[0]["chosen_ids"] == tokenizer.encode("c<|im_end|>", add_special_tokens=False)


def test_a_pair_trains_the_ids_an_episode_of_its_family_holds(tmp_path):
    """The rows are the rollouts' renderer's: a thinking model's earlier reasoning stays in the prompt (TRL's training
    template, where its own template would drop it), gpt-oss's replies are harmony messages ending on their stop
    token (its template refuses channel tags in content)."""
    from turnforge.formats.chat_template import chat_renderer
    from turnforge.tiny_model import build_tiny_model

    history = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "<think>\nR1\n</think>\n\nACTION: look"},
               {"role": "user", "content": "You see a desk 1."}]
    tokenizer = load_model(build_tiny_model(tmp_path / "thinking", family="qwen3_thinking"), device="cpu")[1]
    (row,) = preference_dataset([Pair(history, "<think>\nR2\n</think>\n\nACTION: go", "x", "loop")], DPOSettings(),
                                tokenizer)
    assert "R1" in tokenizer.decode(row["prompt_ids"])
    whole = tokenizer.apply_chat_template(
        [*history, {"role": "assistant", "content": "<think>\nR2\n</think>\n\nACTION: go"}],
        chat_template=chat_renderer(tokenizer).template)["input_ids"]
    ids = row["prompt_ids"] + row["chosen_ids"]
    assert whole[: len(ids)] == ids and tokenizer.decode(whole[len(ids):]) == "\n"  # the template's newline after <|im_end|>
    tokenizer = load_model(build_tiny_model(tmp_path / "gptoss", family="gptoss"), device="cpu")[1]
    history = [{"role": "user", "content": "task"}]
    call = '<|channel|>commentary to=functions.act <|constrain|>json<|message|>{"action": "look"}'
    (row,) = preference_dataset([Pair(history, call, "<|channel|>final<|message|>no", "loop")], DPOSettings(), tokenizer)
    assert tokenizer.decode(row["chosen_ids"]) == call + "<|call|>"
    assert tokenizer.decode(row["rejected_ids"]) == "<|channel|>final<|message|>no<|return|>"
    assert tokenizer.decode(row["prompt_ids"]).endswith("<|start|>user<|message|>task<|end|><|start|>assistant")


def test_bad_settings_and_no_pairs_are_clear_errors():
    with pytest.raises(ValueError, match="dpo setting beta=0"):
        DPOSettings(beta=0)
    with pytest.raises(ValueError, match="loss_type"):
        DPOSettings(loss_type="nope")
    with pytest.raises(ValueError, match="no pairs"):
        preference_dataset([], DPOSettings(), None)


# ---- the recipes, on the tiny model ------------------------------------------------------------------------------

TINY_BUDGET = [
    'model.dtype="auto"',
    "env.options.receptacles=0.3",
    "env.options.distractors=0",
    "stages.collect.tasks=4",
    "stages.sft.max_steps=2",
    "stages.sft.batch_size=2",
    "stages.sft.grad_accum=1",
    "stages.sft.max_length=512",
    "stages.sft.window=1",
    "stages.sft.lora.r=8",
    "stages.collect-policy.tasks=2",
    "stages.collect-policy.max_turns=3",
    "stages.collect-policy.max_new_tokens=16",
    "stages.dpo.max_steps=2",
    "stages.dpo.learning_rate=1e-3",
    "stages.dpo.logging_steps=1",
    "stages.dpo.grad_accum=1",
    "stages.dpo.batch_size=1",
    "stages.dpo.window=1",
    "stages.dpo.max_length=512",
    "stages.dpo.warmup_ratio=0.0",
    *(f"stages.{e}.{k}" for e in ("eval-sft", "eval-dpo") for k in ("tasks=2", "max_turns=2", "max_new_tokens=16")),
]


@pytest.mark.slow  # ~60 s on 2 shared cores: two trainings and four rollout stages
def test_alfworld_dpo_recipe_runs_on_the_tiny_model(tmp_path):
    """collect -> sft -> collect-policy -> dpo -> evals, two training steps each: pairs mined, DPO weights moved."""
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    out = tmp_path / "run"
    summary = run_recipe(load_recipe("alfworld_dpo", overrides=TINY_BUDGET, model="tiny"), out, console=Console(quiet=True))
    assert_documented(out)
    result = summary["stages"]["dpo"]["result"]
    stage = out / "stages/04-dpo"
    pairs = [json.loads(line) for line in (stage / "pairs.jsonl").read_text().splitlines()]
    assert pairs and result["pairs_by_reason"] == dict(Counter(p["reason"] for p in pairs))
    assert result["steps"] == 2 and result["mining"]["episodes"] == 4
    sft = load_file(out / "stages/02-sft/model/model.safetensors")
    dpo = load_file(stage / "model/model.safetensors")
    assert any(not torch.equal(sft[k], dpo[k]) for k in sft)
    assert set(summary["eval"]) == {"sft", "dpo"}


IRONGUARD_BUDGET = [
    'model.dtype="auto"',
    "env.options.receptacles=0.3",
    "env.options.distractors=0",
    "stages.collect-policy.tasks=2",
    "stages.collect-policy.max_turns=3",
    "stages.collect-policy.max_new_tokens=16",
    *(f"stages.collect-sql.{k}" for k in ("tasks=2", "max_turns=3", "max_new_tokens=16")),
    "stages.dpo.max_steps=2",
    "stages.dpo.logging_steps=1",  # a logged step: the report plots its loss
    "stages.dpo.learning_rate=1e-3",
    "stages.dpo.grad_accum=1",
    "stages.dpo.batch_size=1",
    "stages.dpo.window=1",
    "stages.dpo.max_length=512",
    *(
        f"stages.{e}.{k}"
        for e in ("eval-base", "eval-dpo", "eval-sql-base", "eval-sql-dpo")
        for k in ("tasks=2", "max_turns=2", "max_new_tokens=16")
    ),
]


def test_agentbench_ironguard_runs_on_the_tiny_model_over_household_and_sql(tmp_path, tiny_model_dir):  # ~60 s
    """Both collect stages (household, and the SQL env in DBBench's format) feed one DPO stage, whose chosen
    replies a teacher served by `turnforge serve` (the tiny model here; a Qwen3-30B in the seed) writes first."""
    pytest.importorskip("fastapi")
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.policies.serve import ServedModel, running_server
    from turnforge.recipes import load_recipe

    with running_server(ServedModel(str(tiny_model_dir), name="teacher", device="cpu")) as url:
        teacher = [f'stages.dpo.teacher="openai:{url}#teacher"', "stages.dpo.teacher_max_new_tokens=16"]
        recipe = load_recipe("agentbench_ironguard", overrides=IRONGUARD_BUDGET + teacher, model="tiny")
        summary = run_recipe(recipe, tmp_path / "run", console=Console(quiet=True))
    assert_documented(tmp_path / "run")
    result = summary["stages"]["dpo"]["result"]
    asked = result["mining"]["teacher_rejected"] + result["mining"]["chosen_from"].get("teacher", 0)
    assert asked > 0
    reasons = {"verbose", "loop", "format", "sql_error", "wrong_table", "answer_without_query"}
    assert result["steps"] == 2 and set(result["pairs_by_reason"]) <= reasons
    assert result["mining"]["episodes"] == 8  # 2 tasks x 2 samples in each env
    pairs = [json.loads(line) for line in (tmp_path / "run/stages/03-dpo/pairs.jsonl").read_text().splitlines()]
    ids = {p["task_id"] for p in pairs}
    assert any(i.startswith("sql-") for i in ids) and any(not i.startswith("sql-") for i in ids), ids
    assert set(summary["eval"]) == {"base", "dpo", "sql-base", "sql-dpo"}


@pytest.mark.parametrize(("name", "budget"), [("alfworld_dpo", TINY_BUDGET), ("agentbench_ironguard", IRONGUARD_BUDGET)])
def test_dpo_recipes_parse_with_the_seed_settings(name, budget):
    from turnforge.recipes import load_recipe

    dpo = load_recipe(name).stage("dpo")
    assert dpo.beta == 0.1 and dpo.max_length == 2048
    if name == "alfworld_dpo":
        assert (dpo.learning_rate, dpo.epochs, dpo.lora.r, dpo.lora.alpha, dpo.lora.dropout) == (8e-7, 1, 64, 128, 0.0)
        assert dpo.model == "sft" and load_recipe(name).stage("sft").merge
    else:
        assert dpo.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert load_recipe(name, overrides=budget, model="tiny").stage("dpo").max_steps == 2


STAGE_RECIPE = """\
[model]
name = "{model}"

[env]
name = "household"

[env.options]
receptacles = 0.3
distractors = 0

[[stages]]
kind = "collect"
policy = "{policy}"
tasks = 2
max_turns = 6

[[stages]]
kind = "dpo"
data = ["collect"]
model = "base"
max_steps = 1
batch_size = 2
window = 1
max_length = 512
"""


def _stage_run(tmp_path, model: str, policy: str):
    from rich.console import Console

    from turnforge.pipeline import run_recipe
    from turnforge.recipes import load_recipe

    path = tmp_path / "r.toml"
    path.write_text(STAGE_RECIPE.format(model=model, policy=policy))
    return run_recipe(load_recipe(path), tmp_path / "run", console=Console(quiet=True))


def test_dpo_stage_mines_random_rollouts_and_trains(tiny_model_dir, tmp_path):
    summary = _stage_run(tmp_path, str(tiny_model_dir), "random")
    result = summary["stages"]["dpo"]["result"]
    pairs = [json.loads(line) for line in (tmp_path / "run/stages/02-dpo/pairs.jsonl").read_text().splitlines()]
    assert pairs and set(PAIR_KEYS) <= set(pairs[0])
    assert result["pairs_by_reason"] == dict(Counter(p["reason"] for p in pairs)) and result["steps"] == 1
    assert (tmp_path / "run" / result["model"] / "config.json").is_file()


def test_dpo_stage_without_pairs_says_why(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="no DPO pairs: 2 episodes replayed, 0 defective"):
        _stage_run(tmp_path, str(tiny_model_dir), "expert")
