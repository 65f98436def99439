"""SFT examples: which tokens carry loss (`assistant_mask`), for scripted, token-exact and windowed trajectories."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from test_token_exact import ExpertTokenPolicy, chat_ids  # helpers of a sibling test module
from turnforge.data.sft import SFTExample, assistant_mask, conversation_examples, trajectory_examples
from turnforge.envs.base import load_tasks, make_env
from turnforge.formats.chat_template import window_messages
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes

FORMATS = ["act_line", "tool_call"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=4)


def expert_trajectories(tasks, fmt):
    return run_episodes(ExpertPolicy(), lambda: make_env("household", format=fmt), tasks, 1)


def masked_spans(tokenizer, example: SFTExample) -> list[str]:
    """The text of each run of consecutive loss tokens."""
    spans, current = [], []
    for token, m in zip(example.input_ids, example.completion_mask, strict=True):
        if m:
            current.append(token)
        elif current:
            spans, current = [*spans, current], []
    spans += [current] if current else []
    return [tokenizer.decode(span) for span in spans]


def test_assistant_mask_marks_exactly_the_assistant_ids():
    example = assistant_mask([1, 2, 3], [([4, 5], [6, 7]), ([8], [9]), ([10, 11], [])])
    assert example.input_ids == list(range(1, 12))
    assert example.completion_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert assistant_mask([1, 2], []) == SFTExample([1, 2], [0, 0])
    assert assistant_mask([], [([3], [])]) == SFTExample([3], [1])
    assert assistant_mask([1], [([], [2])]) == SFTExample([1, 2], [0, 0])  # an empty reply carries no loss


@pytest.mark.parametrize("fmt", FORMATS)
def test_rendered_trajectory_masks_the_replies_and_their_end_of_turn(tokenizer, tasks, fmt):
    for traj in expert_trajectories(tasks, fmt):
        assert traj.prompt_ids == []  # scripted: no ids, the messages are rendered
        [example] = trajectory_examples(traj, tokenizer)
        assert masked_spans(tokenizer, example) == [turn.text + "<|im_end|>" for turn in traj.turns]
        # the ids are the template's own up to the last reply's <|im_end|> (the conversation's final
        # observation carries no loss and is left out)
        last = max(i for i, m in enumerate(traj.messages) if m.role == "assistant")
        rendered = chat_ids(tokenizer, traj.messages[: last + 1], traj.tools, generation_prompt=False)
        assert rendered == example.input_ids + tokenizer.encode("\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_token_exact_trajectory_keeps_its_ids_and_masks_the_generated_ones(tokenizer, tasks, fmt):
    policy = ExpertTokenPolicy(tokenizer)
    for traj in run_episodes(policy, lambda: make_env("household", format=fmt), tasks, 1, renderer=policy.renderer):
        [example] = trajectory_examples(traj, tokenizer)
        expected_ids, expected_mask = list(traj.prompt_ids), [0] * len(traj.prompt_ids)
        for k, turn in enumerate(traj.turns):
            observation = turn.observation_ids if k + 1 < len(traj.turns) else []
            expected_ids += turn.generated_ids + observation
            expected_mask += [1] * len(turn.generated_ids) + [0] * len(observation)
        assert example == SFTExample(expected_ids, expected_mask)
        # and a rendering of the same conversation without ids gives the same example
        traj.prompt_ids = []
        assert trajectory_examples(traj, tokenizer) == [example]


def test_a_noisy_experts_mistakes_are_in_the_sequence_without_loss(tokenizer):
    """`Turn.learn = False` (a DART mistake): its reply stays in the sequence, as the context of the recovery
    after it, and carries no loss; rendered, token-exact and windowed alike."""
    tasks = load_tasks("household", "test", limit=12)
    make = lambda: make_env("household", expert="explorer", thoughts="goal")  # noqa: E731
    trajs = [t for t in run_episodes(ExpertPolicy(noise=0.3, seed=1), make, tasks, 1) if not all(x.learn for x in t.turns)]
    assert len(trajs) >= 6
    for traj in trajs:
        [example] = trajectory_examples(traj, tokenizer)
        assert masked_spans(tokenizer, example) == [t.text + "<|im_end|>" for t in traj.turns if t.learn]
        last = max(i for i, t in zip(traj.reply_indices(), traj.turns, strict=True) if t.learn)
        rendered = chat_ids(tokenizer, traj.messages[: last + 1], traj.tools, generation_prompt=False)
        assert rendered == example.input_ids + tokenizer.encode("\n")  # the mistakes' text is in the ids
        windowed = trajectory_examples(traj, tokenizer, window=2)
        assert [tokenizer.decode(e.input_ids[e.completion_mask.index(1):]) for e in windowed] \
            == [t.text + "<|im_end|>" for t in traj.turns if t.learn]
    # token-exact: the mistake's generated ids are masked, nothing else changes
    policy = ExpertTokenPolicy(tokenizer)
    [traj] = run_episodes(policy, lambda: make_env("household"), tasks[:1], 1, renderer=policy.renderer)
    [full] = trajectory_examples(traj, tokenizer)
    traj.turns[1].learn = False
    [partial] = trajectory_examples(traj, tokenizer)
    start = len(traj.prompt_ids) + len(traj.turns[0].generated_ids) + len(traj.turns[0].observation_ids)
    n = len(traj.turns[1].generated_ids)
    assert partial.input_ids == full.input_ids
    assert full.completion_mask[start : start + n] == [1] * n
    assert partial.completion_mask == full.completion_mask[:start] + [0] * n + full.completion_mask[start + n :]


@pytest.mark.parametrize("fmt", FORMATS)
def test_with_a_window_one_example_per_turn_with_the_windowed_prompt(tokenizer, tasks, fmt):
    for traj in expert_trajectories(tasks, fmt):
        examples = trajectory_examples(traj, tokenizer, window=2)
        assistant_at = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        assert len(examples) == len(traj.turns) == len(assistant_at)
        for example, turn, i in zip(examples, traj.turns, assistant_at, strict=True):
            prompt = chat_ids(tokenizer, window_messages(traj.messages[:i], 2), traj.tools)
            completion = tokenizer.encode(turn.text) + [tokenizer.eos_token_id]
            assert example == SFTExample(prompt + completion, [0] * len(prompt) + [1] * len(completion))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_windowed_rollout_gives_its_recorded_prompt_completion_pairs(tokenizer, tasks, fmt):
    policy = ExpertTokenPolicy(tokenizer, window=2)
    for traj in run_episodes(policy, lambda: make_env("household", format=fmt), tasks, 1, renderer=policy.renderer):
        examples = trajectory_examples(traj, tokenizer)  # the trajectory's own window, whatever is asked
        assert examples == [
            SFTExample(t.prompt_ids + t.generated_ids, [0] * len(t.prompt_ids) + [1] * len(t.generated_ids))
            for t in traj.turns
        ]
        # the same pairs as rendering its messages with that window
        traj.prompt_ids = []
        assert trajectory_examples(traj, tokenizer, window=2) == examples


def test_token_exact_trajectory_with_a_window_renders_windowed_prompts_for_its_generated_ids(tokenizer, tasks):
    [traj] = run_episodes(p := ExpertTokenPolicy(tokenizer), lambda: make_env("household"), tasks[:1], 1, renderer=p.renderer)
    examples = trajectory_examples(traj, tokenizer, window=1)
    assert [e.input_ids[len(e.input_ids) - len(t.generated_ids) :] for e, t in zip(examples, traj.turns, strict=True)] \
        == [t.generated_ids for t in traj.turns]
    traj.prompt_ids = []
    assert trajectory_examples(traj, tokenizer, window=1) == examples


def test_conversation_with_structured_tool_calls(tokenizer):
    call = {"type": "function", "function": {"name": "act", "arguments": json.dumps({"action": "open fridge 1"})}}
    messages = [
        {"role": "system", "content": "You are a household agent."},
        {"role": "user", "content": "Your task is to: cool some apple."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "act", "content": "You open the fridge 1."},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks."},
    ]
    tools = [make_env("household", format="tool_call").tools()[0]]
    [example] = conversation_examples(messages, tools, tokenizer)
    assert masked_spans(tokenizer, example) == [
        '<tool_call>\n{"name": "act", "arguments": {"action": "open fridge 1"}}\n</tool_call><|im_end|>',
        "Done.<|im_end|>",
    ]
    rendered = tokenizer.apply_chat_template(messages[:5], tools=tools)["input_ids"]
    assert rendered == example.input_ids + tokenizer.encode("\n")
    assert conversation_examples(messages[:2], tools, tokenizer) == []
    with pytest.raises(ValueError, match="must start with a system or user message"):
        conversation_examples(messages[2:], tools, tokenizer)


def test_an_envs_own_prompt_assistant_turns_carry_no_loss(tokenizer):
    """Issue 11: DBBench's prompt holds the env's few-shot assistant "Ok."; it is prompt, not a reply. Scripted
    (rendered) and token-exact trajectories get the same example: loss on the policy's replies only."""
    tasks = load_tasks("sql", "train", generate=6)
    scripted = run_episodes(ExpertPolicy(), lambda: make_env("sql", generate=6), tasks, 1)
    token_policy = ExpertTokenPolicy(tokenizer)
    exact = run_episodes(token_policy, lambda: make_env("sql", generate=6), tasks, 1, renderer=token_policy.renderer)
    for traj, traj_exact in zip(scripted, exact, strict=True):
        assert [m.content for m in traj.messages[:3] if m.role == "assistant"] == ["Ok."]
        [example] = trajectory_examples(traj, tokenizer)
        assert masked_spans(tokenizer, example) == [turn.text + "<|im_end|>" for turn in traj.turns]
        [example_exact] = trajectory_examples(traj_exact, tokenizer)
        assert example_exact == example


