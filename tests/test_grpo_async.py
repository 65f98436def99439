"""Asynchronous GRPO (`max_staleness`): k = 0 is the synchronous path, the staleness bound, carry-over of an
unfinished group, the atomic weight update, two k = 1 steps that train, resume."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from turnforge.envs.base import load_tasks
from turnforge.models import load_model
from turnforge.policies.engine import attach_engine
from turnforge.policies.scripted import ExpertPolicy
from turnforge.train.grpo import GRPOSettings, run_grpo
from turnforge.train.grpo_async import (
    AsyncEpisodeRollouts,
    SerialBatches,
    TaskStream,
    WeightSync,
    generator_copy,
)

ENV_OPTIONS = {"format": "act_line", "max_steps": 3}
SETTINGS = {"tasks_per_step": 2, "num_generations": 2, "max_new_tokens": 12, "learning_rate": 1e-2,
            "rewards": {"outcome": 1.0, "format": 1.0, "tool_call": 1.0}}


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_k0_runs_the_synchronous_path_with_the_same_episodes_and_losses(household_sft_model_dir, tmp_path, monkeypatch):
    """max_staleness = 0 (explicit) is the default: the synchronous `EpisodeRollouts`, no importance weights, and the
    same rollouts and losses as a run that never names the setting."""
    import turnforge.train.grpo_async as grpo_async

    monkeypatch.setattr(grpo_async.AsyncEpisodeRollouts, "__init__", lambda *a, **k: pytest.fail("async path taken"))
    tasks = load_tasks("household", "train", limit=2, **ENV_OPTIONS)
    runs = []
    for name, extra in (("default", {}), ("k0", {"max_staleness": 0})):
        out = tmp_path / name
        run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, out, GRPOSettings(steps=1, **SETTINGS, **extra))
        runs.append((_lines(out / "metrics.jsonl"), _lines(out / "rollouts.jsonl")))
    (metrics_a, rollouts_a), (metrics_b, rollouts_b) = runs
    assert [m["loss"] for m in metrics_a] == [m["loss"] for m in metrics_b]
    assert not any(k.startswith("async/") for k in metrics_a[0])
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in rollouts_a]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in rollouts_b]
    assert GRPOSettings().max_staleness == 0


class SlowOn(ExpertPolicy):
    """The expert, sleeping `delay` seconds before each reply on the tasks in `slow`."""

    name = "slow-on"

    def __init__(self, slow: set[str], delay: float):
        super().__init__()
        self.slow, self.delay = slow, delay

    def generate(self, prompts, params):
        if any(p.task.id.split("#")[0] in self.slow for p in prompts):
            time.sleep(self.delay)
        return super().generate(prompts, params)


def _scripted_rollouts(tmp_path, delay: float, k: int = 1):
    """Async rollouts over 4 household tasks driven by hand: a scripted policy slow (`delay` s a reply) on the first
    task the worker draws, a stand-in trainer whose step the test sets, one process, 2 groups of 2 a step."""
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    settings = GRPOSettings(tasks_per_step=2, num_generations=2, max_staleness=k)
    first = TaskStream(tasks, settings.seed * 1_000_003).next()  # the worker's stream, as it will start
    policy = SlowOn({first.id}, delay)
    rollouts = AsyncEpisodeRollouts("household", ENV_OPTIONS, tasks, SimpleNamespace(pad_token_id=0), settings,
                                    tmp_path / "rollouts.jsonl", policy_factory=lambda *a: policy)
    trainer = SimpleNamespace(use_vllm=False, state=SimpleNamespace(global_step=0),
                              accelerator=SimpleNamespace(num_processes=1, process_index=0, is_main_process=True))
    prompts = [[{"role": "user", "content": "", "task_id": tasks[0].id}]] * 4
    return rollouts, trainer, prompts


def test_an_unfinished_group_is_carried_over_to_a_later_step(tmp_path):
    """k = 1, 2 groups a step, 4 in flight: the slow task's group (the first started, "0:0") is still playing when
    step 0 takes the two oldest finished groups; it is carried over (neither waited for nor dropped) and trained,
    oldest first, at step 1."""
    rollouts, trainer, prompts = _scripted_rollouts(tmp_path, delay=0.3)
    try:
        started = time.perf_counter()
        rollouts(prompts, trainer)
        assert time.perf_counter() - started < 0.8, "step 0 waited for the slow group"
        (first,) = _lines(tmp_path / "rollouts.jsonl")
        assert "0:0" not in first["group_ids"] and first["carried_groups"] >= 1
        time.sleep(1.5)  # the slow group (3 replies of 0.3 s) finishes meanwhile
        trainer.state.global_step = 1
        rollouts(prompts, trainer)
        second = _lines(tmp_path / "rollouts.jsonl")[1]
        assert second["group_ids"][0] == "0:0"
        assert second["staleness"] == {"1": 2} and second["stale_dropped_groups"] == 0
    finally:
        rollouts.close()


def test_no_group_is_trained_past_the_staleness_bound(tmp_path):
    """k = 1: the slow group started at version 0 finishes after step 2 began: it is dropped (counted) and its task
    drawn again; every trained group is at most 1 version old, none trained twice."""
    rollouts, trainer, prompts = _scripted_rollouts(tmp_path, delay=0.5)
    try:
        for step in range(6):
            if step == 5:
                time.sleep(2.0)  # the slow group finishes, past the bound
            trainer.state.global_step = step
            rollouts(prompts, trainer)
        lines = _lines(tmp_path / "rollouts.jsonl")
        assert all(int(age) <= 1 for line in lines for age in line["staleness"])
        assert sum(line["stale_dropped_groups"] for line in lines) >= 1
        trained = [uid for line in lines for uid in line["group_ids"]]
        assert "0:0" not in trained and len(trained) == len(set(trained)) == 12
    finally:
        rollouts.close()


def test_weights_reach_the_generator_atomically(tiny_model_dir):
    """A forward forced while the update is half done waits for it: it sees the new weights, all of them."""
    trained, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    generator = generator_copy(trained)
    sync = WeightSync(trained, generator)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    ids = torch.arange(5, 25).unsqueeze(0)
    with torch.no_grad():
        expected = trained(input_ids=ids).logits
    release = attach_engine(generator)  # what a running engine does to its model: forwards take its lock
    half, seen = threading.Event(), {}
    copies = iter(range(10**6))

    def slow_copy(target, source):
        target.copy_(source)
        if next(copies) == 0:  # one parameter copied, the rest not yet
            half.set()
            time.sleep(0.5)

    def forward():
        half.wait()
        with torch.no_grad():
            seen["logits"] = generator(input_ids=ids).logits
        seen["at"] = time.perf_counter()

    sync.copy = slow_copy
    thread = threading.Thread(target=forward)
    thread.start()
    try:
        sync(generator)
        done = time.perf_counter()
        thread.join()
    finally:
        release()
    assert seen["at"] >= done - 1e-3
    assert torch.equal(seen["logits"], expected)


def test_the_generator_shares_a_lora_base_and_copies_the_adapter(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from turnforge.train.grpo_async import copy_bytes

    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    generator = generator_copy(model)
    mine = dict(generator.named_parameters())
    for name, p in model.named_parameters():
        assert (mine[name] is p) == (not p.requires_grad), name
    assert 0 < copy_bytes(model) < sum(p.numel() * 4 for p in model.parameters()) / 10


def test_two_async_steps_change_parameters_and_log_the_correction(household_sft_model_dir, tmp_path):
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    # 4 episodes a group: some sampled replies parse and some do not, so format and TCR vary within a group
    settings = GRPOSettings(steps=2, max_staleness=1, **{**SETTINGS, "num_generations": 4})
    result = run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 2 and result["episodes"] == 16
    before, _ = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    after, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after.named_parameters())
    assert [n for n, p in before.named_parameters() if torch.equal(p, trained[n])] == []
    logs = _lines(tmp_path / "metrics.jsonl")
    assert all({"async/is_ratio_mean", "async/is_ratio_max", "async/is_corrected_share"} <= set(row) for row in logs)
    # step 1 trains groups of the weights it starts from: the generator's log-probs are the trainer's (ratio 1)
    assert logs[0]["async/is_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert logs[0]["frac_reward_zero_std"] < 1.0
    batches = _lines(tmp_path / "rollouts.jsonl")
    assert [b["step"] for b in batches] == [1, 2] and all(b["episodes"] == 8 for b in batches)
    assert all(int(age) <= 1 for b in batches for age in b["staleness"])


def test_a_killed_async_run_resumes_without_training_a_group_twice(household_sft_model_dir, tmp_path):
    """Killed after step 1's checkpoint (here: a run of 1 step), rerun to 2 steps: it resumes at step 1; the groups
    in flight at the kill are re-sampled, so the resumed step trains groups of its own."""
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    for steps in (1, 2):
        run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path,
                 GRPOSettings(steps=steps, max_staleness=1, save_steps=1, **SETTINGS))
    assert [row["step"] for row in _lines(tmp_path / "metrics.jsonl")] == [1, 2]
    batches = _lines(tmp_path / "rollouts.jsonl")
    assert [b["step"] for b in batches] == [1, 2]
    assert batches[1]["group_ids"][0].startswith("1:")  # a new stream, started at step 1
    trained = [uid for b in batches for uid in b["group_ids"]]
    assert len(trained) == len(set(trained))


def test_async_keeps_dynamic_sampling_step_credit_kl_lora_and_accumulation(household_sft_model_dir, tmp_path):
    """k = 1 with everything else on: dynamic sampling, GiGPO's step term, KL to the reference (LoRA: the adapter
    disabled), LoRA (the generator shares the base) and 2 micro-batches a step."""
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    settings = GRPOSettings(steps=2, max_staleness=1, dynamic_sampling=True, resample_rounds=1, step_advantage_weight=1.0,
                            beta=0.05, lora={"r": 4, "alpha": 8, "dropout": 0.0}, micro_batch_size=4,
                            **{**SETTINGS, "num_generations": 4, "learning_rate": 1e-3})
    result = run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 2 and result["episodes"] == 16
    logs = _lines(tmp_path / "metrics.jsonl")
    assert all("kl" in row and "async/is_ratio_mean" in row for row in logs)
    assert logs[0]["async/is_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    batches = _lines(tmp_path / "rollouts.jsonl")
    assert all(b["episodes"] == 8 and "replaced_groups" in b for b in batches)
    assert (tmp_path / "model" / "adapter_config.json").exists() or (tmp_path / "model" / "config.json").exists()


def test_max_staleness_settings_are_checked():
    with pytest.raises(ValueError, match="max_staleness"):
        GRPOSettings(max_staleness=-1)
    assert GRPOSettings(max_staleness=1, use_vllm=True).max_staleness == 1  # colocated vLLM (test_vllm_grpo.py)
    for trl in ({"vllm_mode": "server"}, {"vllm_enable_sleep_mode": True}):
        with pytest.raises(ValueError, match="max_staleness.*server.*sleep_mode"):
            GRPOSettings(max_staleness=1, use_vllm=True, trl=trl)
    assert GRPOSettings(max_staleness=1).trl_kwargs()["vllm_importance_sampling_mode"] == "token_truncate"
    assert "vllm_importance_sampling_mode" not in GRPOSettings().trl_kwargs()  # k = 0: TRL's config as before


def test_importance_weights_by_hand():
    """The examples in `off_policy.importance_weights` (token modes), and a sequence mode: the episode's ratio is the
    product over its learned tokens, exp(log 5 - log 5) = 1 here, so nothing is masked."""
    import doctest

    from turnforge.train import off_policy

    assert doctest.testmod(off_policy).failed == 0 and doctest.testmod(off_policy).attempted >= 1
    current = torch.log(torch.tensor([[0.5, 0.5, 0.1]]))
    behaviour = torch.log(torch.tensor([[0.5, 0.1, 0.5]]))
    weights, stats = off_policy.importance_weights(current, behaviour, torch.tensor([[1, 1, 1]]), "sequence_mask", None, 3.0)
    assert weights.shape == (1, 1) and weights.item() == pytest.approx(1.0) and stats.corrected_share == 0.0


class OneCallAtATime:
    """An engine as vLLM's `LLM` is: one call at a time (a second call at once fails the test); records each call."""

    def __init__(self):
        self.calls, self.busy = [], threading.Lock()

    def generate(self, prompts, params):
        assert self.busy.acquire(blocking=False), "two calls at once"
        try:
            time.sleep(0.2)
            self.calls.append(list(prompts))
            return [f"{p}@{params}" for p in prompts]
        finally:
            self.busy.release()


