"""The parts of `benchmarks/gpu_check.py`, each run in a process of its own: setup, sft, rollouts, grpo.

Every measurement goes through turnforge's public entry points (`load_model`, `build_dataset` / `build_trainer` of
train/sft.py, `HFPolicy`, `run_episodes`, `run_grpo`), so the GPU run exercises what users run. A row is written to
`WORK/rows_<part>.jsonl` as soon as it is measured; a row whose turn comes after the part's deadline reads "not
reached: time", one that raises "failed: <one line>", and the part goes on with the next. Everything is imported
at the top, so a part that starts at all has imported what every row needs (the rehearsal's first check).
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config, TrainerCallback

from gpu_check import (
    GRPO_ASYNC_KS,
    GRPO_ASYNC_STEPS,
    GRPO_ROW,
    PEAK_BF16,
    ROLLOUT_ENVS,
    SFT_CONFIGS,
    SHAPES,
    first_turn_row,
    grpo_async_row,
    rollout_row,
    sft_row,
)
from turnforge.envs.base import load_tasks, make_env
from turnforge.models import LoraSpec, load_model
from turnforge.policies.base import SamplingParams
from turnforge.policies.hf import HFPolicy
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.tiny_model import build_tiny_model
from turnforge.train.grpo import GRPOSettings, run_grpo
from turnforge.train.runtime import CHECKPOINTING_FIELD, training_dtype
from turnforge.train.sft import SFTSettings, build_dataset, build_trainer
from turnforge.train.trl_internals import GRPOTrainerHooks

SFT_ROWS_PER_STEP = 4
"""Packed rows of `--seq-len` tokens per SFT step (the batch's examples are as many as fill them)."""
SFT_EXAMPLES = 128
"""Household expert episodes in the SFT data (enough for every step's batch)."""
ROLLOUT_TASKS = 16
"""Distinct tasks per rollout batch; a batch of b plays b / 16 episodes of each (b < 16: the first b tasks)."""
NAIVE_EPISODES = 2
"""Episodes the naive loop plays (the first tasks of the batched runs): its tokens/s does not depend on a batch."""
GRPO_LORA = dict(r=64, alpha=128, dropout=0.0)


class Rows:
    """Writes a part's rows as they are measured, each under the part's deadline."""

    def __init__(self, work: Path, part: str, deadline: float) -> None:
        self.path, self.part, self.deadline = work / f"rows_{part}.jsonl", part, deadline

    def run(self, name: str, measure: Callable[[], dict]) -> dict | None:
        """The row, written; returned only when measured (None when not reached or failed)."""
        if time.time() >= self.deadline:
            self._write({"row": name, "status": "not reached: time"})
            return None
        try:
            row = {"row": name, "status": "measured", **measure()}
        except Exception as e:  # one row's failure (a CUDA OOM, a missing file) is that row's result
            first = (str(e).strip().splitlines() or [""])[0][:300]
            row = {"row": name, "status": f"failed: {type(e).__name__}: {first}"}
        finally:
            free_memory()
        self._write(row)
        return row if row["status"] == "measured" else None

    def skip(self, name: str, why: str) -> None:
        """A row this device cannot run."""
        self._write({"row": name, "status": f"skipped: {why}"})

    def _write(self, row: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"part": self.part, **row}) + "\n")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """Peak GPU memory allocated by tensors since `reset_peak` (None on a CPU: not measured there)."""
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.startswith("cuda") else None


def retail_options(retail_dir: Path) -> dict:
    if not (retail_dir / "tasks.json").is_file():
        raise FileNotFoundError(f"tau2 retail data not found in {retail_dir} (tasks.json); give --retail-dir, or "
                                "copy ../shared/data/tau2/retail into the repo (.gpudata/retail) for the GPU machine")
    return {"domain": "retail", "data_dir": str(retail_dir)}


# ---------------------------------------------------------------------------------------------------------------
# setup: tokenizer, SFT data, the random model saved as a checkpoint


