"""Multi-turn GRPO on TRL: episode -> (prompt, completion, env_mask) by hand, TRL sees our mask, 2 steps train."""

from __future__ import annotations

import json

import pytest
import torch

from turnforge.envs.base import expert_text, load_tasks, make_env
from turnforge.models import load_model
from turnforge.policies.base import Generation
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rewards import COMPONENTS
from turnforge.train.grpo import GRPOSettings, component_reward, grpo_config, run_grpo, task_dataset
from turnforge.train.grpo_rollouts import EpisodeRollouts, Group, episode_sequence
from turnforge.train.grpo_trainer import EpisodeGRPOTrainer, prompt_groups, real_spans
from turnforge.types import Message, Score, StopReason, Trajectory, Turn

ENV_OPTIONS = {"format": "act_line", "max_steps": 3}


def _episode() -> Trajectory:
    turns = [
        Turn(text="a", generated_ids=[11, 12, 2], logprobs=[-0.1, -0.2, -0.3], observation_ids=[7, 8]),
        Turn(text="b", generated_ids=[13, 2], logprobs=[-0.4, -0.5], observation_ids=[9]),
    ]
    return Trajectory(
        task_id="t", env="e", category="c", messages=[Message("user", "go")], turns=turns,
        score=Score(False, 0.0, 0.5), stop_reason=StopReason.failure, prompt_ids=[1, 3, 4],
    )


def test_episode_sequence_masks_observations_and_drops_the_last_one():
    prompt, completion, mask, logprobs = episode_sequence(_episode(), max_completion_length=100)
    assert prompt == [1, 3, 4]
    # turn 1 ids, turn 1 observation, turn 2 ids; the observation after the last turn is left out
    assert completion == [11, 12, 2, 7, 8, 13, 2]
    assert mask == [1, 1, 1, 0, 0, 1, 1]
    assert logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert episode_sequence(_episode(), max_completion_length=4)[1:3] == ([11, 12, 2, 7], [1, 1, 1, 0])


def test_a_replayed_turn_is_in_the_sequence_without_loss():
    traj = _episode()
    traj.turns[0].learn = False
    assert episode_sequence(traj, max_completion_length=100)[2] == [0, 0, 0, 0, 0, 1, 1]


def test_episode_sequence_refuses_windowed_episodes():
    traj = _episode()
    traj.turns[0].prompt_ids = [1, 2]
    with pytest.raises(ValueError, match="history window"):
        episode_sequence(traj, 100)


def test_component_reward_reads_back_its_field():
    fn = component_reward("progress")
    assert fn.__name__ == "progress"
    assert fn(prompts=[0, 0], completions=[0, 0], reward_progress=[0.5, 1]) == [0.5, 1.0]


def test_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="num_generations"):
        GRPOSettings(num_generations=1)
    with pytest.raises(ValueError, match="micro_batch_size"):
        GRPOSettings(tasks_per_step=2, num_generations=3, micro_batch_size=4)
    with pytest.raises(ValueError, match="step_discount"):
        GRPOSettings(step_advantage_weight=1.0, step_discount=0.0)
    for explore, temperature in ((1.5, 1.0), (-0.1, 1.0), (0.5, 0.0)):
        with pytest.raises(ValueError, match="explore"):
            GRPOSettings(explore=explore, temperature=temperature)
    assert "explore" not in GRPOSettings(explore=0.25).trl_kwargs()  # the rollout's, not TRL's
    with pytest.raises(ValueError, match="explore below 1 .*colocate"):
        GRPOSettings(explore=0.5, use_vllm=True, trl={"vllm_mode": "server"})
    assert "step_advantage_weight" not in GRPOSettings(step_advantage_weight=1.0).trl_kwargs()  # ours, not TRL's
    vllm = GRPOSettings(use_vllm=True, trl={"vllm_mode": "server", "vllm_server_base_url": "http://127.0.0.1:8000"})
    assert vllm.trl_kwargs()["use_vllm"] is True
    assert vllm.trl["vllm_mode"] == "server"  # TRL's own vLLM fields pass through (checked when made)


