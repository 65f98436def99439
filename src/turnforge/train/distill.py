"""On-policy distillation: the student plays its own episodes, a teacher scores every token it wrote, and the
student learns the per-token reverse KL to the teacher on its own states.

Read top to bottom, one call of `run_distill` does:
  1. load the student and the teacher (`policies.teacher.make_teacher`: `hf:PATH` in-process, `vllm:PATH`,
     `openai:URL` over vLLM's `prompt_logprobs`), and refuse a teacher whose tokenizer is not the student's;
  2. build GRPO's trainer (`train.grpo`: TRL's `GRPOTrainer`, turnforge's rollout engine as its `rollout_func`);
  3. each step, `DistillRollouts` plays `tasks_per_step x num_generations` episodes with the student (token-exact,
     env tokens masked, as GRPO's), then sends each episode's tokens to the teacher, which returns the
     log-probability of every token the student generated;
  4. `DistillTrainer` sets each generated token's advantage to (`distill_advantages`)

         A_t = kl_coef * (log p_teacher(x_t) - log p_student(x_t))  +  reward_weight * A_episode

     where log p_student is the log-probability the student sampled x_t with, and A_episode is GRPO's
     group-normalised env reward (0 by default: pure distillation). TRL's policy-gradient loss then minimises
     -sum_t ratio_t * A_t: on-policy (ratio 1) its gradient is that of the reverse KL to the teacher on the
     student's own states, estimated on the sampled tokens, and its value is the mean per-token reverse KL;
  5. write `model/`, `metrics.jsonl` (TRL's logs) and `rollouts.jsonl`, whose `teacher_kl` is each batch's mean
     of log p_student - log p_teacher over generated tokens: the KL curve of the report.

Two divergences (`divergence`). "sampled" (the default, any teacher) is Thinking Machines' "On-Policy
Distillation" (2025; tinker-cookbook's `distillation` recipe: reverse KL on sampled tokens as a per-token advantage
under an importance-sampling loss), step 4 above. "gkd" is GKD's (Agarwal et al., arXiv 2306.13649): at every
position whose next token the student generated, the generalized JSD between the two models' whole next-token
distributions (`DistillTrainer.gkd_loss`, TRL's `GKDTrainer.generalized_jsd_loss`; `gkd_beta` 0 = forward KL,
1 = reverse KL). It needs the teacher's full distribution, so a teacher in this process; a server gives the
log-probability of the given tokens only (docs/decisions.md, "distill"). TRL's PPO clip applies to "sampled"; with
one update per batch the ratio is 1 and it never clips. Episodes are grouped as GRPO's (TRL needs 2 or more per
task); with `reward_weight` 0 the groups play no part.

    turnforge run quickstart_distill --out runs/qsd      # its stage 06-distill
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from turnforge.eval.curves import quarter_means, read_points
from turnforge.policies.teacher import Teacher, token_logprobs
from turnforge.train.grpo import train_on_episodes
from turnforge.train.grpo_rollouts import EpisodeRollouts
from turnforge.train.grpo_trainer import EpisodeGRPOTrainer, real_spans, row_chunks
from turnforge.train.runtime import train_loss
from turnforge.train.settings import ROLLOUTS_FILE, GRPOSettings
from turnforge.types import Task

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# 1. Settings


class DistillSettings(GRPOSettings):
    """GRPO's settings (the rollouts, the optimizer, LoRA, checkpoints) with distillation's weights and defaults."""

    KIND: ClassVar[str] = "distill"

    divergence: Literal["sampled", "gkd"] = "sampled"
    """What the student minimises on its own episodes. "sampled": the reverse KL estimated on the tokens it sampled
    (Thinking Machines' form; any teacher, servers included). "gkd": GKD's generalized Jensen-Shannon divergence over
    the whole vocabulary at every generated position (TRL's `GKDTrainer.generalized_jsd_loss`; the teacher's full
    next-token distribution, so an in-process teacher: an earlier stage or hf:PATH)."""
    gkd_beta: float = 1.0
    """GKD's beta (divergence "gkd"): 1 = reverse KL(student || teacher), the divergence "sampled" estimates, here
    exact; 0 = forward KL(teacher || student); between = the generalized JSD."""
    kl_coef: float = 1.0
    """Weight of the per-token term log p_teacher - log p_student in each generated token's advantage."""
    reward_weight: float = 0.0
    """Weight of GRPO's episode advantage (the env reward under `rewards`, normalised in its group) added to it;
    0 = pure distillation (the reward components are still logged)."""
    tasks_per_step: int = 8
    num_generations: int = 2
    """Episodes per task; TRL groups them (at least 2). They matter only with `reward_weight` > 0."""
    learning_rate: float = 1e-4
    mask_truncated_completions: bool = False
    """GRPO drops episodes cut by a token limit (their reward is unknown, DAPO); every token the student wrote,
    cut or not, has the teacher's per-token signal, so distillation keeps them."""

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [
            *super()._checks(),
            ("kl_coef", self.kl_coef >= 0, "0 or more"),
            ("reward_weight", self.reward_weight >= 0, "0 or more"),
            ("kl_coef", self.kl_coef > 0 or self.reward_weight > 0, "more than 0 when reward_weight is 0 (no loss)"),
            ("gkd_beta", 0 <= self.gkd_beta <= 1, "in [0, 1]"),
            ("reward_weight", self.divergence == "sampled" or self.reward_weight == 0,
             "0 with divergence \"gkd\" (the env reward mixes into the sampled form's advantages only)"),
            ("step_advantage_weight", self.step_advantage_weight == 0, "0: distill gives every token its own term"),
            ("dynamic_sampling", not self.dynamic_sampling, "false: every episode carries the teacher's signal"),
            ("max_staleness", self.max_staleness == 0, "0: distillation plays its episodes synchronously"),
        ]


# ---------------------------------------------------------------------------------------------------------------
# 2. The per-token advantage (the loss is TRL's)


def distill_advantages(student_logps: torch.Tensor, teacher_logps: torch.Tensor, mask: torch.Tensor,
                       kl_coef: float, episode_advantages: torch.Tensor | None = None,
                       reward_weight: float = 0.0) -> torch.Tensor:
    """(B, T) advantages: kl_coef x (teacher - student) on generated tokens (`mask` 1), 0 elsewhere, plus
    reward_weight x each row's (B,) episode advantage.

    >>> distill_advantages(torch.tensor([[-0.5, -1.0, -2.0]]), torch.tensor([[-0.25, -2.0, -1.0]]),
    ...                    torch.tensor([[1, 1, 0]]), kl_coef=1.0)
    tensor([[ 0.2500, -1.0000,  0.0000]])
    """
    advantages = kl_coef * (teacher_logps - student_logps) * mask
    if episode_advantages is not None and reward_weight:
        advantages = advantages + reward_weight * episode_advantages.unsqueeze(1)
    return advantages


def mean_reverse_kl(student_logps: Sequence[Sequence[float]], teacher_logps: Sequence[Sequence[float]],
                    masks: Sequence[Sequence[int]]) -> float:
    """The sampled-token estimate of the reverse KL per generated token: mean of student - teacher where mask is 1."""
    total = count = 0.0
    for s_row, t_row, m_row in zip(student_logps, teacher_logps, masks, strict=True):
        for s, t, m in zip(s_row, t_row, m_row, strict=True):
            total, count = total + m * (s - t), count + m
    return total / count if count else 0.0


def full_reverse_kl(student, teacher, sequences: Sequence[Sequence[int]], masks: Sequence[Sequence[int]]) -> float:
    """The exact reverse KL(student || teacher) over the whole vocabulary, averaged over the positions where
    `masks` is 1 (a sequence's mask covers all its tokens): for measuring a fixed batch, not for training."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, mask in zip(sequences, masks, strict=True):
            x = torch.tensor([list(ids)])
            s = torch.log_softmax(student(input_ids=x).logits[0, :-1].float(), -1)
            t = torch.log_softmax(teacher(input_ids=x).logits[0, :-1].float(), -1)
            kl = (s.exp() * (s - t)).sum(-1)  # position p - 1 predicts token p
            where = torch.tensor(list(mask[1:]), dtype=torch.bool)
            total, count = total + float(kl[where].sum()), count + int(where.sum())
    return total / max(count, 1)


# ---------------------------------------------------------------------------------------------------------------
# 3. The rollouts: GRPO's, each episode scored by the teacher


class DistillRollouts(EpisodeRollouts):
    """GRPO's rollout function; after each batch the teacher scores the episodes' tokens (`teacher_logps`)."""

    def __init__(self, *args, teacher: Teacher, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.teacher = teacher
        self.student_logps: list[list[float]] | None = None
        """The last batch's sampled log-probability of each completion token, in output order (0 on env tokens)."""
        self.teacher_logps: list[list[float]] | None = None
        """The teacher's log-probability of the same tokens (0 on env tokens)."""
        self.teacher_kl: float | None = None

    def _to_trl(self, episodes) -> dict[str, list]:
        out = super()._to_trl(episodes)
        sequences = [p + c for p, c in zip(out["prompt_ids"], out["completion_ids"], strict=True)]
        scored = self.teacher.score(sequences, [len(p) for p in out["prompt_ids"]])
        self.teacher_logps = [[t * m for t, m in zip(row, mask, strict=True)]
                              for row, mask in zip(scored, out["env_mask"], strict=True)]
        self.student_logps = out["logprobs"]
        self.teacher_kl = mean_reverse_kl(self.student_logps, self.teacher_logps, out["env_mask"])
        return out

    def batch_metrics(self) -> dict[str, float]:
        return {"teacher_kl": round(self.teacher_kl, 6)} if self.teacher_kl is not None else {}


class DistillTrainer(EpisodeGRPOTrainer):
    """GRPO's trainer whose advantages are distillation's per-token ones (`distill_advantages`)."""

    def token_advantages(self, advantages, completion_ids):
        rollouts: DistillRollouts = self.rollout_func
        teacher, rollouts.teacher_logps = rollouts.teacher_logps, None
        student, rollouts.student_logps = rollouts.student_logps, None
        if teacher is None or student is None or len(teacher) != len(advantages):
            raise RuntimeError(f"teacher scores for {0 if teacher is None else len(teacher)} episodes, TRL has "
                               f"{len(advantages)}")
        s = torch.zeros(completion_ids.shape, dtype=torch.float32, device=advantages.device)
        t, mask = s.clone(), s.clone()
        for row, (s_row, t_row) in enumerate(zip(student, teacher, strict=True)):
            n = min(len(t_row), s.shape[1])
            s[row, :n] = torch.tensor(s_row[:n])
            t[row, :n] = torch.tensor(t_row[:n])
            mask[row, :n] = 1.0
        settings: DistillSettings = rollouts.settings
        return distill_advantages(s, t, mask, settings.kl_coef, advantages, settings.reward_weight).to(advantages.dtype)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.rollout_func.settings.divergence == "sampled":
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        return self.gkd_loss(model, inputs)

    def gkd_loss(self, model, inputs) -> torch.Tensor:
        """GKD's divergence between the student's and the teacher's next-token distributions at every position
        whose next token the student generated (env tokens excluded), summed with TRL's `generalized_jsd_loss` and
        normalised as TRL's dapo loss is (per token over the accumulation window). Rows run `ROWS_PER_CHUNK` at a
        time, laid out as `score_tokens` lays them out (`row_chunks`)."""
        from trl.experimental.gkd import GKDTrainer

        settings: DistillSettings = self.rollout_func.settings
        teacher = self.rollout_func.teacher.model
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        generated = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        scored = torch.cat([torch.zeros_like(inputs["prompt_mask"]), generated], dim=1).bool()
        spans = real_spans(torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1))
        if spans is None:  # TRL pads prompts on the left and completions on the right: one run per row
            raise RuntimeError("distill gkd: a row's tokens are not one run (prompt and completion masks)")
        pad = self.processing_class.pad_token_id if self.processing_class.pad_token_id is not None else 0
        total = input_ids.new_zeros((), dtype=torch.float32)
        for chunk, ids in row_chunks(input_ids, dict(enumerate(spans)), self.ROWS_PER_CHUNK, pad):
            predicts = torch.zeros_like(ids, dtype=torch.bool)  # position t's output predicts a generated token t + 1
            for k, r in enumerate(chunk):
                start, end = spans[r]
                predicts[k, : end - start - 1] = scored[r, start + 1 : end]
            with self.accelerator.autocast():
                student = model(input_ids=ids).logits[predicts].float()
            with torch.no_grad():
                target = teacher(input_ids=ids.to(teacher.device)).logits[predicts.to(teacher.device)].float()
            total = total + GKDTrainer.generalized_jsd_loss(student, target.to(student.device), beta=settings.gkd_beta,
                                                            reduction="sum")
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if model.training:  # as TRL's: in eval the batch is neither split across steps nor accumulated
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return total / normalizer