def setup(args, work: Path) -> None:
    envs = [("household", {})]
    if (args.retail_dir / "tasks.json").is_file():
        envs.append(("service", retail_options(args.retail_dir)))
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(work / "tokenizer", envs))
    tasks = load_tasks("household", "train", limit=SFT_EXAMPLES)
    episodes = run_episodes(ExpertPolicy(), lambda: make_env("household"), tasks, 1, progress=False)
    (work / "sft_data.jsonl").write_text("".join(e.to_json() + "\n" for e in episodes))

    end, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(**SHAPES[args.shape], eos_token_id=end, pad_token_id=pad, bos_token_id=None)
    with torch.device(args.device):  # random init on the GPU: seconds, where a CPU takes minutes for 4B
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=[end, pad], pad_token_id=pad, bos_token_id=None)
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    versions = {p: importlib.metadata.version(p) for p in ("torch", "transformers", "trl", "peft", "accelerate",
                                                            "datasets")}
    (work / "setup.json").write_text(json.dumps({
        "device_name": name, "peak_bf16_flops": next((v for k, v in PEAK_BF16.items() if k in name), None),
        "parameters": model.num_parameters(), "retail": len(envs) > 1, **versions,
    }, indent=2))


# ---------------------------------------------------------------------------------------------------------------
# sft


class StepTimes(TrainerCallback):
    """Seconds of each optimizer step, the device synchronised at both ends."""

    def __init__(self, device: str) -> None:
        self.device, self.seconds, self._start = device, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        sync(self.device)
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        sync(self.device)
        self.seconds.append(time.perf_counter() - self._start)


class CountingCollator:
    """The trainer's collator, counting each batch's real tokens and its padded size, batch by batch."""

    def __init__(self, collate) -> None:
        self.collate, self.real, self.padded = collate, [], []

    def __call__(self, examples: list[dict]) -> dict:
        batch = self.collate(examples)
        self.real.append(sum(len(e["input_ids"]) for e in examples))
        self.padded.append(batch["input_ids"].numel())
        return batch


def sft_part(args, work: Path, rows: Rows, setup_info: dict) -> None:
    for tuning, checkpointing, liger in SFT_CONFIGS:
        name = sft_row(tuning, checkpointing, liger)
        if liger and args.device != "cuda":  # Liger's kernels are Triton GPU kernels
            rows.skip(name, "Liger needs a CUDA device")
            continue
        rows.run(name, lambda t=tuning, c=checkpointing, g=liger: sft_steps(args, work, t, c, g, setup_info))


def sft_steps(args, work: Path, tuning: str, checkpointing: bool, liger: bool, setup_info: dict) -> dict:
    lora = LoraSpec(**GRPO_LORA) if tuning.startswith("lora") else None
    trl = {CHECKPOINTING_FIELD: checkpointing, **({"use_liger_kernel": True} if liger else {})}
    settings = SFTSettings(max_steps=1 + args.sft_steps, max_length=args.seq_len, packing="batch", lora=lora,
                           learning_rate=1e-4 if lora else 1e-5, logging_steps=1, trl=trl)
    model, tokenizer = load_model(work / "model", dtype=training_dtype(lora), device="cpu")  # as run_sft loads it
    dataset, counts = build_dataset([str(work / "sft_data.jsonl")], tokenizer, settings)
    per_example = counts.tokens / len(dataset)
    settings = settings.model_copy(update={"batch_size": max(1, round(SFT_ROWS_PER_STEP * args.seq_len / per_example))})
    reset_peak(args.device)
    trainer = build_trainer(model, tokenizer, dataset, work / "sft", settings)
    counter = CountingCollator(trainer.data_collator)
    trainer.data_collator = counter
    times = StepTimes(args.device)
    trainer.add_callback(times)
    trainer.train()
    steps = len(times.seconds) - 1  # the first step warms up (kernels, allocator) and is not counted
    seconds, real, padded = sum(times.seconds[1:]), sum(counter.real[1:steps + 1]), sum(counter.padded[1:steps + 1])
    peak = setup_info.get("peak_bf16_flops")
    tokens_per_s = real / seconds
    return {
        "tokens_per_s": round(tokens_per_s, 1),
        "mfu_pct": round(100 * 6 * setup_info["parameters"] * tokens_per_s / peak, 1) if peak else None,
        "peak_gib": peak_gib(args.device),
        "detail": f"{steps} steps after 1 warm-up, {real // max(steps, 1)} tokens/step ({settings.batch_size} "
                  f"examples in rows of {args.seq_len}), padding {100 * (1 - real / max(padded, 1)):.0f} %, "
                  f"{model.config._attn_implementation} attention, {'bf16' if trainer.args.bf16 else 'fp32'}",
    }