def test_trajectory_records_train_in_episode_order_whatever_order_they_finished_in():
    from turnforge.data.sft import in_episode_order

    finished = [("f:1", {"task_id": "t2", "sample": 0, "turns": []}), ("f:2", {"task_id": "t1", "sample": 1, "turns": []}),
                ("f:3", {"task_id": "t1", "sample": 0, "turns": []})]
    assert [w for w, _ in in_episode_order(finished)] == ["f:3", "f:2", "f:1"]
    assert [w for w, _ in in_episode_order(reversed(finished))] == ["f:3", "f:2", "f:1"]
    conversations = [("c:1", {"messages": [2]}), ("c:2", {"messages": [1]})]
    assert in_episode_order(conversations) == conversations  # records without an episode key keep their order


def test_rendering_a_conversation_turn_by_turn_renders_each_prefix_once(tokenizer, tasks, monkeypatch):
    """`conversation_examples` renders through a memo (`chat_renderer(memo=True)`): the same examples as
    without it, two renders a turn instead of four; the memo answers only for the very
    message objects it rendered (an equal copy is rendered anew)."""
    import turnforge.data.sft as sft_data
    import turnforge.formats.chat_template as chat

    calls = []
    real = chat.render
    monkeypatch.setattr(chat, "render", lambda *a, **k: calls.append(1) or real(*a, **k))
    traj = expert_trajectories(tasks[:1], "act_line")[0]
    turns = len(traj.turns)
    chat.ChatTemplateRenderer(tokenizer)  # the template's start-up check renders probes once per tokenizer
    examples = {}
    for memo in (False, True):
        calls.clear()
        monkeypatch.setattr(sft_data, "chat_renderer",
                            lambda tok, window=None, memo=True, _on=memo: chat.ChatTemplateRenderer(tok, window, _on))
        examples[memo] = conversation_examples(traj.messages, traj.tools, tokenizer, replies=traj.reply_indices())
        assert len(calls) == (4 * turns - 1 if not memo else 2 * turns + 1)
    assert examples[True] == examples[False]
    renderer = chat.ChatTemplateRenderer(tokenizer, memo=True)
    first = renderer.prompt_ids(traj.messages[:2], traj.tools)
    calls.clear()
    assert renderer.prompt_ids(traj.messages[:2], traj.tools) == first and not calls
    copy = [chat.Message(m.role, m.content) for m in traj.messages[:2]]
    assert renderer.prompt_ids(copy, traj.tools) == first and len(calls) == 1