def test_trl_receives_env_mask_as_its_tool_mask(household_sft_model_dir, tmp_path):
    """The batch TRL builds from our rollouts: its tool_mask is our env_mask, so observations carry no loss."""
    from trl import GRPOTrainer

    model, tokenizer = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    tasks = load_tasks("household", "train", limit=2, **ENV_OPTIONS)
    settings = GRPOSettings(steps=1, tasks_per_step=2, num_generations=2, max_new_tokens=6)
    rollouts = EpisodeRollouts("household", ENV_OPTIONS, tasks, tokenizer, settings)
    captured = {}

    def spy(prompts, trainer):
        out = rollouts(prompts, trainer)
        captured.update(out)
        return out

    trainer = GRPOTrainer(
        model=model, reward_funcs=[component_reward(n) for n in ("outcome", "progress", "tool_call", "overlong",
                                                                  "format", "loop")],
        args=grpo_config(tmp_path, settings), train_dataset=task_dataset("household", ENV_OPTIONS, tasks),
        processing_class=tokenizer, rollout_func=spy,
    )
    rows = [task_dataset("household", ENV_OPTIONS, tasks)[i] for i in (0, 0, 1, 1)]
    batch = trainer._generate_and_score_completions(rows)
    masks = captured["env_mask"]
    assert any(0 in m for m in masks), "episodes of 3 turns must have observation tokens"
    ends = set(trainer.eos_token_ids) | {tokenizer.pad_token_id}
    for i, mask in enumerate(masks):
        ids = captured["completion_ids"][i]
        truncated = ids[-1] not in ends  # mask_truncated_completions: TRL zeroes the whole row
        assert batch["tool_mask"][i, : len(mask)].tolist() == ([0] * len(mask) if truncated else mask)
        observed = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m == 0])
        assert "<|im_start|>user" in observed  # what is masked out is the env's turn, header included


def test_real_spans_find_each_rows_run_of_real_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    assert real_spans(mask) == [(2, 5), (0, 6), (0, 0)]
    assert real_spans(torch.tensor([[1, 0, 1]])) is None  # a hole: not one run