# ---------------------------------------------------------------------------------------------------------------
# rollouts


def rollouts_part(args, work: Path, rows: Rows) -> None:
    model, tokenizer = load_model(work / "model", device=args.device)  # bf16 on a GPU, float32 on a CPU
    model.eval()
    options = {"household": lambda: {}, "service": lambda: retail_options(args.retail_dir)}
    # The engine's rows first (what matters most, issue 51); the naive loop last. Ratios to it are in the table's
    # naive-loop rows' `detail` (the rollout rows are written before the naive rate is known).
    measured: dict[str, float] = {}
    for batch in sorted(args.batches, reverse=True):
        for env in ROLLOUT_ENVS:
            row = rows.run(rollout_row(env, batch),
                           lambda e=env, b=batch: batched(args, model, tokenizer, e, options[e](), b, None))
            if row:
                measured[rollout_row(env, batch)] = row["tokens_per_s"]
    batch = max(args.batches)
    rows.run(first_turn_row("hf policy", batch), lambda: first_turn_hf(args, model, tokenizer, batch, None))
    rows.run(first_turn_row("continuous batching", batch), lambda: first_turn_paged(args, model, tokenizer, batch, None))
    for env in ROLLOUT_ENVS:
        rows.run(f"{env} naive loop, batch 1",
                 lambda e=env: with_ratios(naive_loop(args, model, tokenizer, e, options[e]()), e, measured))


def with_ratios(row: dict, env: str, measured: dict[str, float]) -> dict:
    """The naive loop's row, its detail listing each of `env`'s rollout rows as a multiple of it."""
    ratios = ", ".join(f"batch {name.rsplit(' ', 1)[-1]} {rate / row['tokens_per_s']:.1f}x"
                       for name, rate in measured.items() if name.startswith(env) and row["tokens_per_s"])
    return {**row, "detail": f"{row['detail']}; hf rollouts vs this: {ratios or 'none measured'}"}


def rollout_tasks(env: str, options: dict, batch: int):
    tasks = load_tasks(env, "test", limit=min(batch, ROLLOUT_TASKS), **options)
    return tasks, batch // len(tasks)


def naive_loop(args, model, tokenizer, env_name: str, options: dict) -> dict:
    """The loop users write: one episode at a time, the whole conversation re-rendered and `generate`d each turn."""
    env = make_env(env_name, **options)
    tasks, _ = rollout_tasks(env_name, options, NAIVE_EPISODES)
    reset_peak(args.device)
    tokens, start = 0, time.perf_counter()
    for task in tasks:
        messages = [m.to_dict() for m in env.reset(task)]
        for _ in range(args.max_turns):
            ids = tokenizer.apply_chat_template(messages, tools=env.tools(), add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True).to(model.device)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False)
            new = out[0, ids["input_ids"].shape[1]:]
            tokens += len(new)
            text = tokenizer.decode(new, skip_special_tokens=True)
            result = env.step(env.format.parse(text))
            messages += [{"role": "assistant", "content": text}, *(m.to_dict() for m in result.messages)]
            if result.done:
                break
    seconds = time.perf_counter() - start
    return {"tokens_per_s": round(tokens / seconds, 1), "peak_gib": peak_gib(args.device),
            "detail": f"{len(tasks)} episodes, {tokens} tokens in {seconds:.1f} s, greedy"}


