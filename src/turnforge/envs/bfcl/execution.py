"""Executing BFCL function calls on bfcl-eval's real classes, one private set of instances per episode.

Semantics follow `bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils.execute_multi_turn_func_call`:
each involved class is built with `cls()` and, unless stateless, `_load_scenario(deepcopy(config),
long_context=...)`; a call runs the public method of that name (the last involved class wins on a name
clash, as BFCL's name mapping does); the result becomes a string (str as is, dict -> `json.dumps`, falling
back to `str`, anything else -> `str`) and an exception becomes `"Error during execution: <message>"`.

We do not call BFCL's executor itself: it evals call strings and caches instances in its module's
`globals()` under the model name and entry id, so two episodes of one entry in one process would share
state (benchmarks.md §1, "globals-caching gotcha"); here each episode owns its instances.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnforge.envs.isolation import CPU_S, call_isolated
from turnforge.types import ToolCall

_MODULE_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
CLASS_MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES = ("MathAPI",)
# BFCL refuses these names before eval (multi_turn_utils); no class method has them, we keep the rule.
REFUSED_NAMES = ("kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run")


@dataclass
class CallOutcome:
    """One executed call: BFCL's result string, and the error text when the call failed."""

    call: ToolCall
    result: str
    error: str | None = None  # the Python exception message, or the class's {"error": ...} text
    raised: bool = False  # True when the method raised (or the call could not be made at all)
    timed_out: bool = False  # an isolated call ran past its limit: the env ends the episode


def is_long_context(entry_id: str) -> bool:
    """BFCL pads the state for long-context (and composite) entries."""
    category = entry_id.rsplit("_", 1)[0]
    return "long_context" in category or "composite" in category


def build_instances(entry: dict[str, Any]) -> dict[str, Any]:
    """Fresh instances of the entry's involved classes, loaded with its initial config."""
    instances = {}
    for class_name in entry["involved_classes"]:
        if class_name not in CLASS_MODULES:
            raise ValueError(f"{entry['id']}: unknown involved class {class_name!r}")
        cls = getattr(importlib.import_module(_MODULE_PREFIX + CLASS_MODULES[class_name]), class_name)
        instance = cls()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
            instance._load_scenario(config, long_context=is_long_context(entry["id"]))
            # Long-context scenarios link module-level dicts (e.g. travel_booking's CREDIT_CARD_EXTENSION)
            # into the state; a deep copy detaches them so that no two episodes share an object.
            instance = copy.deepcopy(instance)
        instances[class_name] = instance
    return instances


def method_table(instances: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """Public method name -> bound method, over all instances (later classes win, as in BFCL)."""
    table: dict[str, Callable[..., Any]] = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                table[name] = method
    return table


def result_string(value: Any) -> str:
    """BFCL's conversion of a return value to the string the checker compares."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):  # BFCL: "Some function returns a object instance"
            return str(value)
    return str(value)


def execute(call: ToolCall, methods: dict[str, Callable[..., Any]], timeout_s: float = CPU_S) -> CallOutcome:
    """Run one call; BFCL turns every exception of the call into an error string. Calls of stateless classes
    run isolated (`turnforge.envs.isolation`) with `timeout_s` seconds of CPU time: past it the call is the
    model's runaway (`power(10, 10**12)`), the same on an idle or a loaded machine, and comes back `timed_out`.
    A checker child that gave no answer (hung or starved past its wall clock, crashed) is no outcome at all:
    CheckerUnavailable propagates, and the episode ends as an env error."""
    method = methods.get(call.name)
    if method is None or call.name in REFUSED_NAMES:
        # What BFCL's eval answers for a name that is no method of an involved class.
        message = f"name '{call.name}' is not defined"
        return CallOutcome(call, f"Error during execution: {message}", message, raised=True)
    owner = type(method.__self__)
    if owner.__name__ in STATELESS_CLASSES:  # model-controlled arithmetic: time- and memory-bounded elsewhere
        done = call_isolated(owner.__module__, owner.__name__, call.name, call.arguments, cpu_s=timeout_s)
        if done.over_budget == "cpu":
            message = f"the call ran past its {timeout_s:g} s limit of CPU time"
            return CallOutcome(call, f"Error during execution: {message}", message, raised=True, timed_out=True)
        error = "the call ran out of memory" if done.over_budget == "memory" else done.error
        if error is not None:
            return CallOutcome(call, f"Error during execution: {error}", error, raised=True)
        value = done.value
    else:
        try:
            # Fresh argument objects, as BFCL's eval of a call string makes: classes keep them in their state
            # (post_tweet stores `mentions`, mention() extends it), which must not reach back into the reply.
            value = method(**copy.deepcopy(call.arguments))
        except Exception as e:
            return CallOutcome(call, f"Error during execution: {e}", str(e), raised=True)
    result = result_string(value)
    error = value.get("error") if type(value) is dict else None
    return CallOutcome(call, result, str(error) if error is not None else None)


def parse_call_string(text: str, methods: dict[str, Callable[..., Any]] | None = None) -> ToolCall:
    """A ground-truth call string (`sort('a.txt')`, `cd(folder='x')`) -> ToolCall with keyword arguments.

    Positional arguments (160 of the 4,700 V3 ground-truth calls use them) are bound to parameter names
    through the method's signature, so a ground-truth call can be replayed as a tool call.
    Raises ValueError on anything that is not one call with literal arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a function call: {text!r} ({e.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call of a plain function name: {text!r}")
    name = node.func.id
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError:
        raise ValueError(f"call {text!r} has a non-literal argument") from None
    if args:
        if methods is None or name not in methods:
            raise ValueError(f"cannot name the positional arguments of {text!r} without its method")
        bound = inspect.signature(methods[name]).bind_partial(*args, **kwargs)
        kwargs = dict(bound.arguments)
    return ToolCall(name=name, arguments=kwargs)