def test_serial_batches_send_waiting_calls_together_and_the_weight_sync_between_calls():
    """vLLM's colocated engine under async GRPO: the group threads' calls that wait while one runs go as ONE next call
    (same sampling settings; others on their own), each caller gets its own replies, and a holder of the lock (TRL's
    weight sync, `serialize_colocated_sync`) keeps every call out until it lets go."""
    engine = OneCallAtATime()
    serial = SerialBatches(engine)
    replies = {}

    def ask(name, prompts, params):
        replies[name] = serial.generate(prompts, params)

    first = threading.Thread(target=ask, args=("first", ["a"], 1))
    first.start()
    time.sleep(0.05)  # "first" is in the engine; three more arrive meanwhile
    others = [threading.Thread(target=ask, args=args) for args in
              (("b", ["b1", "b2"], 1), ("c", ["c"], 1), ("d", ["d"], 2))]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    assert replies == {"first": ["a@1"], "b": ["b1@1", "b2@1"], "c": ["c@1"], "d": ["d@2"]}
    assert engine.calls[0] == ["a"] and sorted(map(sorted, engine.calls[1:])) == [["b1", "b2", "c"], ["d"]]

    with serial.lock:  # the weight sync holds it
        late = threading.Thread(target=ask, args=("late", ["e"], 1))
        late.start()
        time.sleep(0.3)
        assert "late" not in replies  # no call while the weights change
    late.join()
    assert replies["late"] == ["e@1"]

    def broken(prompts, params):
        raise RuntimeError("engine died")

    engine.generate = broken
    with pytest.raises(RuntimeError, match="engine died"):
        serial.generate(["x"], 1)