def play(args, model, tokenizer, env_name: str, options: dict, tasks, samples: int, max_turns: int):
    batch = len(tasks) * samples
    policy = HFPolicy.from_model(model, tokenizer, batch_size=batch, model_id="gpu_check")  # the engine
    limits = RolloutLimits(max_turns=max_turns, max_format_errors=max_turns, max_open=batch)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    trajectories = run_episodes(policy, lambda: make_env(env_name, **options), tasks, samples, limits, params,
                                renderer=policy.renderer, progress=False)
    sync(args.device)
    policy.close()
    return sum(t.tokens_generated for t in trajectories), time.perf_counter() - start, trajectories


def batched(args, model, tokenizer, env_name: str, options: dict, batch: int, naive: float | None) -> dict:
    tasks, samples = rollout_tasks(env_name, options, batch)
    reset_peak(args.device)
    tokens, seconds, trajectories = play(args, model, tokenizer, env_name, options, tasks, samples, args.max_turns)
    rate = tokens / seconds
    turns = sum(len(t.turns) for t in trajectories)
    return {"tokens_per_s": round(rate, 1), "ratio_vs_naive": round(rate / naive, 2) if naive else None,
            "peak_gib": peak_gib(args.device),
            "detail": f"{len(trajectories)} episodes ({len(tasks)} tasks x {samples}), {turns} turns, {tokens} tokens "
                      f"in {seconds:.1f} s, greedy"}


