"""What each trainer can be told: `SFTSettings`, `DPOSettings`, `GRPOSettings` (pydantic models, no torch).

They are the one source of truth for a training stage's fields: a training stage's config derives from its
trainer's settings (`class SFTStage(TrainStage, SFTSettings)`; rft holds an `SFTSettings` as its `train` table),
and the trainer receives that object itself, so a recipe and a trainer cannot disagree on a name, a type or a
default, and nothing copies one into the other. What every trainer shares (learning rate, LoRA, checkpoints,
logging, seed, the `trl` table) is declared once, in `TrainerSettings`; what SFT and DPO share (epochs over a data
set, batches, schedule, window) in `OfflineSettings`; GRPO adds its group, loss and rollouts, and samples its
episodes with the one sampling group (`turnforge.types.SamplingParams`). Each class changes only the defaults
it needs.

Every setting says which TRL config field it sets (`trl_kwargs`). TRL's long tail of other options passes
through the `trl` table unchanged (`trl = { max_grad_norm = 0.5, optim = "adamw_torch_fused" }`): its keys are
checked against the TRL config class's own fields, so a typo is an error naming the field, and a field that a
turnforge setting already sets is refused (set the setting instead), so that one value has one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from turnforge.launch import processes
from turnforge.models.loading import LoraSpec
from turnforge.rewards import COMPONENTS, RewardWeights
from turnforge.types import SamplingParams

# Where a trainer writes, under its out_dir (names the stages and the report read too).
MODEL_DIR = "model"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
ROLLOUTS_FILE = "rollouts.jsonl"

REPORT_TO = ("none", "tensorboard", "wandb")
DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust", "apo_zero", "apo_down", "sigmoid_norm")
GRPO_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo")
SCALE_REWARDS = ("group", "batch", "none")
PACKING = (False, True, "batch", "prefix")


class SettingsError(ValueError):
    """Every bad value of one settings object, each with its field: the recipe loader reports each at its key."""

    def __init__(self, kind: str, problems: list[tuple[str | tuple[str, ...], str]]):
        """`problems`: (the field, or its key path inside a stage such as ("train", "learning_rate"), message)."""
        self.kind, self.problems = kind, problems
        super().__init__("; ".join(f"{kind} setting {message}" for _, message in problems))


def check_settings(kind: str, settings: Any, checks: list[tuple[str, bool, str]]) -> None:
    """Raise a `SettingsError` ("<kind> setting NAME=VALUE: expected ...") naming every failed (name, ok, expected)."""
    problems = [(name, f"{name}={getattr(settings, name)!r}: expected {expected}") for name, ok, expected in checks if not ok]
    if problems:
        raise SettingsError(kind, problems)


def _save_kwargs(save_steps: int) -> dict[str, Any]:
    # Resuming needs the last checkpoint only; full checkpoints of a 4B model are big, hence the limit of 2.
    return {"save_strategy": "steps" if save_steps > 0 else "no", "save_steps": save_steps or 500, "save_total_limit": 2}


def check_trl_options(config_name: str, options: dict[str, Any], managed: set[str]) -> None:
    """Every key of a `trl` table is a field of TRL's `config_name` that no turnforge setting sets (ValueError)."""
    if not options:
        return
    import trl  # seconds to import: only a stage with a `trl` table pays it, at load time

    config = getattr(trl, config_name)
    known = {f.name for f in dataclasses.fields(config) if f.init}
    problems = []
    unknown = sorted(set(options) - known)
    if unknown:
        problems.append(f"unknown field(s) of TRL's {config_name} (trl {trl.__version__}): {', '.join(unknown)}")
    taken = sorted(set(options) & managed)
    if taken:
        problems.append(f"{', '.join(taken)} set by this stage's own settings; set those instead")
    if problems:
        raise ValueError("; ".join(problems))


MAX_LEARNING_RATE = 1.0
"""AdamW moves every weight by about `learning_rate` a step whatever its gradient's scale, so at 1 or more each
weight jumps by its own size every step: the model is destroyed, never trained. Fine-tuning LMs uses 1e-6 to 1e-2
(full fine-tuning of a 4B model ~1e-5, LoRA ~1e-4, the tiny model 3e-3): 1e-2 is already bold, 1 is never meant."""
LEARNING_RATE_RANGE = "more than 0 and less than 1 (AdamW; LMs fine-tune at 1e-6..1e-2)"


