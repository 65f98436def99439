"""One episode's state and what a turn does to it: the part of the rollout that does not schedule.

`Episode` is an open episode's state; `step_episode` applies one generation (parse with the env's format, step
the env, record the `Turn`, extend the token-exact ids, decide whether the episode stops); `to_trajectory` scores
it and writes the `Trajectory`. The rollout engine (rollout.py) decides when each of these runs; a copy of the
previous lock-step loop in benchmarks/rollout_engine.py runs the same functions.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field

from turnforge.envs.base import Env
from turnforge.formats.base import FormatError
from turnforge.formats.chat_template import ChatRenderer, window_messages
from turnforge.formats.families import visible_reply
from turnforge.policies.base import CONTEXT_LENGTH, Generation
from turnforge.types import Message, Score, StepResult, StopReason, Task, Trajectory, Turn


@dataclass
class RolloutLimits:
    """When episodes are cut short, how many run at once, where env calls run. The defaults suit a laptop."""

    max_turns: int | None = None
    """Assistant turns per episode -> StopReason.max_turns; None leaves it to the env's own step limit."""
    max_format_errors: int | None = 5
    """CONSECUTIVE unparsable replies -> StopReason.format_error_limit; None = no limit. Consecutive, not
    total: a model that recovers from a slip goes on, one stuck repeating bad output is cut off."""
    max_open: int = 64
    """Episodes alive at once = the largest batch of a `generate` call."""
    env_workers: int | None = None
    """Where env calls run. None: the calls of envs that may wait (`env.blocks`: SQL servers, sandboxes, slow
    steps; or envs with model roles) in a pool of one thread per open episode, the others inline on the event
    loop (microsecond envs: no thread hop, and batches that never depend on thread timing). 0: all inline
    (envs with model roles cannot run so). N: all in a pool of N threads."""
    max_total_tokens: int | None = None
    """Cap on an episode's tokens -> StopReason.max_tokens: its whole id sequence (prompt + generated +
    observations) when token-exact (with a history window: the next windowed prompt), else its generated
    tokens; None = no cap."""
    batch_wait_s: float = 0.05
    """How long a pending model request waits for more episodes to join its batch when some episode is busy
    elsewhere (an env step, another role); when every live episode waits on a model, batches go at once."""

    def __post_init__(self) -> None:
        at_least_one = {"max_turns": self.max_turns, "max_format_errors": self.max_format_errors}
        at_least_one |= {"max_open": self.max_open, "max_total_tokens": self.max_total_tokens}
        for name, value in at_least_one.items():
            if value is not None and value < 1:
                raise ValueError(f"rollout limit {name} must be at least 1, got {value}")
        if self.env_workers is not None and self.env_workers < 0:
            raise ValueError(f"rollout limit env_workers must be >= 0 (0 = inline), got {self.env_workers}")
        if self.batch_wait_s < 0:
            raise ValueError(f"rollout limit batch_wait_s must be >= 0, got {self.batch_wait_s}")


@dataclass
class Episode:
    """One episode's state; touched only by its own coroutine (and the env thread it is waiting on)."""

    task: Task
    sample: int
    order: int  # index in the run's task x sample order: sorts each batch, so batches do not depend on timing
    env: Env | None = None
    messages: list[Message] = field(default_factory=list)
    tools: list[dict] | None = None
    turns: list[Turn] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    format_errors_in_a_row: int = 0
    env_steps: int = 0
    tokens_generated: int = 0
    started: float = 0.0  # when the episode opened (not when it was queued)
    generate_s: float = 0.0
    env_s: float = 0.0
    closed: bool = False
    stop: StopReason | None = None  # None when closed = the env ended it; success/failure comes from score()
    error: str | None = None  # traceback of an env failure


