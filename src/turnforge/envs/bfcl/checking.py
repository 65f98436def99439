"""The per-turn verdict of `bfcl_eval`'s `multi_turn_checker`, computed as the episode goes.

`multi_turn_checker` re-executes a finished result from scratch; an env needs the verdict turn by turn
(for progress and curricula), so this module applies the checker's rules at each turn's end, in its
order, with the checker's own sub-checkers (`state_checker`, `response_checker`) from the package:

1. ground truth `[]` (miss_func / miss_param turn): no check; the model's calls still changed its state;
2. no model step in the turn: `multi_turn:empty_turn_model_response`;
3. state of every involved class equals the ground-truth instances' (`multi_turn:instance_state_mismatch`);
4. this turn's ground-truth results ⊆ (as a multiset) the model's results over ALL turns so far
   (`multi_turn:execution_response_mismatch`).

An entry is valid when every turn is; a result with fewer turns than the ground truth (BFCL's force quit
after too many steps) is `multi_turn:force_terminated`. tests/test_bfcl_checker_agreement.py checks that
the verdict equals the real `multi_turn_checker`'s on hundreds of model-like results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class TurnVerdict:
    """The outcome of one turn: `checked` is False for ground-truth-empty turns (they always pass)."""

    valid: bool
    checked: bool
    error_type: str | None = None
    error_message: str | None = None


def check_turn(
    turn_index: int,
    ground_truth_calls: list[str],
    model_steps: list[list[str]],
    model_instances: dict[str, Any],
    ground_truth_instances: dict[str, Any],
    model_results_so_far: list[str],
    ground_truth_results: list[str],
) -> TurnVerdict:
    """Apply the checker's rules to one finished turn (both sides already executed)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker

    if not ground_truth_calls:
        return TurnVerdict(valid=True, checked=False)
    if not model_steps:
        return TurnVerdict(
            False, True, "multi_turn:empty_turn_model_response", f"Model response list is empty for turn {turn_index}"
        )
    for check in (
        lambda: state_checker(model_instances, ground_truth_instances),
        lambda: response_checker(model_results_so_far, ground_truth_results, turn_index),
    ):
        result = check()
        if not result["valid"]:
            return TurnVerdict(False, True, result["error_type"], result["error_message"])
    return TurnVerdict(valid=True, checked=True)


FORCE_TERMINATED = "multi_turn:force_terminated"
