"""BfclEnv: BFCL V3 multi-turn entries as a turnforge Env, scored like bfcl-eval's `multi_turn_checker`.

Turn protocol (BFCL's `base_handler.inference_multi_turn_*`): the env shows user turn t; each assistant
reply with calls is one step — its calls run on the episode's own instances of the real classes and the
results come back as `tool` messages; a reply without calls (or `[]`) ends the user turn, which is then
scored, and turn t+1 is shown. A turn may have up to `max_steps_per_turn` (20) steps: the 21st step with
calls force-quits the entry, as BFCL's `count > MAXIMUM_STEP_LIMIT` does. miss_func turns remove the held-out
function docs and add them back, at their turn, with BFCL's message ("I have updated some more functions
you can choose from. What about now?", preceded by the added docs as BFCL's prompting mode does — also in
tool_call format, because the tool list of a token-exact episode is fixed at reset). miss_param turns have
ground truth `[]`: the model should ask for the missing value; the next user turn gives it.

A reply that cannot be parsed ends the user turn (BFCL ends a turn on a decode failure); with
`hints=True` it gets the format's error message instead and the turn goes on (counted as a step).

Score: success = BFCL's verdict for the entry; progress = correct turns / total turns (the Environment
Tuning progress reward); details carry the first failing turn and BFCL's error type.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.bfcl import checking
from turnforge.envs.bfcl.execution import (
    CallOutcome,
    build_instances,
    execute,
    method_table,
    parse_call_string,
)
from turnforge.envs.bfcl.hints import hint_for
from turnforge.envs.bfcl.tools import docs_by_class, entry_docs, tool_schema
from turnforge.formats import get_format
from turnforge.formats.base import Format, FormatError
from turnforge.formats.bfcl_python import call_string
from turnforge.formats.families import accepts_format
from turnforge.formats.plain_text import PlainTextEndsTurn
from turnforge.types import Message, Score, StepResult, StopReason, Task

FORMATS = ("tool_call", "bfcl_python")
ADDED_FUNCTIONS_MESSAGE = "I have updated some more functions you can choose from. What about now?"
# The behaviour part of BFCL's prompting system prompt; given to function-calling models too, so that they
# know a reply without calls ends the turn (BFCL's FC models get no system prompt at all).
FC_SYSTEM_TEXT = (
    "At each turn, you should try your best to complete the tasks requested by the user within the current "
    "turn. Continue to output functions to call until you have fulfilled the user's request to the best of "
    "your ability. Once you have no more functions to call, the system will consider the current turn "
    "complete and proceed to the next turn or task."
)


def _env_format(name: str) -> Format:
    if not accepts_format(name, FORMATS):
        raise ValueError(f"the bfcl env speaks {' or '.join(FORMATS)}, not {name!r}")
    fmt = get_format(name)
    # A reply without calls ends the user turn in BFCL: a plain answer, not a format error.
    return PlainTextEndsTurn(fmt) if fmt.uses_tools else fmt


class BfclEnv:
    """One BFCL entry per episode. `make_env("bfcl", format="bfcl_python", hints=True)`."""

    name = "bfcl"

    finished = True  # until reset
    docs: list[dict] | None = None  # the entry's function docs: BFCL's tools are per entry, known at reset

    def __init__(
        self,
        *,
        format: str,
        hints: bool,
        max_steps_per_turn: int,
        version: str,
        call_timeout: float,
        **_task_options: Any,
    ):
        # No defaults here: the family's EnvOptions hold them, and `make_env` passes every option resolved.
        self.format = _env_format(format)
        self.hints = hints
        self.max_steps_per_turn = max_steps_per_turn
        self.version = version
        self.call_timeout = call_timeout

    # ---- Env protocol --------------------------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        entry = task.data
        self.task, self.entry, self.ground_truth = task, entry, entry["ground_truth"]
        self.model_instances = build_instances(entry)
        self.model_methods = method_table(self.model_instances)
        self.gt_instances = build_instances(entry)
        self.gt_methods = method_table(self.gt_instances)
        self.docs, self.held_out = entry_docs(entry, self.version)
        self.all_docs = docs_by_class(entry, self.version)
        self.turn = 0
        self.turn_steps: list[list[list[str]]] = [[]]  # per turn, per step, BFCL call strings
        self.model_results: list[str] = []  # every model call's result, all turns (the checker's list)
        self.verdicts: list[checking.TurnVerdict] = []
        self.steps = self.steps_in_turn = self.format_errors = self.failed_calls = 0
        self.force_quit = self.finished = self.timed_out = False
        return [Message("system", self._system_text()), *self._user_messages(0)]

    def close(self) -> None:
        """Nothing to release: an episode's instances are plain Python objects."""

    def tools(self) -> list[dict] | None:
        if not self.format.uses_tools:
            return None  # bfcl_python lists the docs in the system prompt, as BFCL's prompting mode does
        if self.docs is None:
            raise RuntimeError("bfcl's tools are those of each entry: call reset(task) before tools()")
        return [tool_schema(d) for d in self.docs]

    def step(self, reply: Message | FormatError) -> StepResult:
        if self.finished:
            raise RuntimeError(f"episode of {self.task.id} is over (done was returned); call reset(task)")
        self.steps += 1
        if isinstance(reply, FormatError):
            self.format_errors += 1
            if not self.hints:
                return self._end_turn()
            text = self.format.error_observation(reply)
            return self._after_step([Message("user", text)], {"hint": text})
        if not reply.tool_calls:
            return self._end_turn()
        outcomes = [execute(call, self.model_methods, self.call_timeout) for call in reply.tool_calls]
        self.turn_steps[self.turn].append([call_string(o.call) for o in outcomes])
        self.model_results += [o.result for o in outcomes]
        hints = [self._hint(o) for o in outcomes]
        self.failed_calls += sum(o.error is not None for o in outcomes)
        observation = [self._tool_message(o, h) for o, h in zip(outcomes, hints, strict=True)]
        info = {"hint": "\n".join(h for h in hints if h)} if any(hints) else {}
        if any(o.timed_out for o in outcomes):  # a runaway computation ends the episode, never the run
            self.finished = self.timed_out = True
            return StepResult(observation, 0.0, True, StopReason.timeout, {"progress": self.progress, **info})
        return self._after_step(observation, info)

    def score(self) -> Score:
        first_failure = next((i for i, v in enumerate(self.verdicts) if not v.valid), None)
        finished = len(self.verdicts) == len(self.ground_truth)
        if not finished:  # BFCL's runner rejects a short result before checking any turn
            error_type, message = checking.FORCE_TERMINATED, f"{len(self.verdicts)} of {len(self.ground_truth)} turns done"
        elif first_failure is not None:
            error_type, message = self.verdicts[first_failure].error_type, self.verdicts[first_failure].error_message
        else:
            error_type = message = None
        success = finished and first_failure is None
        return Score(
            success=success,
            reward=float(success),
            progress=self.progress,
            details={
                "turns": len(self.ground_truth),
                "turns_done": len(self.verdicts),
                "turns_correct": sum(v.valid for v in self.verdicts),
                "error_type": error_type,
                "error_message": message,
                "failed_turn": first_failure,
                "steps": self.steps,
                "failed_calls": self.failed_calls,
                "tool_errors": self.failed_calls,  # the summary's count of refused actions
                "format_errors": self.format_errors,
                "force_quit": self.force_quit,
                "timed_out": self.timed_out,
                "model_calls": self.turn_steps,
            },
        )

    @property
    def progress(self) -> float:
        """Correct turns so far / all turns of the entry (Environment Tuning's progress reward)."""
        return sum(v.valid for v in self.verdicts) / len(self.ground_truth)

    # ---- expert --------------------------------------------------------------------------------------

    def expert_reply(self) -> Message:
        """The ground truth: turn t's calls in one step, then a reply without calls to end the turn."""
        calls = self.ground_truth[self.turn]
        if calls and not self.turn_steps[self.turn]:
            return Message("assistant", "", tool_calls=[parse_call_string(c, self.model_methods) for c in calls])
        if not calls:
            return Message("assistant", "I cannot do that yet: a needed function or value is missing.")
        return Message("assistant", "Done.")

    # ---- internals -----------------------------------------------------------------------------------

    def _system_text(self) -> str:
        if self.format.uses_tools:
            return FC_SYSTEM_TEXT  # tool schemas reach the model through tools() and the chat template
        return self.format.system_prompt(self.docs)

    def _user_messages(self, turn: int) -> list[Message]:
        """Turn `turn`'s user messages; at a miss_func holdout turn, the docs come back first."""
        if turn in self.held_out:
            added = self.held_out[turn]
            self.docs = self.docs + added
            return [Message("user", f"{added}\n{ADDED_FUNCTIONS_MESSAGE}")]
        return [Message(m.get("role", "user"), m.get("content", "")) for m in self.entry["question"][turn]]

    def _hint(self, outcome: CallOutcome) -> str | None:
        if outcome.error is None:
            return None
        visible = {d["name"]: d for d in self.docs}
        return hint_for(outcome, visible, self.all_docs, self.model_instances)

    def _tool_message(self, outcome: CallOutcome, hint: str | None) -> Message:
        content = outcome.result if not (self.hints and hint) else f"{outcome.result}\nHint: {hint}"
        return self.format.observation(content, outcome.call)  # bfcl_python: named by the call string, as BFCL

    def _after_step(self, observation: list[Message], info: dict[str, Any]) -> StepResult:
        """A step that stays in the turn, unless it was one too many (BFCL's force quit)."""
        self.steps_in_turn += 1
        if self.steps_in_turn > self.max_steps_per_turn:
            self.force_quit = True
            return self._end_turn(observation)
        return StepResult(observation, 0.0, False, None, {"progress": self.progress, "turn": self.turn, **info})

    def _end_turn(self, observation: list[Message] | None = None) -> StepResult:
        """Score the finished turn (the checker's rules), then show the next turn or end the episode."""
        t = self.turn
        gt_outcomes = [execute(parse_call_string(c, self.gt_methods), self.gt_methods) for c in self.ground_truth[t]]
        self.verdicts.append(
            checking.check_turn(
                t,
                self.ground_truth[t],
                self.turn_steps[t],
                self.model_instances,
                self.gt_instances,
                self.model_results,
                [o.result for o in gt_outcomes],
            )
        )
        self.turn += 1
        info = {"progress": self.progress, "turn": t, "turn_valid": self.verdicts[-1].valid}
        if self.turn == len(self.ground_truth) or self.force_quit:
            self.finished = True
            success = self.score().success
            stop = StopReason.success if success else StopReason.failure
            return StepResult(observation or [], float(success), True, stop, info)
        self.turn_steps.append([])
        self.steps_in_turn = 0
        return StepResult((observation or []) + self._user_messages(self.turn), 0.0, False, None, info)
