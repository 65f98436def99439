"""Expert-guided exploration (`ExpertGuided`, GRPO's `guide`): which replies the expert writes, and how."""

from __future__ import annotations

import json

import pytest

from turnforge.envs.base import expert_text, load_tasks, make_env
from turnforge.models import load_model
from turnforge.models.chat import ChatTemplateRenderer
from turnforge.policies.base import Generation, Prompt, SamplingParams, turn_draw
from turnforge.policies.scripted import ExpertGuided
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.train.grpo import GRPOSettings, run_grpo
from turnforge.types import Message

OPTIONS = {"format": "act_line", "expert": "explorer", "thoughts": "goal", "max_steps": 12}


class Looks:
    """Stands in for the model: always looks around (never the expert's reply on these tasks)."""

    name = "looks"
    renderer = None

    def __init__(self):
        self.asked = 0

    def generate(self, prompts, params):
        self.asked += len(prompts)
        return [Generation(expert_text(p.env, p.env.action_message("look"))) for p in prompts]


def test_the_expert_writes_the_drawn_turns_at_the_state_the_episode_reached():
    tasks = load_tasks("household", "train", limit=6, **OPTIONS)
    inner = Looks()
    guided = ExpertGuided(inner, 0.5, seed=3)
    trajs = run_episodes(guided, lambda: make_env("household", **OPTIONS), tasks, 2, RolloutLimits(max_open=12),
                         SamplingParams())
    drawn = expert_turns = 0
    for traj in trajs:
        task = next(t for t in tasks if t.id == traj.task_id)
        env = make_env("household", **OPTIONS)  # the episode again, asking the expert only at its drawn turns
        env.reset(task)
        for k, turn in enumerate(traj.turns):
            if turn_draw("guide", 3, Prompt([], task, traj.sample, k)) < 0.5:
                drawn += 1
                assert turn.text == expert_text(env)
                expert_turns += "ACTION: look" not in turn.text
            else:
                assert turn.text.endswith("ACTION: look")
            env.step(env.format.parse(turn.text))
    assert guided.guided == drawn and inner.asked == sum(len(t.turns) for t in trajs) - drawn
    assert 0 < drawn < sum(len(t.turns) for t in trajs) and expert_turns > 0
    with pytest.raises(ValueError, match="guide"):
        ExpertGuided(inner, 1.0)


def test_a_guided_reply_is_tokenized_as_the_model_writes_it(tiny_model_dir):
    _, tokenizer = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    renderer = ChatTemplateRenderer(tokenizer)
    inner = Looks()
    inner.renderer = renderer
    (task,) = load_tasks("household", "train", limit=1, **OPTIONS)
    env = make_env("household", **OPTIONS)
    messages = env.reset(task)
    prompt = Prompt(messages, task, 0, 0, ids=renderer.prompt_ids(messages, None), env=env)
    (gen,) = ExpertGuided(inner, 0.999999).generate([prompt], SamplingParams())
    assert gen.text.startswith("THOUGHT: ") and "ACTION: go to " in gen.text
    assert gen.ids == renderer.completion_ids([*messages, Message("assistant", gen.text)], None)
    assert gen.ids[-1] == renderer.eos_id and tokenizer.decode(gen.ids[:-1]) == gen.text
    assert gen.logprobs == [0.0] * len(gen.ids)


def test_guide_is_checked_and_kept_from_vllm():
    with pytest.raises(ValueError, match="guide"):
        GRPOSettings(guide=1.0)
    with pytest.raises(ValueError, match="guide > 0 .*use_vllm"):
        GRPOSettings(guide=0.25, use_vllm=True)
    assert "guide" not in GRPOSettings(guide=0.25).trl_kwargs()  # the rollout's, not TRL's


def test_a_guided_grpo_step_logs_the_experts_turns(household_sft_model_dir, tmp_path):
    options = {"format": "act_line", "expert": "explorer", "max_steps": 4}
    tasks = load_tasks("household", "train", limit=2, **options)
    settings = GRPOSettings(steps=1, tasks_per_step=2, num_generations=2, max_new_tokens=12, guide=0.5,
                            rewards={"outcome": 1.0, "progress": 1.0})
    run_grpo(str(household_sft_model_dir), "household", options, tasks, tmp_path, settings)
    (batch,) = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert batch["episodes"] == 4 and 0 < batch["guided_turns"] < 4 * 4