class TrainerSettings(BaseModel):
    """What every trainer is told (SFT, DPO, GRPO). The defaults run on a laptop CPU with the tiny model.

    A recipe table too (a training stage's config derives from its trainer's settings): unknown keys are errors,
    and every bad value is reported at once, each at its key (`SettingsError`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
    KIND: ClassVar[str] = "trainer"
    TRL_CONFIG: ClassVar[str] = "TrainingArguments"

    learning_rate: float = 5e-4
    """Peak learning rate (AdamW). 5e-4 suits LoRA and the tiny model; full fine-tuning of a 4B model wants ~1e-5."""
    lora: LoraSpec | None = None
    """LoRA adapter to train (r, alpha, dropout, target modules); None = full fine-tuning."""
    merge: bool = True
    """With LoRA: merge the adapter into the weights of `out_dir/model` (True) or save the adapter only (False)."""
    logging_steps: int = 10
    """Optimizer steps between two lines of `metrics.jsonl` (and of tensorboard / wandb)."""
    save_steps: int = 0
    """Optimizer steps between checkpoints in `out_dir/checkpoints` (a rerun resumes from the last); 0 = none."""
    seed: int = 0
    """Seed of the data order and of the LoRA initialisation."""
    trl: dict[str, Any] = Field(default_factory=dict)
    """Other fields of TRL's config, passed through unchanged (checked against that class's own fields)."""

    @field_validator("trl")
    @classmethod
    def _trl_fields_exist(cls, value: dict[str, Any]) -> dict[str, Any]:
        """An unknown key is an error at this key (`stages.sft.trl: unknown field(s) of TRL's SFTConfig ...`)."""
        # The fields these settings set, whatever their values: those of the defaults (other fields unread).
        check_trl_options(cls.TRL_CONFIG, value, {"output_dir", *cls.model_construct().trl_kwargs()})
        return value

    @model_validator(mode="after")
    def _values_are_valid(self) -> TrainerSettings:
        check_settings(self.KIND, self, self._checks())
        return self

    def _checks(self) -> list[tuple[str, bool, str]]:
        """(field, valid?, what is expected): all of them are checked and reported together."""
        return [
            ("learning_rate", 0 < self.learning_rate < MAX_LEARNING_RATE, LEARNING_RATE_RANGE),
            ("logging_steps", self.logging_steps >= 1, "at least 1"),
            ("save_steps", self.save_steps >= 0, "0 (no checkpoints) or more"),
        ]

    def trl_kwargs(self) -> dict[str, Any]:
        """The TRL config fields these settings set (the run-time and `trl` ones are added by `trl_config`)."""
        return {
            "learning_rate": self.learning_rate,
            "logging_steps": self.logging_steps,
            "seed": self.seed,
            **_save_kwargs(self.save_steps),
        }


class OfflineSettings(TrainerSettings):
    """What SFT and DPO share: epochs over a fixed data set, its batches, the schedule, the history window."""

    epochs: float = 1.0
    """Passes over the data (fractions allowed); ignored when `max_steps` > 0."""
    max_steps: int = -1
    """Optimizer steps to run; -1 = as many as `epochs` takes."""
    batch_size: int = 8
    """Sequences (SFT rows, DPO pairs) per device per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; effective batch = batch_size x grad_accum x devices."""
    max_length: int = 1024
    """Tokens per example; longer examples are cut at the end (counted and logged)."""
    window: int | None = None
    """Keep only the last `window` assistant turns in context (as the rollouts with that window do); None = all."""
    warmup_ratio: float = 0.0
    """Fraction of the steps spent warming the learning rate up linearly from 0, in [0, 1)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    lr_scheduler: str = "cosine"
    """Learning-rate schedule after warmup (a transformers `lr_scheduler_type`: cosine, linear, constant, ...)."""
    report_to: str = "none"
    """Where training curves also go: none, tensorboard (under out_dir/checkpoints/runs) or wandb."""

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [
            *super()._checks(),
            ("batch_size", self.batch_size >= 1, "at least 1"),
            ("grad_accum", self.grad_accum >= 1, "at least 1"),
            ("max_length", self.max_length >= 1, "at least 1"),
            ("max_steps", self.max_steps == -1 or self.max_steps >= 1, "-1 (run `epochs`) or at least 1"),
            ("epochs", self.epochs > 0, "more than 0"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("warmup_ratio", 0.0 <= self.warmup_ratio < 1.0, "a fraction in [0, 1)"),
            ("report_to", self.report_to in REPORT_TO, " or ".join(REPORT_TO)),
            ("window", self.window is None or self.window >= 1, "None (all) or at least 1"),
        ]

    def trl_kwargs(self) -> dict[str, Any]:
        return {
            **super().trl_kwargs(),
            "num_train_epochs": self.epochs,
            "max_steps": self.max_steps,
            "per_device_train_batch_size": self.batch_size,
            "gradient_accumulation_steps": self.grad_accum,
            "max_length": self.max_length,
            "warmup_steps": self.warmup_ratio,  # transformers 5: a float in [0, 1) is a ratio of the total steps
            "weight_decay": self.weight_decay,
            "lr_scheduler_type": self.lr_scheduler,
            "report_to": [] if self.report_to == "none" else [self.report_to],
        }


class SFTSettings(OfflineSettings):
    """Everything the SFT trainer can be told (TRL `SFTConfig`)."""

    KIND: ClassVar[str] = "sft"
    TRL_CONFIG: ClassVar[str] = "SFTConfig"

    packing: bool | str = False
    """How examples share rows, none attending to another: False = one example per row, padded to the batch's
    longest; True = TRL's best-fit-decreasing packing (the data packed into `max_length` chunks, each batch
    flattened into one padding-free row: for FlashAttention on a GPU); "batch" = each batch's own examples packed
    into as few rows of `max_length` as they fit (per-row position ids, no attention mask): the same examples per
    step as unpacked, with less padding, for SDPA / eager attention (a CPU); "prefix" = one example per row, and the
    leading tokens all rows of a batch share and none learns (a system prompt) run once, their keys/values shared
    by every row (`train.sft.SharedPrefixSFTTrainer`): the same loss, fewer tokens computed."""
    max_examples: int | None = None
    """Train on the first N examples only (in input order, after fitting to `max_length`; reading stops there)."""

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [
            *super()._checks(),
            ("max_examples", self.max_examples is None or self.max_examples >= 1, "None (all) or at least 1"),
            ("packing", self.packing in PACKING, "false, true, \"batch\" or \"prefix\""),
        ]

    def trl_kwargs(self) -> dict[str, Any]:
        # completion_only_loss: labels = input_ids where completion_mask == 1, else -100 (TRL builds them).
        # "batch" packing is the data collator's (train.sft.BatchRowPacker): TRL's own packing stays off.
        return {**super().trl_kwargs(), "packing": self.packing is True, "completion_only_loss": True}


def _dpo_lora() -> LoraSpec:
    return LoraSpec(r=16, alpha=32, dropout=0.0)


class DPOSettings(OfflineSettings):
    """Everything the DPO trainer can be told (TRL `DPOConfig`); the shared fields with DPO's defaults."""

    KIND: ClassVar[str] = "dpo"
    TRL_CONFIG: ClassVar[str] = "DPOConfig"

    batch_size: int = 4  # each pair is two sequences
    lora: LoraSpec | None = Field(default_factory=_dpo_lora)  # the reference = the model with the adapter disabled
    lr_scheduler: str = "linear"
    beta: float = 0.1
    """DPO temperature: how far the policy may drift from the reference (TRL `beta`; the Iron Guard seed: 0.1)."""
    loss_type: str = "sigmoid"
    """TRL loss: sigmoid (the DPO paper's), ipo, hinge, robust, apo_zero, apo_down, sigmoid_norm."""
    sft_weight: float = 0.0
    """Weight of the chosen reply's negative log-likelihood (per token) added to the preference loss (TRL's "sft"
    loss beside `loss_type`; RPO, arXiv 2404.19733): the chosen reply is learnt, not only ranked above the
    rejected one. 0 = the preference loss alone."""
    max_pairs: int | None = None
    """Train on the first N pairs only (in input order)."""

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [
            *(c for c in super()._checks() if c[0] != "max_length"),
            ("max_length", self.max_length >= 2, "at least 2"),
            ("beta", self.beta > 0, "more than 0"),
            ("loss_type", self.loss_type in DPO_LOSS_TYPES, " or ".join(DPO_LOSS_TYPES)),
            ("sft_weight", self.sft_weight >= 0, "0 or more"),
            ("max_pairs", self.max_pairs is None or self.max_pairs >= 1, "None (all) or at least 1"),
        ]

    def trl_kwargs(self) -> dict[str, Any]:
        losses = [self.loss_type, "sft"] if self.sft_weight else [self.loss_type]
        weights = [1.0, self.sft_weight] if self.sft_weight else None
        return {**super().trl_kwargs(), "beta": self.beta, "loss_type": losses, "loss_weights": weights}


class GRPOSettings(TrainerSettings, SamplingParams):
    """Everything the GRPO trainer can be told (TRL `GRPOConfig`). The defaults run on a laptop CPU.

    Its episodes are sampled with the sampling group's fields (`SamplingParams`: temperature, top_p, top_k,
    max_new_tokens, stop, explore; `seed` is also the trainer's): `sampling()` is what the policy gets."""

    KIND: ClassVar[str] = "grpo"
    TRL_CONFIG: ClassVar[str] = "GRPOConfig"

    learning_rate: float = 1e-5
    """AdamW peak learning rate (1e-6 for a 4B model as the DemyAgent seed; the tiny model wants ~1e-4)."""
    logging_steps: int = 1
    steps: int = 20
    """Optimizer steps."""
    tasks_per_step: int = 4
    """Tasks (groups) per optimizer step; each gets `num_generations` episodes."""
    num_generations: int = 8
    """Episodes per task: the group whose rewards are normalised together (GRPO's G)."""
    micro_batch_size: int | None = None
    """Episodes per forward/backward pass; None = the whole step at once. Must divide tasks_per_step x G."""
    loss_type: str = "dapo"
    """TRL's loss: dapo (token-mean, DAPO), grpo, dr_grpo, bnpo, cispo, sapo."""
    epsilon: float = 0.2
    """Lower clip of the probability ratio."""
    epsilon_high: float | None = 0.28
    """Upper clip; 0.28 is DAPO's clip-higher (arXiv 2503.14476); None = epsilon."""
    beta: float = 0.0
    """KL coefficient; 0 = no KL and no reference model (DAPO, DemyAgent)."""
    scale_rewards: str = "group"
    """Advantage scaling: group (GRPO), batch, none (Dr. GRPO)."""
    mask_truncated_completions: bool = True
    """Episodes whose last reply hit the token limit carry no loss (DAPO)."""
    max_turns: int | None = None
    """Assistant turns per episode; None = the env's own limit."""
    max_completion_length: int = 4096
    """Tokens of one episode after its first prompt (replies + observations); longer episodes are cut."""
    rewards: RewardWeights = Field(default_factory=RewardWeights)
    step_advantage_weight: float = 0.0
    """GiGPO's omega (arXiv 2505.10978): each turn's advantage adds this times its step-level advantage, its
    discounted return against the other turns of its group that saw the same observation
    (`turnforge.train.step_credit`); 0 = GRPO's one advantage per episode."""
    step_discount: float = 0.95
    """GiGPO's gamma: the episode reward discounted per turn back to each turn (0.95 in the paper)."""
    dynamic_sampling: bool = False
    """Replace zero-variance groups by other tasks' groups (DAPO dynamic sampling)."""
    resample_rounds: int = 2
    """How many times dynamic sampling may try again per generation batch."""
    max_staleness: int = 0
    """Asynchronous GRPO's k: 0 = synchronous (each step plays its groups with the step's weights, then trains);
    k > 0 = a background worker keeps up to (k + 1) steps' worth of groups playing beside training on a copy of the
    weights, each step trains the oldest finished groups, none sampled more than k optimizer steps before the weights
    it is trained with (`train.grpo_async`; the loss is corrected by truncated importance sampling from the recorded
    log-probabilities; docs/decisions.md, "Asynchronous GRPO")."""
    use_vllm: bool = False
    """Roll out with vLLM through TRL's vLLM modes (`pip install "turnforge[vllm]"` on a GPU; on a CPU, vLLM's CPU
    build and colocate mode only: docs/decisions.md, "vLLM for real"): `vllm_mode` colocate (default) or server,
    and the other `vllm_*` fields, go in `trl = {...}`; TRL's importance-sampling correction for the vLLM /
    trainer log-prob gap is on (its default)."""

    def _checks(self) -> list[tuple[str, bool, str]]:
        return [
            *super()._checks(),
            ("steps", self.steps >= 1, "at least 1"),
            ("tasks_per_step", self.tasks_per_step >= 1, "at least 1"),
            ("num_generations", self.num_generations >= 2, "at least 2 (a group needs a baseline)"),
            ("loss_type", self.loss_type in GRPO_LOSS_TYPES, " or ".join(GRPO_LOSS_TYPES)),
            ("scale_rewards", self.scale_rewards in SCALE_REWARDS, " or ".join(SCALE_REWARDS)),
            ("epsilon", self.epsilon >= 0, "0 or more"),
            ("max_completion_length", self.max_completion_length >= 1, "at least 1"),
            ("resample_rounds", self.resample_rounds >= 0, "0 or more"),
            ("step_advantage_weight", self.step_advantage_weight >= 0, "0 (off) or more"),
            ("step_discount", 0 < self.step_discount <= 1, "in (0, 1]"),
            ("max_staleness", self.max_staleness >= 0, "0 (synchronous) or more"),
            ("max_staleness", self.max_staleness == 0 or not self.use_vllm or (
                self.trl.get("vllm_mode", "colocate") == "colocate" and not self.trl.get("vllm_enable_sleep_mode")),
             "0 with use_vllm in vllm_mode = \"server\" or with vllm_enable_sleep_mode: asynchronous GRPO generates "
             "beside training on a colocated engine that stays awake (docs/decisions.md, \"Asynchronous GRPO\")"),
        ]

    @model_validator(mode="after")
    def _batch_and_rollouts_fit(self) -> GRPOSettings:
        self.per_process(processes())  # checked when the recipe loads, before any stage runs
        if self.explore < 1 and self.use_vllm and self.trl.get("vllm_mode") == "server":
            raise ValueError("grpo setting explore below 1 needs a temperature per reply, which trl vllm-serve's "
                             "client does not take: use vllm_mode = \"colocate\" or leave use_vllm off")
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.num_generations

    def per_process(self, processes: int) -> tuple[int, int]:
        """(episodes per forward + backward, accumulation steps) of one process when `processes` share a step: the
        step is tasks_per_step x num_generations episodes whatever the number of processes (TRL's generation batch,
        global too), each process playing and training whole groups (TRL hands it a run of consecutive prompts).
        A value that does not divide raises one line saying which setting to change."""
        if self.tasks_per_step % processes:
            raise ValueError(
                f"grpo setting tasks_per_step={self.tasks_per_step} does not split over {processes} processes (each "
                f"plays whole groups): set tasks_per_step to a multiple of {processes}")
        mine = self.episodes_per_step // processes
        micro = self.micro_batch_size or mine
        if mine % micro:
            raise ValueError(
                f"grpo setting micro_batch_size={micro} must divide one process's episodes a step, tasks_per_step x "
                f"num_generations / processes = {mine}: set micro_batch_size to a divisor of {mine}")
        return micro, mine // micro

    def trl_kwargs(self) -> dict[str, Any]:
        """TRL's knobs pass through unchanged; a batch = tasks_per_step x num_generations episodes, over all the
        processes of an `accelerate launch` (`per_process`)."""
        micro, accumulation = self.per_process(processes())
        weights = self.rewards.as_dict()
        return {
            **super().trl_kwargs(),
            "max_steps": self.steps,
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "num_generations": self.num_generations,
            "loss_type": self.loss_type,
            "epsilon": self.epsilon,
            "epsilon_high": self.epsilon_high,
            "beta": self.beta,
            "scale_rewards": self.scale_rewards,
            "mask_truncated_completions": self.mask_truncated_completions,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_completion_length": self.max_completion_length,
            "reward_weights": [weights[name] for name in COMPONENTS],
            "report_to": [],
            "use_vllm": self.use_vllm,
            # Async GRPO's correction reads TRL's vLLM importance-sampling knobs; per token, truncated, unless set:
            # a sequence ratio over a multi-turn episode of hundreds of tokens masks most episodes (docs/decisions.md)
            **({"vllm_importance_sampling_mode": "token_truncate"} if self.max_staleness else {}),
        }