# ---------------------------------------------------------------------------------------------------------------
# 4. The run


def run_distill(
    model: str,
    teacher: Teacher,
    env_name: str,
    env_options: dict[str, Any],
    tasks: list[Task],
    out_dir: Path,
    settings: DistillSettings,
    adapter: str | None = None,
) -> dict[str, Any]:
    """Distill `teacher` into `model` on-policy on `tasks` of `env_name`; writes out_dir/model, metrics.jsonl,
    rollouts.jsonl (with `teacher_kl` per batch)."""
    start = time.perf_counter()
    out_dir = Path(out_dir)
    if settings.divergence == "gkd" and not isinstance(getattr(teacher, "model", None), torch.nn.Module):
        raise ValueError(f"teacher {teacher.name}: divergence \"gkd\" needs the teacher's whole next-token "
                         "distribution, so a model in this process (hf:PATH or an earlier stage)")

    def rollouts_for(tokenizer: Any) -> DistillRollouts:
        teacher.check_tokenizer(tokenizer)  # before any episode: a foreign tokenizer is one error
        return DistillRollouts(env_name, env_options, tasks, tokenizer, settings, out_dir / ROLLOUTS_FILE,
                               teacher=teacher)

    result, rollouts = train_on_episodes("distill", model, env_name, env_options, tasks, out_dir, settings, adapter,
                                         DistillTrainer, rollouts_for)
    kl = quarter_means([y for _, y in read_points(out_dir / ROLLOUTS_FILE, "batch", "teacher_kl")])
    return {
        "steps": int(result.global_step),
        "train_loss": train_loss(result),
        "episodes": rollouts.episodes,
        "teacher": teacher.name,
        # the per-token reverse KL to the teacher on the student's own episodes, first and last quarter of the batches
        "teacher_kl_quarters": [round(v, 4) for v in kl] if kl else None,
        "wall_s": round(time.perf_counter() - start, 3),
    }


__all__ = ["DistillRollouts", "DistillSettings", "DistillTrainer", "distill_advantages", "full_reverse_kl",
           "mean_reverse_kl", "run_distill", "token_logprobs"]