def step_episode(ep: Episode, gen: Generation, limits: RolloutLimits, renderer: ChatRenderer | None) -> None:
    """Apply one generation to its episode; closes the episode when it stops."""
    ep.tokens_generated += len(gen.ids)
    if gen.finish_reason == "exhausted":  # the policy has nothing left to say (e.g. replay ran out)
        ep.closed, ep.stop = True, StopReason.gave_up
        return
    if gen.finish_reason == CONTEXT_LENGTH:  # the backend refused the prompt: no room left in the model's context
        ep.closed, ep.stop = True, StopReason.max_tokens
        return
    t0 = time.perf_counter()
    try:
        parsed = ep.env.format.parse(visible_reply(renderer.family if renderer is not None else None, gen.text))
        result = ep.env.step(parsed)
    except Exception:
        fail_episode(ep)
        return
    finally:
        ep.env_s += time.perf_counter() - t0
    ep.env_steps += 1
    parse_error = parsed.reason if isinstance(parsed, FormatError) else None
    turn = Turn(
        text=gen.text,
        generated_ids=list(gen.ids),
        logprobs=list(gen.logprobs),
        reward=result.reward,
        progress=float(result.info.get("progress", 0.0)),
        parse_ok=parse_error is None,
        parse_error=parse_error,
        finish_reason=gen.finish_reason,
        learn=gen.learn,
    )
    ep.messages.append(Message("assistant", gen.text))
    if renderer is not None:
        _append_ids(ep, turn, result.messages, renderer, gen.finish_reason)
    ep.messages.extend(result.messages)
    ep.turns.append(turn)
    ep.format_errors_in_a_row = 0 if parse_error is None else ep.format_errors_in_a_row + 1
    tokens = len(ep.ids) if renderer is not None else ep.tokens_generated
    ep.closed, ep.stop = _stop_afterstep_episode(ep, result, tokens, limits)


def _append_ids(
    ep: Episode, turn: Turn, observation: list[Message], renderer: ChatRenderer, finish_reason: str
) -> None:
    """Extend the episode's ids after a turn (`ep.messages` ends with the raw assistant message).

    Without a window: generated ids + the observation delta, onto the one growing sequence. With one: the turn
    keeps the prompt it was generated from, and the next prompt is the windowed conversation rendered anew.
    """
    if renderer.window is None:
        turn.observation_ids = renderer.observation_ids(
            ep.messages, observation, ep.tools, turn.generated_ids, finish_reason
        )
        ep.ids += turn.generated_ids + turn.observation_ids
    else:
        turn.prompt_ids = ep.ids
        ep.ids = renderer.prompt_ids(window_messages(ep.messages + observation, renderer.window), ep.tools)


def _stop_afterstep_episode(
    ep: Episode, result: StepResult, tokens: int, limits: RolloutLimits
) -> tuple[bool, StopReason | None]:
    """(closed, reason); the env's own end comes first, then our limits."""
    if result.done:
        return True, result.stop
    if limits.max_format_errors is not None and ep.format_errors_in_a_row >= limits.max_format_errors:
        return True, StopReason.format_error_limit
    if limits.max_turns is not None and len(ep.turns) >= limits.max_turns:
        return True, StopReason.max_turns
    if limits.max_total_tokens is not None and tokens >= limits.max_total_tokens:
        return True, StopReason.max_tokens
    return False, None


def fail_episode(ep: Episode) -> None:
    ep.closed, ep.stop, ep.error = True, StopReason.env_error, traceback.format_exc()


def _final_score(ep: Episode) -> tuple[Score, StopReason]:
    if ep.error is None:
        try:
            score = ep.env.score()
            return score, ep.stop or (StopReason.success if score.success else StopReason.failure)
        except Exception:
            fail_episode(ep)
    progress = ep.turns[-1].progress if ep.turns else 0.0
    return Score(
        success=False, reward=0.0, progress=progress, details={"error": ep.error}
    ), StopReason.env_error


def to_trajectory(ep: Episode, seed: int, model: str) -> Trajectory:
    score, stop = _final_score(ep)
    return Trajectory(
        task_id=ep.task.id,
        env=ep.task.env,
        category=ep.task.category,
        split=ep.task.split,
        sample=ep.sample,
        messages=ep.messages,
        turns=ep.turns,
        score=score,
        stop_reason=stop,
        prompt_ids=ep.prompt_ids,
        tokens_generated=ep.tokens_generated,
        env_steps=ep.env_steps,
        timings={"wall_s": time.perf_counter() - ep.started, "generate_s": ep.generate_s, "env_s": ep.env_s},
        seed=seed,
        model=model,
        tools=ep.tools,
    )
