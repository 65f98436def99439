"""On-policy distillation: the per-token loss by hand, 2 steps lower the KL to the teacher, the teachers score
tokens alike in-process and over `turnforge serve`'s prompt_logprobs, a foreign tokenizer is one clear error."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.envs.base import load_tasks, make_env
from turnforge.models import load_model
from turnforge.policies.hf import HFPolicy
from turnforge.policies.teacher import (
    HFTeacher,
    OpenAITeacher,
    TokenizerMismatch,
    same_tokenizer,
    token_logprobs,
)
from turnforge.recipes import load_recipe
from turnforge.rewards import COMPONENTS
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.distill import (
    DistillRollouts,
    DistillSettings,
    DistillTrainer,
    distill_advantages,
    full_reverse_kl,
    run_distill,
)
from turnforge.train.grpo import component_reward, grpo_config, task_dataset
from turnforge.types import SamplingParams

ENV_OPTIONS = {"format": "act_line", "max_steps": 3}


# ---------------------------------------------------------------------------------------------------------------
# The loss


def test_the_loss_on_three_hand_made_tokens_is_the_mean_reverse_kl(tiny_model_dir, tmp_path):
    """Student sampled log-probs s = (-0.5, -1.0, -2.0), teacher t = (-0.25, -2.0, -1.0), kl_coef 1:
    advantages A = t - s = (0.25, -1.0, 1.0). TRL's loss (dapo, one update: ratio exp(logp - logp.detach()) = 1,
    unclipped) is -sum(A) / 3 tokens = -(0.25 - 1.0 + 1.0) / 3 = -0.25 / 3 = -0.083333..., i.e. the mean of
    s - t = (-0.25 + 1.0 - 1.0) / 3: the sampled-token estimate of the reverse KL per token. With reward_weight 0.5
    and an episode advantage of 2.0, every token gains 1.0: A = (1.25, 0.0, 2.0), loss = -3.25 / 3."""
    s = torch.tensor([[-0.5, -1.0, -2.0]])
    t = torch.tensor([[-0.25, -2.0, -1.0]])
    mask = torch.ones(1, 3)
    assert torch.allclose(distill_advantages(s, t, mask, 1.0), torch.tensor([[0.25, -1.0, 1.0]]))
    mixed = distill_advantages(s, t, mask, 1.0, torch.tensor([2.0]), reward_weight=0.5)
    assert torch.allclose(mixed, torch.tensor([[1.25, 0.0, 2.0]]))

    trainer = _trainer(tiny_model_dir, tmp_path, DistillSettings(steps=1, tasks_per_step=1))
    trainer.model.eval()  # eval mode: TRL's dapo normaliser is then the batch's token count, no accumulation
    inputs = {
        "prompt_ids": torch.tensor([[5, 6, 7]]), "prompt_mask": torch.ones(1, 3, dtype=torch.long),
        "completion_ids": torch.tensor([[8, 9, 10]]), "completion_mask": torch.ones(1, 3, dtype=torch.long),
        "num_items_in_batch": torch.tensor(3.0),
    }
    loss = trainer._compute_loss(trainer.model, {**inputs, "advantages": distill_advantages(s, t, mask, 1.0)})
    assert loss.item() == pytest.approx(-0.25 / 3, abs=1e-6)
    loss = trainer._compute_loss(trainer.model, {**inputs, "advantages": mixed})
    assert loss.item() == pytest.approx(-3.25 / 3, abs=1e-6)


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_gkd_loss_is_the_kl_over_the_vocabulary_at_each_generated_position(
        beta, tiny_model_dir, household_sft_model_dir, tmp_path):
    """divergence "gkd": the loss is KL over the whole vocabulary — forward KL(teacher || student) at beta 0,
    reverse KL(student || teacher) at beta 1 — summed over the positions whose next token the student generated,
    over that count. Two rows (prompts of 3 and 2 tokens, TRL's left padding), the first row's middle completion
    token an env token (tool_mask 0): 3 generated tokens; the expected value is computed here directly from each
    model's logits on each unpadded sequence."""
    settings = DistillSettings(steps=1, tasks_per_step=1, divergence="gkd", gkd_beta=beta)
    trainer = _trainer(household_sft_model_dir, tmp_path, settings)
    teacher, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    trainer.rollout_func.teacher = HFTeacher(teacher, None)
    trainer.model.eval()  # the normaliser is then the batch's token count (no accumulation)
    inputs = {
        "prompt_ids": torch.tensor([[5, 6, 7], [0, 11, 12]]), "prompt_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]),
        "completion_ids": torch.tensor([[8, 9, 10], [13, 0, 0]]), "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1], [1, 1, 1]]), "num_items_in_batch": torch.tensor(3.0),
    }
    expected = []
    for ids, scored in (([5, 6, 7, 8, 9, 10], [3, 5]), ([11, 12, 13], [2])):  # index of each generated token
        with torch.no_grad():
            s = torch.log_softmax(trainer.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            t = torch.log_softmax(teacher(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        p, q = (t, s) if beta == 0 else (s, t)  # KL(p || q)
        expected += [float((p[i - 1].exp() * (p[i - 1] - q[i - 1])).sum()) for i in scored]
    assert trainer.compute_loss(trainer.model, inputs).item() == pytest.approx(sum(expected) / 3, rel=1e-4)


def test_gkd_needs_a_teacher_in_this_process(tmp_path):
    result = CliRunner().invoke(app, ["run", "quickstart_distill", "--out", str(tmp_path / "r"), "--check",
                                      "--set", "stages.distill.divergence=gkd",
                                      "--set", "stages.distill.teacher=openai:http://127.0.0.1:8000/v1"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "divergence \"gkd\" needs the teacher's whole next-token distribution" in result.output
    with pytest.raises(ValueError, match="divergence \"gkd\" needs the teacher's whole next-token distribution"):
        run_distill("unused", OpenAITeacher("http://127.0.0.1:1/v1", "m"), "household", ENV_OPTIONS, [], tmp_path,
                    DistillSettings(divergence="gkd"))


class _FixedTeacher:
    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value

    def check_tokenizer(self, tokenizer) -> None:
        pass

    def score(self, sequences, starts):
        return [[self.value] * (len(s) - k) for s, k in zip(sequences, starts, strict=True)]


def test_the_trainer_gives_each_generated_token_teacher_minus_student(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, DistillSettings(steps=1, tasks_per_step=1, kl_coef=2.0))
    rollouts = trainer.rollout_func
    rollouts.student_logps = [[-1.0, 0.0, -3.0], [-0.5]]  # row 0: a generated, an env, a generated token
    rollouts.teacher_logps = [[-2.0, 0.0, -1.0], [-0.5]]
    advantages = trainer.token_advantages(torch.tensor([0.7, -0.7]), torch.zeros(2, 3, dtype=torch.long))
    assert torch.allclose(advantages, torch.tensor([[-2.0, 0.0, 4.0], [0.0, 0.0, 0.0]]))  # reward_weight 0
    with pytest.raises(RuntimeError, match="teacher scores for 0 episodes"):
        trainer.token_advantages(torch.tensor([0.7, -0.7]), torch.zeros(2, 3, dtype=torch.long))


def _trainer(model_dir, out_dir, settings: DistillSettings) -> DistillTrainer:
    model, tokenizer = load_model(str(model_dir), dtype="float32", device="cpu")
    tasks = load_tasks("household", "train", limit=2, **ENV_OPTIONS)
    rollouts = DistillRollouts("household", ENV_OPTIONS, tasks, tokenizer, settings, teacher=_FixedTeacher(-1.0))
    return DistillTrainer(
        model=model, reward_funcs=[component_reward(n) for n in COMPONENTS], args=grpo_config(out_dir, settings),
        train_dataset=task_dataset("household", ENV_OPTIONS, tasks), processing_class=tokenizer, rollout_func=rollouts,
    )


# ---------------------------------------------------------------------------------------------------------------
# Two steps on the tiny model


@pytest.mark.parametrize("divergence", ["sampled", "gkd"])
def test_two_distill_steps_change_the_parameters_and_lower_the_kl_on_a_fixed_batch(
        divergence, tiny_model_dir, household_sft_model_dir, tmp_path):
    """Student: the tiny model after 20 SFT steps; teacher: the untrained tiny model (same tokenizer, a very
    different distribution: KL ~4.9 nats per token). The fixed batch: 8 episodes the student played before
    training; KL = the exact reverse KL over the vocabulary on their generated tokens, before and after 2 steps
    (measured 4.89 -> 3.36). The other way round (an untrained student sampling near-uniformly from thousands of
    tokens) the sampled estimate carries too little signal for 2 steps to show."""
    student, tokenizer = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    teacher = HFTeacher.load(str(tiny_model_dir), device="cpu")
    sequences, masks = _fixed_batch(student, tokenizer)
    before = full_reverse_kl(student, teacher.model, sequences, masks)

    settings = DistillSettings(steps=2, tasks_per_step=2, num_generations=2, max_new_tokens=12, learning_rate=1e-3,
                               logging_steps=1, divergence=divergence)
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    result = run_distill(str(household_sft_model_dir), teacher, "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 2 and result["episodes"] == 8

    after_model, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after_model.named_parameters())
    unchanged = [n for n, p in student.named_parameters() if torch.equal(p, trained[n])]
    assert unchanged == []
    after = full_reverse_kl(after_model, teacher.model, sequences, masks)
    assert after < before - 0.5
    batches = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(batches) == 2 and all(b["teacher_kl"] > 0 for b in batches)
    logs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    if divergence == "sampled":  # TRL's loss is the mean sampled reverse KL (one update a batch: ratio 1), teacher_kl
        assert [round(row["loss"], 3) for row in logs] == [round(b["teacher_kl"], 3) for b in batches]
    else:  # the mean forward KL over the vocabulary: positive, and not the sampled reverse estimate
        assert all(row["loss"] > 0 for row in logs)


def _fixed_batch(model, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """8 sampled episodes of the model: (prompt + completion ids, 1 on generated ids)."""
    from turnforge.train.grpo_rollouts import episode_sequence

    policy = HFPolicy.from_model(model, tokenizer, batch_size=8, model_id="student")
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    episodes = run_episodes(policy, lambda: make_env("household", **ENV_OPTIONS), tasks, 2, RolloutLimits(max_open=8),
                            SamplingParams(temperature=1.0, max_new_tokens=12, seed=1), renderer=policy.renderer)
    sequences, masks = [], []
    for traj in episodes:
        prompt, completion, mask, _ = episode_sequence(traj, 4096)
        sequences.append(prompt + completion)
        masks.append([0] * len(prompt) + mask)
    return sequences, masks


# ---------------------------------------------------------------------------------------------------------------
# Teachers: in-process and over `turnforge serve`


def test_serve_prompt_logprobs_are_vllms_shape_and_hfs_own_logprobs(tiny_model_dir):
    from turnforge.policies.serve import ServedModel, running_server

    served = ServedModel(str(tiny_model_dir), name="tiny", device="cpu", dtype="float32")
    ids = served.tokenizer.encode("ACTION: go to countertop 1", add_special_tokens=False)
    sequences = [ids, ids[:3] + ids[:2]]
    own = token_logprobs(served.hf.model, sequences, [0, 2])
    with running_server(served) as url:
        body = {"model": "tiny", "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
        answer = _post(url + "/completions", body)
        remote = OpenAITeacher(url)  # no #model: the server's only one
        remote.check_tokenizer(served.tokenizer)
        scored = remote.score(sequences, [0, 2])
        refused = _post(url + "/completions", {"model": "tiny", "prompt": ids, "max_tokens": 5}, expect=400)
    positions = answer["choices"][0]["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(ids)
    for p in range(1, len(ids)):
        entry = positions[p]
        assert str(ids[p]) in entry and 2 <= len(entry) <= 3  # the token there and the 2 most likely
        here = entry[str(ids[p])]
        assert here["logprob"] == pytest.approx(own[0][p], abs=1e-4)
        assert here["decoded_token"] == served.tokenizer.decode([ids[p]])
        assert min(e["rank"] for e in entry.values()) == 1 and here["rank"] >= 1
    for got, want in zip(scored, own, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert own[0][0] == 0.0 and len(own[1]) == 3  # no prefix for the first token; scored from start on
    assert refused["error"]["param"] == "max_tokens"


def _post(url: str, body: dict, expect: int = 200) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            status, data = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    assert status == expect, data
    return json.loads(data)


def test_a_teacher_with_another_tokenizer_is_one_clear_error(tiny_model_dir):
    _, student = load_model(str(tiny_model_dir), device="cpu")
    _, other = load_model(str(tiny_model_dir), device="cpu")
    same_tokenizer(student, other, "hf:same")  # the same tokenizer passes
    other.add_tokens(["<teacher-only>"])
    with pytest.raises(TokenizerMismatch, match=r"teacher hf:other and the student do not share a tokenizer: "
                                                r"vocabularies differ \(\d+ vs \d+ tokens; e.g. '<teacher-only>'\)"):
        same_tokenizer(student, other, "hf:other")
    remote = OpenAITeacher("http://127.0.0.1:1/v1", "m")
    remote.check_tokenizer(student)
    token = student.encode("ACTION", add_special_tokens=False)[0]
    with pytest.raises(TokenizerMismatch, match=f"token id {token} is 'ACTION' for the student and 'ACT' for the "):
        remote._check_token(token, "ACT")


# ---------------------------------------------------------------------------------------------------------------
# The stage and the recipes


def test_the_distill_recipes_load_and_name_their_teacher():
    quick = load_recipe("quickstart_distill")
    distill = quick.stage("distill")
    assert distill.model_reads(quick.stages) == ["sft-teacher"] and quick.stage("sft-teacher").max_steps == 1000
    assert quick.model_source(quick.stages.index(distill)) == "sft-student"
    gpu = load_recipe("qwen3_distill")
    assert gpu.stage("distill").teacher.startswith("openai:") and gpu.stage("distill").model_reads(gpu.stages) == []


def test_a_teacher_that_is_no_earlier_stage_is_refused_at_check(tmp_path):
    result = CliRunner().invoke(app, ["run", "quickstart_distill", "--out", str(tmp_path / "r"), "--check",
                                      "--set", "stages.distill.teacher=sft-nobody"])
    assert result.exit_code != 0
    assert "teacher 'sft-nobody' is no earlier training stage (sft-teacher, sft-student)" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["run", "quickstart_distill", "--out", str(tmp_path / "r"), "--check",
                                      "--set", "stages.distill.teacher=expert"])
    assert result.exit_code != 0 and "no earlier training stage" in result.output


@pytest.mark.slow  # 11 min on this loaded 2-core machine: two SFT stages, three evals of rambling models
def test_quickstart_distill_runs_end_to_end_with_small_overrides(tmp_path):
    """The recipe on a fresh directory, every stage at a few steps and tasks (the full run: docs/distill.md)."""
    sets = ["stages.collect.tasks=16", "stages.sft-teacher.max_steps=4", "stages.sft-student.max_steps=2",
            "stages.eval-teacher.tasks=2", "stages.eval-student.tasks=2", "stages.distill.steps=1",
            "stages.distill.tasks_per_step=2", "stages.distill.max_completion_length=256", "stages.eval-distill.tasks=2"]
    args = ["run", "quickstart_distill", "--out", str(tmp_path)]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    done = json.loads((tmp_path / "stages/06-distill/done.json").read_text())["result"]
    assert done["steps"] == 1 and done["teacher"].startswith("hf:") and done["teacher"].endswith("02-sft-teacher/model")
    assert (tmp_path / "stages/06-distill/model").is_dir()
    assert "reverse KL to the teacher" in (tmp_path / "report.md").read_text()
