"""The rollout engine driven end to end by scripted policies on the real household env."""

from __future__ import annotations

import json
import re

import pytest

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.envs.household import TASK_TYPES, HouseholdEnv
from turnforge.policies import PolicySpec, make_policy
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.policies.scripted import ExpertPolicy, RandomPolicy, ReplayPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.types import Message, StopReason, Trajectory


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=30)


def household() -> HouseholdEnv:
    return make_env("household")


HOUSEHOLD_DEFAULTS = get_env_spec("household").defaults()
"""What make_env gives the household env unasked: the subclasses below are built directly."""


def _outcome(traj: Trajectory) -> dict:
    """Everything about an episode except its timings (which differ run to run)."""
    out = traj.to_dict()
    out.pop("timings")
    return out


def test_expert_solves_every_task(tasks):
    trajs = run_episodes(ExpertPolicy(), household, tasks, samples_per_task=1)
    assert [t.task_id for t in trajs] == [t.id for t in tasks]
    assert [t.stop_reason for t in trajs] == [StopReason.success] * 30
    assert all(t.score.success and t.score.reward == 1.0 and t.score.progress == 1.0 for t in trajs)
    assert {t.category for t in trajs} == set(TASK_TYPES)
    for traj in trajs:
        assert traj.env_steps == len(traj.turns) > 0 and traj.model == "expert"
        assert all(turn.parse_ok for turn in traj.turns)
        # system, user, then (assistant in the format, observation) per turn; the transcript keeps the raw text
        roles = [m.role for m in traj.messages]
        assert roles == ["system", "user"] + ["assistant", "user"] * len(traj.turns)
        replies = [m.content for m in traj.messages if m.role == "assistant"]
        assert replies == [turn.text for turn in traj.turns] and replies[0].startswith("ACTION: ")
        assert set(traj.timings) == {"wall_s", "generate_s", "env_s"}


def test_random_policy_rarely_succeeds(tasks):
    trajs = run_episodes(RandomPolicy(seed=0), household, tasks, samples_per_task=2)
    assert len(trajs) == 60
    success = sum(t.score.success for t in trajs) / len(trajs)
    assert success <= 0.25, success
    assert {t.stop_reason for t in trajs} <= {StopReason.success, StopReason.max_turns}
    assert all(len(t.turns) <= 50 for t in trajs)  # the env's own limit (max_steps=50)
    assert all(turn.parse_ok for t in trajs for turn in t.turns)


class ExplodingHousehold(HouseholdEnv):
    """The real household env, except that `step` raises on the 3rd turn of the tasks in `explode`."""

    def __init__(self, explode: set[str]):
        super().__init__(**HOUSEHOLD_DEFAULTS)
        self.explode = explode

    def reset(self, task):
        self.turn = 0
        return super().reset(task)

    def step(self, reply):
        self.turn += 1
        if self.task.id in self.explode and self.turn == 3:
            raise RuntimeError("simulated engine crash")
        return super().step(reply)


@pytest.mark.parametrize("env_workers", [0, 3])
def test_env_exception_ends_only_that_episode(tasks, env_workers):
    boom = tasks[1].id
    finished = []
    trajs = run_episodes(
        ExpertPolicy(),
        lambda: ExplodingHousehold({boom}),
        tasks[:6],
        samples_per_task=1,
        limits=RolloutLimits(env_workers=env_workers),
        on_finish=finished.append,
    )
    by_id = {t.task_id: t for t in trajs}
    crashed = by_id.pop(boom)
    assert crashed.stop_reason is StopReason.env_error and len(crashed.turns) == 2
    assert not crashed.score.success
    assert (
        "simulated engine crash" in crashed.score.details["error"]
        and "Traceback" in crashed.score.details["error"]
    )
    assert all(t.stop_reason is StopReason.success for t in by_id.values())
    assert sorted(t.task_id for t in finished) == sorted(t.id for t in tasks[:6])


