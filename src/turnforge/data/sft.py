"""SFT examples: token ids + the completion mask, from trajectories or conversational records.

Which tokens carry loss is one function, `assistant_mask`: 1 exactly on what the assistant generated (its
reply and the end-of-turn token that closes it), 0 on the prompt and on every observation.

- A token-exact trajectory (a model's rollout: `prompt_ids`, and per turn `generated_ids` +
  `observation_ids`) is used as recorded: the ids the model saw and sampled, never re-tokenized.
- A trajectory without ids (a scripted expert's) or a conversational record is rendered with the
  tokenizer's chat template by the same renderer the rollouts use (`chat_renderer`), so an example's ids are
  the ones a rollout of the same conversation would have produced (prompt header tokens apart from the
  reply's tokens, exactly as at inference).
- With a history `window`, one example per assistant turn: the windowed prompt (as the rollout with that
  window renders it) + that turn's reply, so training sees what inference sees.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from turnforge.data.sources import read_records
from turnforge.formats.chat_template import ChatMessage, ChatRenderer, chat_renderer, role_of, window_messages
from turnforge.types import TRAJECTORY_KEYS, Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class SFTExample:
    """One training sequence; `completion_mask[t] == 1` where token t carries loss (TRL's `completion_mask`)."""

    input_ids: list[int]
    completion_mask: list[int]


def assistant_mask(
    prompt_ids: Sequence[int],
    turns: Sequence[tuple[Sequence[int], Sequence[int]]],
    learn: Sequence[bool] | None = None,
) -> SFTExample:
    """The sequence prompt + (assistant ids + observation ids) per turn, with loss mask 1 exactly on assistant ids
    of the turns to learn (`learn[k]`, default all: a noisy expert's mistakes, `Turn.learn`, are context only).

    >>> assistant_mask([1, 2], [([3, 4], [5]), ([6], [])])
    SFTExample(input_ids=[1, 2, 3, 4, 5, 6], completion_mask=[0, 0, 1, 1, 0, 1])
    >>> assistant_mask([1, 2], [([3, 4], [5]), ([6], [])], learn=[False, True]).completion_mask
    [0, 0, 0, 0, 0, 1]
    """
    ids, mask = list(prompt_ids), [0] * len(prompt_ids)
    for k, (assistant, observation) in enumerate(turns):
        ids += [*assistant, *observation]
        mask += [int(learn is None or learn[k])] * len(assistant) + [0] * len(observation)
    return SFTExample(input_ids=ids, completion_mask=mask)


def trajectory_examples(
    traj: Trajectory, tokenizer: PreTrainedTokenizerBase, window: int | None = None
) -> list[SFTExample]:
    """The SFT examples of one trajectory: one sequence, or one per assistant turn with a `window`.

    Token-exact ids are used when the trajectory has them (a rollout with a windowed renderer recorded its
    per-turn prompts and always gives one example per turn); otherwise the messages are rendered. Either way
    the replies are the policy's (`Trajectory.reply_indices()`): an env's own assistant turns in its first
    messages (DBBench's few-shot "Ok.") are prompt. A reply with `learn=False` (a noisy expert's mistake) is
    context: in the sequence, without loss, and no example of its own with a window.
    """
    learned = [turn.learn for turn in traj.turns]
    replies = [i for i, learn in zip(traj.reply_indices(), learned, strict=True) if learn]
    if not traj.prompt_ids:
        return conversation_examples(traj.messages, traj.tools, tokenizer, window, replies=replies)
    if any(turn.prompt_ids for turn in traj.turns):  # rolled out with a window: each turn has its own prompt
        return [assistant_mask(turn.prompt_ids, [(turn.generated_ids, [])]) for turn in traj.turns if turn.learn]
    if window is not None:
        renderer = chat_renderer(tokenizer, window)
        prompts = _windowed_prompts(traj.messages, traj.tools, renderer, traj.reply_indices())
        return [
            assistant_mask(p, [(turn.generated_ids, [])])
            for p, turn in zip(prompts, traj.turns, strict=True)
            if turn.learn
        ]
    pieces = episode_pieces(traj)
    return [assistant_mask(traj.prompt_ids, pieces, learned)] if any(learned) else []


def episode_pieces(traj: Trajectory) -> list[tuple[list[int], list[int]]]:
    """(generated ids, observation ids) per turn of a token-exact episode, for `assistant_mask`.

    The observation after the last reply is left out: nothing after the last reply carries loss, and the model
    never saw it (GRPO: TRL would read "last token is not EOS" as a truncated completion).

    >>> from turnforge.types import Score, StopReason, Turn
    >>> turns = [Turn("a", generated_ids=[3, 4], observation_ids=[5]), Turn("b", generated_ids=[6], observation_ids=[7])]
    >>> episode_pieces(Trajectory("t", "e", "c", [], turns, Score(True, 1.0, 1.0), StopReason.success))
    [([3, 4], [5]), ([6], [])]
    """
    if any(turn.prompt_ids for turn in traj.turns):
        raise ValueError(
            f"trajectory {traj.task_id!r} sample {traj.sample} was played with a history window: it has no single "
            "token sequence, only one (prompt, reply) pair per turn"
        )
    pieces = [(list(turn.generated_ids), list(turn.observation_ids)) for turn in traj.turns]
    if pieces:
        pieces[-1] = (pieces[-1][0], [])
    return pieces


def conversation_examples(
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None,
    tokenizer: PreTrainedTokenizerBase,
    window: int | None = None,
    replies: Sequence[int] | None = None,
) -> list[SFTExample]:
    """The SFT examples of a conversation (Message objects or OpenAI/HF chat dicts), rendered with the chat template.

    `replies` are the positions of the assistant messages that carry loss (a trajectory's `reply_indices()`);
    None = every assistant message (a conversational record cannot tell an env's own turns apart). Each reply
    becomes the ids a model would generate for it (the template's rendering of its content and tool calls, then
    the end token the template writes before what follows it: GLM's `<|observation|>` before a tool result, `<|user|>`
    before a user message); the rest is prompt and observation deltas. Messages after the last reply are left
    out. No reply: no example.
    """
    starts = list(replies) if replies is not None else [i for i, m in enumerate(messages) if role_of(m) == "assistant"]
    if not starts:
        return []
    if starts[0] == 0:
        raise ValueError("a conversation must start with a system or user message before the first assistant reply")
    renderer = chat_renderer(tokenizer, window, memo=True)  # one conversation, turn by turn: renders repeat
    following = [messages[i + 1 : end] for i, end in zip(starts, [*starts[1:], len(messages)], strict=True)]
    if window is not None:
        prompts = _windowed_prompts(messages, tools, renderer, starts)
        return [
            assistant_mask(prompt, [(renderer.completion_ids(messages[: i + 1], tools, following=after), [])])
            for prompt, i, after in zip(prompts, starts, following, strict=True)
        ]
    pieces = []
    for n, i in enumerate(starts):
        completion = renderer.completion_ids(messages[: i + 1], tools, following=following[n])
        last = n + 1 == len(starts)
        observation = [] if last else renderer.observation_ids(messages[: i + 1], following[n], tools, completion, "stop")
        pieces.append((completion, observation))
    return [assistant_mask(renderer.prompt_ids(messages[: starts[0]], tools), pieces)]


def _windowed_prompts(
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None,
    renderer: ChatRenderer,
    replies: Sequence[int],
) -> list[list[int]]:
    """The windowed prompt before each reply (positions `replies`), as a rollout with `renderer.window` renders it."""
    return [renderer.prompt_ids(window_messages(messages[:i], renderer.window), tools) for i in replies]


@dataclass
class DataCounts:
    """What happened to the input on its way to the trainer (logged, and returned by `run_sft`)."""

    records: int = 0
    """Trajectory lines / conversational records read."""
    skipped_no_assistant: int = 0
    """Records with no assistant token to learn from."""
    truncated: int = 0
    """Examples cut to `max_length` that kept at least one assistant token."""
    skipped_too_long: int = 0
    """Examples whose assistant tokens all lay past `max_length`."""
    tokens: int = 0
    """Tokens in the examples kept (each example counted once)."""
    by_source: dict[str, int] = field(default_factory=dict)
    """Examples taken from each data source."""


def record_examples(
    where: str, record: dict[str, Any], tokenizer: PreTrainedTokenizerBase, window: int | None
) -> list[SFTExample]:
    """The examples of one record: a Trajectory JSON line or a conversational record (`messages`, `tools`).

    No assistant turn: no example. A record that cannot be read is an error naming `where`.
    """
    try:
        if record.keys() >= TRAJECTORY_KEYS:
            return trajectory_examples(Trajectory.from_dict(record), tokenizer, window=window)
        if "messages" in record:
            messages = [_drop_nulls(m) for m in record["messages"] or []]
            tools = record.get("tools")
            if isinstance(tools, str):  # datasets on the Hub often store the tool schemas as one JSON string
                tools = json.loads(tools) if tools.strip() else None
            return conversation_examples(messages, tools or None, tokenizer, window=window)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: cannot read this record ({type(e).__name__}: {e})") from e
    raise ValueError(
        f"{where}: neither a trajectory (keys {sorted(TRAJECTORY_KEYS)}) nor a conversational record "
        f"('messages'); its keys are {sorted(record)}"
    )


def _drop_nulls(message: dict[str, Any]) -> dict[str, Any]:
    # Arrow gives every message every key of the column (None where absent); chat templates test presence.
    return {k: v for k, v in message.items() if v is not None}


def fit_to_length(example: SFTExample, max_length: int) -> SFTExample | None:
    """Cut `example` to its first `max_length` tokens (TRL's `keep_start`); None when no assistant token is left."""
    if len(example.input_ids) <= max_length:
        return example
    cut = SFTExample(
        input_ids=example.input_ids[:max_length], completion_mask=example.completion_mask[:max_length]
    )
    return cut if any(cut.completion_mask) else None


def in_episode_order(records: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Trajectory records sorted by (task_id, sample); other records as they come.

    A rollout file lists episodes in the order they finished, which depends on timing: sorted, a rerun of the
    same recipe trains on the same sequence of examples (measured: two quickstart SFT runs on the same 4,000
    episodes in two finish orders reached 34 % and 8 % test success)."""
    records = list(records)
    if records and all("task_id" in r and "turns" in r for _, r in records):
        records.sort(key=lambda item: (str(item[1]["task_id"]), int(item[1].get("sample", 0))))
    return records


def source_examples(
    data: list[str], tokenizer: PreTrainedTokenizerBase, window: int | None, counts: DataCounts
) -> Iterator[tuple[str, SFTExample]]:
    """Yield `(source, example)` for every example with an assistant token; count records and skips in `counts`."""
    for source in data:
        counts.by_source.setdefault(source, 0)
        for where, record in in_episode_order(read_records(source, "sft data")):
            counts.records += 1
            examples = [
                e for e in record_examples(where, record, tokenizer, window) if any(e.completion_mask)
            ]
            counts.skipped_no_assistant += not examples
            yield from ((source, example) for example in examples)