def test_prompt_groups_share_a_groups_prompt_less_its_last_token_in_whole_blocks():
    pad = 0
    ids = torch.tensor([
        [pad, 5, 6, 7, 8, 9, 1, 2],  # prompt 5 6 7 8 9 (positions 1-5), completion from position 6
        [pad, 5, 6, 7, 8, 9, 3, pad],
        [pad, pad, 5, 6, 7, 8, 1, 2],  # another prompt: a row alone
        [pad, 5, 6, 7, 8, 9, 4, 4],
    ])
    spans = [(1, 8), (1, 7), (2, 8), (1, 8)]
    # prompt of 5 tokens: its first 4 can run once; in blocks of 2 that is 4, in blocks of 3 it is 3
    assert prompt_groups(ids, spans, first=6, block=2) == [([0, 1, 3], 4), ([2], 0)]
    assert prompt_groups(ids, spans, first=6, block=3) == [([0, 1, 3], 3), ([2], 0)]
    assert prompt_groups(ids, spans, first=6, block=8) == [([0, 1, 3], 0), ([2], 0)]
    # rows with no real tokens share an empty prompt: nothing to run once
    empty = torch.zeros((2, 8), dtype=torch.long)
    assert prompt_groups(empty, [(0, 0), (0, 0)], first=6, block=2) == [([0, 1], 0)]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_episode_scoring_gives_trls_log_probs_entropies_and_gradients(household_sft_model_dir, tmp_path, checkpointing):
    """Each episode scored on its own tokens (sorted, 4 rows a chunk, no padding mask), its group's prompt run
    once, gives TRL's padded-batch log-probabilities and entropies on every real completion token, and the same
    gradient (float32). With activation checkpointing (TRL's default on a GPU) transformers drops a layer's cache
    in training, so the prompt is then run in every row: the same scores still."""
    from trl import GRPOTrainer

    model, tokenizer = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    tasks = load_tasks("household", "train", limit=3, **ENV_OPTIONS)
    settings = GRPOSettings(steps=1, tasks_per_step=3, num_generations=3, max_new_tokens=12, temperature=1.0,
                            trl={"pad_to_multiple_of": 16})
    trainer = EpisodeGRPOTrainer(
        model=model, reward_funcs=[component_reward(n) for n in COMPONENTS], args=grpo_config(tmp_path, settings),
        train_dataset=task_dataset("household", ENV_OPTIONS, tasks), processing_class=tokenizer,
        rollout_func=EpisodeRollouts("household", ENV_OPTIONS, tasks, tokenizer, settings),
    )
    batch = trainer._generate_and_score_completions([trainer.train_dataset[i] for i in (0, 0, 0, 1, 1, 1, 2, 2, 2)])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].shape[1]
    lengths = {e - s for s, e in real_spans(mask)}
    assert len(lengths) > 1 and (mask == 0).any(), "the batch must hold episodes of several lengths"
    groups = prompt_groups(ids, real_spans(mask), ids.shape[1] - keep, EpisodeGRPOTrainer.PROMPT_BLOCK)
    assert [len(rows) for rows, _ in groups] == [3, 3, 3] and all(shared >= 128 for _, shared in groups), groups
    scored = batch["completion_mask"].bool()
    results = []
    for score in (EpisodeGRPOTrainer._get_per_token_logps_and_entropies, GRPOTrainer._get_per_token_logps_and_entropies):
        model.zero_grad()
        logps, entropies, _ = score(trainer, model, ids, mask, keep, compute_entropy=True)
        (logps * scored).sum().backward()
        results.append((logps.detach(), entropies.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (ours, our_entropy, our_grads), (trls, trl_entropy, trl_grads) = results
    assert torch.allclose(ours[scored], trls[scored], atol=1e-4)
    assert torch.allclose(our_entropy[scored], trl_entropy[scored], atol=1e-4)
    assert (ours[~scored] == 0).all()
    for name, grad in trl_grads.items():
        assert torch.allclose(our_grads[name], grad, rtol=1e-3, atol=1e-5), name


def test_two_grpo_steps_change_every_parameter(household_sft_model_dir, tmp_path):
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    settings = GRPOSettings(
        steps=2, tasks_per_step=2, num_generations=4, max_new_tokens=12, learning_rate=1e-2,
        # Some sampled replies parse and some do not: format and TCR vary within a group.
        rewards={"outcome": 1.0, "format": 1.0, "tool_call": 1.0},
    )
    result = run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 2 and result["episodes"] == 16
    before, _ = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    after, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after.named_parameters())
    unchanged = [n for n, p in before.named_parameters() if torch.equal(p, trained[n])]
    assert unchanged == []
    logs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logs] == [1, 2]
    assert logs[0]["frac_reward_zero_std"] < 1.0  # a learning signal existed
    assert all("rewards/format/mean" in row and "frac_reward_zero_std" in row for row in logs)
    batches = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(batches) == 2 and all(b["episodes"] == 8 for b in batches)