def first_turn_prompts(tokenizer, count: int) -> list[list[int]]:
    env = make_env("household")
    tasks, samples = rollout_tasks("household", {}, count)
    return [tokenizer.apply_chat_template([m.to_dict() for m in env.reset(t)], tools=env.tools(),
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
            for t in tasks for _ in range(samples)]


def first_turn_hf(args, model, tokenizer, batch: int, naive: float | None) -> dict:
    tasks, samples = rollout_tasks("household", {}, batch)
    reset_peak(args.device)
    tokens, seconds, _ = play(args, model, tokenizer, "household", {}, tasks, samples, max_turns=1)
    return {"tokens_per_s": round(tokens / seconds, 1), "peak_gib": peak_gib(args.device),
            "ratio_vs_naive": round(tokens / seconds / naive, 2) if naive else None,
            "detail": f"run_episodes, max_turns 1: {tokens} tokens in {seconds:.1f} s"}


def first_turn_paged(args, model, tokenizer, batch: int, naive: float | None) -> dict:
    """The same first prompts through transformers' continuous batching (`generate_batch`: paged KV cache,
    requests scheduled as they finish), which needs no vLLM."""
    prompts = first_turn_prompts(tokenizer, batch)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    reset_peak(args.device)
    start = time.perf_counter()
    outputs = model.generate_batch(inputs=prompts, generation_config=config, progress_bar=False)
    sync(args.device)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    return {"tokens_per_s": round(tokens / seconds, 1), "peak_gib": peak_gib(args.device),
            "ratio_vs_naive": round(tokens / seconds / naive, 2) if naive else None,
            "detail": f"generate_batch: {len(outputs)} requests, {tokens} tokens in {seconds:.1f} s"}


# ---------------------------------------------------------------------------------------------------------------
# grpo


@contextmanager
def phase_seconds() -> Iterator[dict[str, float]]:
    """Seconds spent in TRL's `_generate_and_score_completions` (rollouts, rewards, advantages, log-probs before
    the loss) and `training_step` (that, plus the loss's forward + backward), summed over the block. TRL's own
    profiling timers report to wandb / mlflow only, so the methods are wrapped here, on turnforge's subclass that
    both of `run_grpo`'s trainers derive from (`trl_internals.GRPOTrainerHooks`: the one home of TRL's internals)."""
    spent = {"generate_and_score": 0.0, "training_step": 0.0}
    originals = {name: getattr(GRPOTrainerHooks, name) for name in ("_generate_and_score_completions", "training_step")}
    own = {name for name in originals if name in vars(GRPOTrainerHooks)}

    def timed(name, key):
        def wrapper(self, *a, **kw):
            start = time.perf_counter()
            try:
                return originals[name](self, *a, **kw)
            finally:
                spent[key] += time.perf_counter() - start
        return wrapper

    GRPOTrainerHooks._generate_and_score_completions = timed("_generate_and_score_completions", "generate_and_score")
    GRPOTrainerHooks.training_step = timed("training_step", "training_step")
    try:
        yield spent
    finally:
        for name, method in originals.items():  # (an inherited one is deleted again, not pinned on the class)
            if name in own:
                setattr(GRPOTrainerHooks, name, method)
            else:
                delattr(GRPOTrainerHooks, name)


def grpo_part(args, work: Path, rows: Rows) -> None:
    rows.run(GRPO_ROW, lambda: grpo_step(args, work))
    for k in GRPO_ASYNC_KS:
        rows.run(grpo_async_row(k), lambda k=k: grpo_steps_at(args, work, k))


def grpo_step(args, work: Path) -> dict:
    settings = GRPOSettings(steps=1, tasks_per_step=8, num_generations=8, lora=LoraSpec(**GRPO_LORA), merge=False,
                            max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, learning_rate=1e-6)
    out = work / "grpo"
    reset_peak(args.device)
    with phase_seconds() as spent:
        summary = run_grpo(str(work / "model"), "household", {}, load_tasks("household", "train", limit=8), out, settings)
    batches = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    rollout = sum(b["wall_s"] for b in batches)
    scoring = spent["generate_and_score"] - rollout
    update = spent["training_step"] - spent["generate_and_score"]
    return {"peak_gib": peak_gib(args.device), "rollout_s": round(rollout, 2), "scoring_s": round(scoring, 2),
            "update_s": round(update, 2), "run_grpo_wall_s": summary["wall_s"],
            "detail": f"rollout {rollout:.1f} s / scoring {scoring:.1f} s / update {update:.1f} s; {summary['episodes']} "
                      f"episodes; run_grpo {summary['wall_s']:.0f} s with load and save"}


def grpo_steps_at(args, work: Path, k: int) -> dict:
    """`GRPO_ASYNC_STEPS` steps of `run_grpo` at max_staleness k (0: synchronous), LoRA: episodes trained a minute,
    the time the trainer waited for episodes, the time the generator had a group playing (k > 0), peak memory."""
    settings = GRPOSettings(steps=GRPO_ASYNC_STEPS, tasks_per_step=8, num_generations=8, lora=LoraSpec(**GRPO_LORA),
                            merge=False, max_new_tokens=args.max_new_tokens, max_turns=args.max_turns,
                            learning_rate=1e-6, max_staleness=k)
    out = work / f"grpo_k{k}"
    reset_peak(args.device)
    summary = run_grpo(str(work / "model"), "household", {}, load_tasks("household", "train", limit=32), out, settings)
    batches = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines() if line.strip()]
    waited = sum(b.get("trainer_wait_s", b["wall_s"]) for b in batches)
    busy = batches[-1]["generator_busy_s"] if k else sum(b["wall_s"] for b in batches)
    wall = summary["wall_s"]
    return {"peak_gib": peak_gib(args.device), "episodes_per_min": round(summary["episodes"] / wall * 60, 1),
            "trainer_wait_s": round(waited, 2), "generator_busy_s": round(busy, 2), "run_grpo_wall_s": wall,
            "detail": f"{summary['episodes']} episodes in {wall:.0f} s ({summary['episodes'] / wall * 60:.1f} a minute, "
                      f"with load and save); trainer waited {waited:.1f} s, generator busy {busy:.1f} s"}


# ---------------------------------------------------------------------------------------------------------------


def run_one_part(args) -> None:
    work: Path = args.work
    if args.part == "setup":
        setup(args, work)
        return
    rows = Rows(work, args.part, args.deadline)
    if args.part == "sft":
        sft_part(args, work, rows, json.loads((work / "setup.json").read_text()))
    elif args.part == "rollouts":
        rollouts_part(args, work, rows)
    else:
        grpo_part(args, work, rows)
