"""SFT examples: token ids + the completion mask, from trajectories or conversational records.

Which tokens carry loss is one function, `assistant_mask`: 1 exactly on what the assistant generated (its
reply and the end-of-turn token that closes it), 0 on the prompt and on every observation.

- A token-exact trajectory (a model's rollout: `prompt_ids`, and per turn `generated_ids` +
  `observation_ids`) is used as recorded: the ids the model saw and sampled, never re-tokenized.
- A trajectory without ids (a scripted expert's) or a conversational record is rendered with the
  tokenizer's chat template by the same `ChatTemplateRenderer` the rollouts use, so an example's ids are
  the ones a rollout of the same conversation would have produced (prompt header tokens apart from the
  reply's tokens, exactly as at inference).
- With a history `window`, one example per assistant turn: the windowed prompt (as the rollout with that
  window renders it) + that turn's reply, so training sees what inference sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turnforge.models.chat import ChatMessage, ChatTemplateRenderer, role_of, window_messages
from turnforge.types import Trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class SFTExample:
    """One training sequence; `completion_mask[t] == 1` where token t carries loss (TRL's `completion_mask`)."""

    input_ids: list[int]
    completion_mask: list[int]


def assistant_mask(prompt_ids: Sequence[int], turns: Sequence[tuple[Sequence[int], Sequence[int]]]) -> SFTExample:
    """The sequence prompt + (assistant ids + observation ids) per turn, with loss mask 1 exactly on assistant ids.

    >>> assistant_mask([1, 2], [([3, 4], [5]), ([6], [])])
    SFTExample(input_ids=[1, 2, 3, 4, 5, 6], completion_mask=[0, 0, 1, 1, 0, 1])
    """
    ids, mask = list(prompt_ids), [0] * len(prompt_ids)
    for assistant, observation in turns:
        ids += [*assistant, *observation]
        mask += [1] * len(assistant) + [0] * len(observation)
    return SFTExample(input_ids=ids, completion_mask=mask)


def trajectory_examples(
    traj: Trajectory, tokenizer: PreTrainedTokenizerBase, window: int | None = None
) -> list[SFTExample]:
    """The SFT examples of one trajectory: one sequence, or one per assistant turn with a `window`.

    Token-exact ids are used when the trajectory has them (a rollout with a windowed renderer recorded its
    per-turn prompts and always gives one example per turn); otherwise the messages are rendered. Either way
    the replies are the policy's (`Trajectory.reply_indices()`): an env's own assistant turns in its first
    messages (DBBench's few-shot "Ok.") are prompt.
    """
    if not traj.prompt_ids:
        return conversation_examples(traj.messages, traj.tools, tokenizer, window, replies=traj.reply_indices())
    if any(turn.prompt_ids for turn in traj.turns):  # rolled out with a window: each turn has its own prompt
        return [assistant_mask(turn.prompt_ids, [(turn.generated_ids, [])]) for turn in traj.turns]
    if window is not None:
        renderer = ChatTemplateRenderer(tokenizer, window)
        prompts = _windowed_prompts(traj.messages, traj.tools, renderer, traj.reply_indices())
        return [assistant_mask(p, [(turn.generated_ids, [])]) for p, turn in zip(prompts, traj.turns, strict=True)]
    pieces = episode_pieces(traj)
    return [assistant_mask(traj.prompt_ids, pieces)] if pieces else []


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
    the end-of-turn token); the rest is prompt and observation deltas. Messages after the last reply are left
    out. No reply: no example.
    """
    starts = list(replies) if replies is not None else [i for i, m in enumerate(messages) if role_of(m) == "assistant"]
    if not starts:
        return []
    if starts[0] == 0:
        raise ValueError("a conversation must start with a system or user message before the first assistant reply")
    renderer = ChatTemplateRenderer(tokenizer, window)
    if window is not None:
        prompts = _windowed_prompts(messages, tools, renderer, starts)
        return [
            assistant_mask(prompt, [(renderer.completion_ids(messages[: i + 1], tools), [])])
            for prompt, i in zip(prompts, starts, strict=True)
        ]
    pieces = []
    for n, i in enumerate(starts):
        completion = renderer.completion_ids(messages[: i + 1], tools)
        last = n + 1 == len(starts)
        observation = [] if last else renderer.observation_ids(
            messages[: i + 1], messages[i + 1 : starts[n + 1]], tools, completion, "stop"
        )
        pieces.append((completion, observation))
    return [assistant_mask(renderer.prompt_ids(messages[: starts[0]], tools), pieces)]


def _windowed_prompts(
    messages: Sequence[ChatMessage],
    tools: list[dict[str, Any]] | None,
    renderer: ChatTemplateRenderer,
    replies: Sequence[int],
) -> list[list[int]]:
    """The windowed prompt before each reply (positions `replies`), as a rollout with `renderer.window` renders it."""
    return [renderer.prompt_ids(window_messages(messages[:i], renderer.window), tools) for i in replies]