def _write_replies(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_garbage_replies_hit_the_format_error_limit(tasks, tmp_path):
    garbage = "I think I should look around the room first."
    replay = ReplayPolicy(
        _write_replies(
            tmp_path / "replies.jsonl",
            [
                {"task_id": tasks[0].id, "replies": [garbage] * 10},
                # the limit counts CONSECUTIVE errors: a good reply in between resets the count
                {"task_id": tasks[1].id, "replies": [garbage, garbage, "ACTION: look"] + [garbage] * 10},
            ],
        )
    )
    first, second, third = run_episodes(replay, household, tasks[:3], 1, RolloutLimits(max_format_errors=3))
    assert first.stop_reason is StopReason.format_error_limit and len(first.turns) == 3
    assert [t.parse_ok for t in first.turns] == [False] * 3 and first.turns[0].parse_error
    assert first.score.details["format_errors"] == 3  # the env saw each FormatError and answered it
    assert second.stop_reason is StopReason.format_error_limit and len(second.turns) == 6
    assert third.stop_reason is StopReason.gave_up and third.turns == []  # no replies for this task


def test_max_turns(tasks):
    trajs = run_episodes(RandomPolicy(seed=1), household, tasks[:6], 1, RolloutLimits(max_turns=3))
    assert all(len(t.turns) <= 3 for t in trajs)
    assert all(t.stop_reason in (StopReason.max_turns, StopReason.success) for t in trajs)
    assert any(t.stop_reason is StopReason.max_turns for t in trajs)
    # without our limit, the env's own step limit ends the episode
    short_env = lambda: make_env("household", max_steps=4)  # noqa: E731
    trajs = run_episodes(RandomPolicy(seed=1), short_env, tasks[:6], 1)
    assert all(len(t.turns) <= 4 for t in trajs) and any(t.stop_reason is StopReason.max_turns for t in trajs)


@pytest.mark.parametrize("policy", [ExpertPolicy(), RandomPolicy(seed=3)], ids=["expert", "random"])
def test_batching_does_not_change_results(tasks, policy):
    one = run_episodes(policy, household, tasks[:12], 2, RolloutLimits(max_open=1))
    many = run_episodes(policy, household, tasks[:12], 2, RolloutLimits(max_open=64, env_workers=4))
    assert [_outcome(t) for t in one] == [_outcome(t) for t in many]


class CountingPolicy:
    """Random, recording each `generate` batch."""

    name = "counting"

    def __init__(self):
        self.inner = RandomPolicy(seed=0)
        self.batches: list[list[Prompt]] = []

    def generate(self, prompts, params):
        self.batches.append([(p.task.id, p.turn, p.messages[-1].role) for p in prompts])
        return self.inner.generate(prompts, params)


def test_one_generate_call_per_round_for_the_whole_batch(tasks):
    policy = CountingPolicy()
    trajs = run_episodes(policy, household, tasks[:10], 1, RolloutLimits(max_open=4, max_turns=5))
    assert [len(b) for b in policy.batches[:5]] == [4] * 5  # 4 open episodes, 5 turns each
    assert max(len(b) for b in policy.batches) == 4
    assert sum(len(b) for b in policy.batches) == sum(len(t.turns) for t in trajs)
    assert all(role == "user" for batch in policy.batches for _, _, role in batch)


def test_trajectory_json_round_trip(tasks):
    trajs = run_episodes(ExpertPolicy(), household, tasks[:6], 1)
    trajs += run_episodes(RandomPolicy(seed=0), household, tasks[:6], 1, RolloutLimits(max_turns=5))
    for traj in trajs:
        assert Trajectory.from_json(traj.to_json()) == traj


# ---- token-exact accumulation, with a character-level "tokenizer" standing in for a chat template ----


def _encode(text: str) -> list[int]:
    return [ord(ch) for ch in text]


def _chat_template(messages: list[Message]) -> str:
    return "".join(f"<{m.role}>{m.content}</>" for m in messages) + "<assistant>"


class CharRenderer:
    """Each message renders as <role>content</>; the prompt ends with the <assistant> header."""

    window = None
    family = None

    def prompt_ids(self, messages, tools):
        return _encode(_chat_template(messages))

    def observation_ids(self, messages, new_messages, tools, generated_ids, finish_reason):
        return _encode(_chat_template(new_messages))


class TokenPolicy:
    """Random replies 'generated' as ids (text + end-of-turn), with the renderer the rollout uses."""

    name = "token"

    def __init__(self):
        self.inner = RandomPolicy(seed=0)
        self.renderer = CharRenderer()

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        for p in prompts:  # the prompt ids are the exact template of the conversation so far
            assert p.ids == _encode(_chat_template(p.messages))
        gens = self.inner.generate(prompts, params)
        return [
            Generation(text=g.text, ids=_encode(g.text + "</>"), logprobs=[-0.5] * (len(g.text) + 3))
            for g in gens
        ]


def test_token_exact_ids_equal_the_rendered_conversation(tasks):
    trajs = run_episodes(policy := TokenPolicy(), household, tasks[:4], 1, RolloutLimits(max_turns=4), renderer=policy.renderer)
    for traj in trajs:
        ids = list(traj.prompt_ids)
        for turn in traj.turns:
            ids += turn.generated_ids + turn.observation_ids
            assert len(turn.logprobs) == len(turn.generated_ids)
        assert ids == _encode(_chat_template(traj.messages))
        assert traj.tokens_generated == sum(len(t.generated_ids) for t in traj.turns)


def test_max_total_tokens_counts_the_whole_sequence_when_token_exact(tasks):
    trajs = run_episodes(policy := TokenPolicy(), household, tasks[:3], 1, RolloutLimits(max_total_tokens=3000), renderer=policy.renderer)
    for traj in trajs:
        total = len(traj.prompt_ids) + sum(len(t.generated_ids) + len(t.observation_ids) for t in traj.turns)
        assert traj.stop_reason is StopReason.max_tokens and total >= 3000


# ---- scripted policies: their inputs and errors ----


def test_replay_reads_trajectories_and_reply_lines_and_names_bad_lines(tasks, tmp_path):
    [expert_traj] = run_episodes(ExpertPolicy(), household, tasks[:1], 1)
    good = tmp_path / "good.jsonl"
    good.write_text(
        expert_traj.to_json() + "\n\n" + json.dumps({"task_id": "x", "sample": 2, "replies": ["a"]}) + "\n"
    )
    replies = ReplayPolicy(good).replies
    assert replies[(tasks[0].id, 0)] == [t.text for t in expert_traj.turns] and replies[("x", 2)] == ["a"]

    bad = tmp_path / "bad.jsonl"
    for line, message in [
        ('{"task_id": "x", "replies": ["a"]', "not valid JSON"),
        ('{"replies": ["a"]}', "no string task_id"),
        ('{"task_id": "x", "replies": "a"}', "list of strings"),
        ('{"task_id": "x", "answer": 1}', "expected a trajectory"),
        ('{"task_id": "t", "replies": []}', "already has replies"),
    ]:
        bad.write_text(json.dumps({"task_id": "t", "replies": []}) + "\n" + line + "\n")
        with pytest.raises(ValueError, match=f"{re.escape(str(bad))}:2: .*{message}"):
            ReplayPolicy(bad)
    with pytest.raises(ValueError, match="does not exist"):
        ReplayPolicy(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="holds no replies"):
        ReplayPolicy(tmp_path / "empty.jsonl")


def test_replay_accepts_openai_content_parts_and_rejects_other_contents(tasks, tmp_path):
    """OpenAI messages may carry their text as content parts; an int content is refused at load, with FILE:LINE."""
    parts = [{"type": "text", "text": "ACTION: "}, {"type": "text", "text": "look"}]
    path = tmp_path / "parts.jsonl"
    path.write_text(json.dumps({"task_id": tasks[0].id, "messages": [{"role": "assistant", "content": parts}]}) + "\n")
    assert ReplayPolicy(path).replies[(tasks[0].id, 0)] == ["ACTION: look"]
    path.write_text(json.dumps({"task_id": tasks[0].id, "messages": [{"role": "assistant", "content": 7}]}) + "\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:1: .*content a string or text parts"):
        ReplayPolicy(path)


def test_make_policy_specs(tmp_path):
    assert isinstance(make_policy("expert"), ExpertPolicy)
    assert make_policy("random", seed=7).seed == 7
    (tmp_path / "r.jsonl").write_text('{"task_id": "t", "replies": ["ACTION: look"]}\n')
    assert make_policy(f"replay:{tmp_path / 'r.jsonl'}").name == f"replay:{tmp_path / 'r.jsonl'}"
    # issue 14: openai:URL is a policy now (a named model needs no request to build it)
    served = make_policy("openai:http://localhost:8000/v1", model="Qwen/Qwen3-4B-Instruct-2507", concurrency=4)
    assert (served.name, served.model, served.max_in_flight, served.renderer) == (
        "openai", "Qwen/Qwen3-4B-Instruct-2507", 4, None)
    with pytest.raises(ValueError, match="does not take window"):
        make_policy("openai:http://localhost:8000/v1#m", window=2)
    pytest.importorskip("torch")
    try:
        import vllm  # noqa: F401
    except ImportError:  # the CPU install: a clear way out, not a traceback
        with pytest.raises(ImportError, match=r'pip install "turnforge\[vllm\]"'):
            make_policy("vllm", model="Qwen/Qwen3-4B-Instruct-2507")
    for spec, message in [
        ("hf", "needs a model"),
        ("replay", "needs a file"),
        ("openai", "needs a URL"),
        ("greedy", "unknown policy"),
        ("expert:x", "takes no argument"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_policy(spec)
    with pytest.raises(ValueError, match="two models for one policy"):
        make_policy("hf:runs/a/model", model="runs/b/model")


def test_policy_specs_name_kind_target_and_served_model():
    assert PolicySpec.parse("hf:runs/x/model") == PolicySpec("hf", "runs/x/model")
    assert PolicySpec.parse("vllm") == PolicySpec("vllm")
    assert PolicySpec.parse("openai:http://127.0.0.1:8000/v1#qwen") == PolicySpec("openai", "http://127.0.0.1:8000/v1", "qwen")
    assert PolicySpec.parse("openai:http://127.0.0.1:8000/v1") == PolicySpec("openai", "http://127.0.0.1:8000/v1")
    assert PolicySpec.parse("replay:a#b.jsonl") == PolicySpec("replay", "a#b.jsonl")


def test_scripted_policies_need_the_env_support_they_use(tasks):
    class TextOnlyEnv:  # an env with neither an expert nor an action list
        name = "text_only"

    prompt = Prompt(messages=[], task=tasks[0], sample=0, turn=0, env=TextOnlyEnv())
    with pytest.raises(ValueError, match="no expert"):
        ExpertPolicy().generate([prompt], SamplingParams())
    with pytest.raises(ValueError, match="admissible actions"):
        RandomPolicy().generate([prompt], SamplingParams())


@pytest.mark.parametrize(
    "bad", [{"max_open": 0}, {"max_turns": 0}, {"max_format_errors": 0}, {"env_workers": -1}]
)
def test_limits_reject_values_that_would_stall_or_mean_nothing(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RolloutLimits(**bad)


class PlannerlessHousehold(HouseholdEnv):
    """The real household env whose expert fails on one task (as a planner bug would)."""

    def __init__(self):
        super().__init__(**HOUSEHOLD_DEFAULTS)

    def expert_reply(self):
        if self.task.id == "test-00002":
            raise RuntimeError("no plan")
        return super().expert_reply()


def test_a_failing_expert_gives_up_that_episode_only(tasks):
    with pytest.warns(RuntimeWarning, match="test-00002.*no plan"):
        trajs = run_episodes(ExpertPolicy(), PlannerlessHousehold, tasks[:4], 1)
    assert [t.stop_reason for t in trajs] == [StopReason.success] * 2 + [
        StopReason.gave_up,
        StopReason.success,
    ]


def test_replay_files_with_broken_bytes_or_absurd_nesting_are_one_line_errors(tmp_path):
    """Issue 17: invalid UTF-8 and deeply nested JSON gave tracebacks without file and line."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"task_id": "t", "replies": ["ok"]}\n{"task_id": "t\xff\xfe"}\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: not UTF-8 text"):
        ReplayPolicy(path)
    path.write_text('{"task_id": "t", "replies": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:1: JSON nested too deeply"):
        ReplayPolicy(path)