def test_dynamic_sampling_replaces_flat_groups(tiny_model_dir, tmp_path):
    """The untrained model fails every task alike: every group is flat, so each is replaced (and stays flat)."""
    tasks = load_tasks("household", "train", limit=6, **ENV_OPTIONS)
    settings = GRPOSettings(steps=1, tasks_per_step=2, num_generations=2, max_new_tokens=4,
                            dynamic_sampling=True, resample_rounds=1)
    run_grpo(str(tiny_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    (batch,) = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert batch["replaced_groups"] == 2 and batch["zero_variance_groups"] == 2


class FailsOddSamples(ExpertPolicy):
    """The expert, except that on the tasks in `fail` its odd-numbered samples only look around (and fail)."""

    name = "fails-odd"

    def __init__(self, fail: set[str]):
        super().__init__()
        self.fail = fail

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            fails = p.sample % 2 and p.task.id.split("#")[0] in self.fail
            out += [Generation(expert_text(p.env, p.env.action_message("look")))] if fails else super().generate([p], params)
        return out


def test_rollouts_log_the_drawn_groups_apart_from_the_trained_batch(tmp_path):
    """Dynamic sampling swaps the group every episode of which solves its task alike (flat) for another task's
    group: the trained batch's reward leaves that group out, the drawn reward counts it."""
    from types import SimpleNamespace

    options = {"format": "act_line", "max_steps": 25}  # the expert solves every task within its steps
    tasks = load_tasks("household", "train", limit=3, **options)
    solved, mixed, spare = tasks
    settings = GRPOSettings(tasks_per_step=2, num_generations=2, dynamic_sampling=True, resample_rounds=1)
    policy = FailsOddSamples({mixed.id, spare.id})
    made = []  # one policy plays the drawn groups and their replacements: the weights are the step's throughout
    rollouts = EpisodeRollouts("household", options, tasks, SimpleNamespace(pad_token_id=0), settings,
                               tmp_path / "rollouts.jsonl",
                               policy_factory=lambda *a: made.append(policy) or policy)
    # use_vllm: the rollout asks the policy, not the trainer's model; one process logs.
    trainer = SimpleNamespace(use_vllm=True, accelerator=SimpleNamespace(num_processes=1, is_main_process=True))
    prompts = [[{"role": "user", "content": "", "task_id": t.id}] for t in (solved, solved, mixed, mixed)]
    out = rollouts(prompts, trainer)
    assert len(out["completion_ids"]) == 4
    (line,) = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert line["replaced_groups"] == 1  # the solved task's group, for the spare task's
    assert len(made) == 1 and rollouts.calls == 2  # two batches (drawn, replacement), one policy
    assert line["drawn_success"] == 0.75 and line["success"] == 0.5  # drawn: 2 + 1 of 4 succeed; trained: 1 + 1
    replayed = rollouts._episodes(policy, [Group(solved, 2), Group(mixed, 2)])  # the scripted policy plays them alike again
    rewards = [rollouts._total(traj) for group in replayed for traj in group.episodes]
    assert line["drawn_reward"] == pytest.approx(sum(rewards) / 4)
    assert line["reward"] < line["drawn_reward"]


# ---------------------------------------------------------------------------------------------------------------
# GiGPO's step-level credit (turnforge.train.step_credit)


def _played(task_id: str, steps: list[tuple[str, str]], success: bool) -> Trajectory:
    """An episode whose replies and observations are `steps`; each turn generates 2 ids, each observation 1."""
    messages = [Message("system", "rules"), Message("user", "room")]
    turns = []
    for k, (reply, observation) in enumerate(steps):
        messages += [Message("assistant", reply), Message("user", observation)]
        turns.append(Turn(text=reply, generated_ids=[20 + k, 2], logprobs=[-0.1, -0.1], observation_ids=[9]))
    return Trajectory(task_id, "e", "c", messages, turns, Score(success, float(success), float(success)),
                      StopReason.success if success else StopReason.failure, prompt_ids=[1])


def test_step_advantages_compare_turns_that_saw_the_same_observation():
    from turnforge.train.step_credit import group_step_advantages, reply_states, reward_scale, token_values

    fast = _played("t", [("go to desk", "On the desk, a pen."), ("take pen", "You take the pen.")], True)
    slow = _played("t", [("go to desk", "On the desk, a pen."), ("take cup", "Nothing happens."),
                         ("take pen", "You take the pen.")], True)
    lost = _played("t", [("go to bed", "On the bed, nothing."), ("take pen", "Nothing happens."),
                         ("look", "Nothing happens.")], False)
    assert reply_states(slow) == ["rules\nroom", "On the desk, a pen.", "Nothing happens."]
    # gamma 0.5. Returns: fast 0.5, 1 / slow 0.25, 0.5, 1 / lost 0, 0, 0.
    # "rules\nroom" (3 first turns): mean 0.25 -> +0.25, 0, -0.25. "On the desk, a pen." (fast and slow): mean
    # 0.75 -> +0.25, -0.25. "On the bed, nothing." (lost alone): 0. "Nothing happens." (the third turns of slow
    # and lost): mean 0.5 -> +0.5, -0.5. The observation after an episode's last reply is no state.
    rewards = [1.0, 1.0, 0.0]
    assert group_step_advantages([fast, slow, lost], rewards, gamma=0.5) == [
        [0.25, 0.25], [0.0, -0.25, 0.5], [-0.25, 0.0, -0.5],
    ]
    scale = reward_scale(rewards)  # the std TRL divides this group's episode advantages by (+1e-4)
    assert scale == pytest.approx(0.57735 + 1e-4, abs=1e-5)
    assert group_step_advantages([fast, slow, lost], rewards, 0.5, scale)[1][2] == pytest.approx(0.5 / scale)
    assert reward_scale([1.0, 1.0]) == 1.0  # no spread: the step term stays in reward units
    # Per token, on the completion episode_sequence builds: each turn's value on its ids, 0 on observations.
    _, completion, mask, _ = episode_sequence(slow, 100)
    values = token_values(slow, [0.0, -0.25, 0.5], 100)
    assert len(values) == len(completion) and values == [0.0, 0.0, 0.0, -0.25, -0.25, 0.0, 0.5, 0.5]
    assert all(v == 0.0 for v, m in zip(values, mask, strict=True) if m == 0)
    assert token_values(slow, [0.0, -0.25, 0.5], 4) == values[:4]


def test_step_credit_trainer_adds_the_step_term_to_each_token(household_sft_model_dir, tmp_path):
    """TRL's batch carries (B, T) advantages: TRL's own episode advantage plus omega x the step term per token."""
    from turnforge.train.grpo_trainer import StepCreditGRPOTrainer

    model, tokenizer = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    options = {"format": "act_line", "max_steps": 4}
    tasks = load_tasks("household", "train", limit=2, **options)
    settings = GRPOSettings(steps=1, tasks_per_step=2, num_generations=3, max_new_tokens=12, temperature=1.0,
                            step_advantage_weight=2.0, rewards={"outcome": 1.0, "format": 1.0, "tool_call": 1.0})
    captured: dict = {}

    class Spy(EpisodeRollouts):
        def __call__(self, prompts, trainer):
            out = super().__call__(prompts, trainer)
            captured.update(out, steps=self.step_advantages)
            return out

    rollouts = Spy("household", options, tasks, tokenizer, settings)
    trainer = StepCreditGRPOTrainer(
        model=model, reward_funcs=[component_reward(n) for n in COMPONENTS], args=grpo_config(tmp_path, settings),
        train_dataset=task_dataset("household", options, tasks), processing_class=tokenizer, rollout_func=rollouts,
    )
    rows = [task_dataset("household", options, tasks)[i] for i in (0, 0, 0, 1, 1, 1)]
    batch = trainer._generate_and_score_completions(rows)
    advantages = batch["advantages"]
    assert advantages.shape == batch["completion_ids"].shape
    assert rollouts.step_advantages is None  # taken by the trainer: never applied to another batch
    weights = settings.rewards.as_dict()
    totals = torch.tensor([sum(weights[n] * captured[f"reward_{n}"][i] for n in COMPONENTS) for i in range(6)])
    groups = totals.view(2, 3)
    episode = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).flatten()
    assert episode.abs().sum() > 0, "sampled episodes should differ in format / TCR within a group"
    varied = 0
    for i, steps in enumerate(captured["steps"]):
        expected = episode[i] + 2.0 * torch.tensor(steps)
        assert torch.allclose(advantages[i, : len(steps)], expected, atol=1e-5)
        assert torch.allclose(advantages[i, len(steps):], episode[i].expand(advantages.shape[1] - len(steps)))
        varied += len(set(steps)) > 1
    assert varied > 0, "some episode's turns must get different step advantages"


def test_two_step_credit_grpo_steps_change_every_parameter(household_sft_model_dir, tmp_path):
    tasks = load_tasks("household", "train", limit=4, **ENV_OPTIONS)
    settings = GRPOSettings(steps=2, tasks_per_step=2, num_generations=4, max_new_tokens=12, learning_rate=1e-2,
                            step_advantage_weight=1.0, rewards={"outcome": 1.0, "format": 1.0, "tool_call": 1.0})
    result = run_grpo(str(household_sft_model_dir), "household", ENV_OPTIONS, tasks, tmp_path, settings)
    assert result["steps"] == 2
    before, _ = load_model(str(household_sft_model_dir), dtype="float32", device="cpu")
    after, _ = load_model(str(tmp_path / "model"), dtype="float32", device="cpu")
    trained = dict(after.named_parameters())
    assert [n for n, p in before.named_parameters() if torch.equal(p, trained[n])] == []


def test_rollouts_run_the_model_in_its_own_dtype_not_accelerates_autocast(tiny_model_dir):
    """A bf16 mixed-precision model (accelerate wraps its forward in autocast) generates in float32 inside
    `own_precision`, as evaluations run it, and gets its wrapper back on leaving."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from turnforge.train.grpo_rollouts import own_precision

    plain, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    AcceleratorState._reset_state(reset_partial_state=True)  # a trainer of another test may have set "no"
    try:
        model = Accelerator(mixed_precision="bf16", cpu=True).prepare_model(model)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    ids = torch.arange(5, 45).unsqueeze(0)
    with torch.no_grad():
        reference = plain(input_ids=ids).logits
        assert not torch.equal(model(input_ids=ids).logits, reference)  # the wrapper autocasts
        wrapped = model.forward
        with own_precision(model):
            assert torch.equal(model(input_ids=ids).logits, reference)
        assert model.forward == wrapped
        assert not torch.equal(model(input_ids=ids).logits, reference)


def test_task_dataset_closes_the_env_it_reads_prompts_from(monkeypatch):
    """The env that writes the dataset's prompts is closed (it may hold a sandbox or an OpenEnv session)."""
    import turnforge.train.grpo as grpo

    closed = []

    def make(name, **options):
        env = make_env(name, **options)
        close = env.close
        env.close = lambda: (closed.append(env), close())
        return env

    monkeypatch.setattr(grpo, "make_env", make)
    task_dataset("household", ENV_OPTIONS, load_tasks("household", "train", limit=2, **ENV_OPTIONS))
    assert len(closed) == 1


def test_a_grpo_step_is_the_recipes_batch_whatever_the_processes(monkeypatch):
    """tasks_per_step x num_generations episodes a step over all processes (issue 62): each process plays and trains
    its share, whole groups; what does not divide is refused in one line naming the setting to change."""
    s = GRPOSettings(tasks_per_step=4, num_generations=2)
    assert [s.per_process(n) for n in (1, 2, 4)] == [(8, 1), (4, 1), (2, 1)]  # (rows a forward, accumulation) per process
    assert GRPOSettings(tasks_per_step=4, num_generations=2, micro_batch_size=2).per_process(2) == (2, 2)
    with pytest.raises(ValueError, match=r"tasks_per_step=3 does not split over 2 processes.*multiple of 2"):
        GRPOSettings(tasks_per_step=3).per_process(2)
    with pytest.raises(ValueError, match=r"micro_batch_size=4 must divide one process's episodes a step.* = 2"):
        GRPOSettings(tasks_per_step=2, num_generations=2, micro_batch_size=4).per_process(2)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as `accelerate launch --num_processes 2` starts each process
    with pytest.raises(ValueError, match="tasks_per_step=3"):
        GRPOSettings(tasks_per_step=3)  # at load, before any stage runs
    kwargs = GRPOSettings(tasks_per_step=4, num_generations=2).trl_kwargs()
    assert (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"]) == (4, 1)
