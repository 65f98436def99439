"""HouseholdEnv: the Env protocol over the native ALFWorld-compatible engine.

Observations are ALFWorld's strings (the intro without TextWorld's welcome banner, as ReAct and
AgentBench show it). Options: `grammar` (0.3: "put X in/on Y", "You arrive at loc N."; 0.4: "move X
to Y", "You arrive at {recep}."), `hints` (replace "Nothing happens." by an actionable correction),
`admissible` (append the admissible commands to each observation), `format`, `max_steps` (50, as
ALFWorld evaluations use).

Each step's `info["defects"]` lists what was wrong with the reply, for DPO pair mining
(docs/decisions.md, "per-step defects"): "invalid_action" (the game answered "Nothing happens.") and
"implausible_location" (went to / opened / examined, empty-handed, a receptacle whose type never holds
the goal object, nor is the goal receptacle, the transform appliance or a place the lamp stands).
"""

from __future__ import annotations

import time

from turnforge.envs.household.catalog import TRANSFORM_APPLIANCE, TRANSFORM_STATE, is_plausible
from turnforge.envs.household.engine import NOTHING, Check, World
from turnforge.envs.household.expert import expert_plan
from turnforge.envs.household.explorer import Explorer, goal_thought
from turnforge.formats import get_format
from turnforge.formats.base import Format, FormatError
from turnforge.types import Message, Score, StepResult, StopReason, Task, ToolCall

THOUGHTS = ("none", "goal", "search")
"""What the expert may write as its THOUGHT (the `thoughts` option)."""

# The household action as a tool, for the tool_call format.
ACTION_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Perform one household command, e.g. 'go to fridge 1' or 'take apple 1 from countertop 2'.",
        "parameters": {
            "type": "object",
            "properties": {"action": {"type": "string", "description": "the command to perform"}},
            "required": ["action"],
        },
    },
}

_INSTRUCTIONS = {
    "0.3": "put {obj} in/on {recep}",
    "0.4": "move {obj} to {recep}",
}


def system_text(grammar: str) -> str:
    return (
        "You are an agent in a household. You receive the task and what you observe, and you act one "
        "command per turn to complete the task.\n"
        "Commands: go to {recep}; open {recep}; close {recep}; take {obj} from {recep}; "
        f"{_INSTRUCTIONS[grammar]}; heat {{obj}} with {{recep}}; cool {{obj}} with {{recep}}; "
        "clean {obj} with {recep}; use {obj}; examine {obj or recep}; inventory; look.\n"
        "Write objects and receptacles exactly as observed, with their numbers (e.g. apple 1). "
        'A command that cannot be done answers "Nothing happens."'
    )


def action_message(format: Format, action: str) -> Message:
    """The parsed reply that performs `action`: an `act` tool call in a tool format, else the text."""
    return format.action("act", {"action": action}, action)


def action_of(reply: Message) -> tuple[str, ToolCall | None]:
    """(command, the tool call that carried it) of a parsed reply; the inverse of `action_message`."""
    if reply.tool_calls:
        call = reply.tool_calls[0]
        return str(call.arguments.get("action", "")), call
    return reply.content, None


def observation_message(format: Format, text: str, call: ToolCall | None) -> Message:
    """The env's answer in the format's shape: a tool message answering `act`, or a user turn."""
    return format.observation(text, call, tool="act")


class HouseholdEnv:
    """One household episode at a time. `make_env("household", grammar="0.4", hints=True)`."""

    name = "household"

    def __init__(
        self,
        *,
        grammar: str,
        hints: bool,
        admissible: bool,
        format: str,
        max_steps: int,
        expert: str,
        thoughts: str,
        step_delay_ms: int,
        **_generation_options,
    ):
        # No defaults here: the family's EnvOptions hold them, and `make_env` passes every option resolved.
        self.grammar = grammar
        self.hints = hints
        self.show_admissible = admissible
        self.format = get_format(format)
        self.max_steps = max_steps
        self.expert = expert
        # Each option's own values are checked where it is declared (its EnvOption); here, how they combine.
        if thoughts == "search" and expert != "explorer":
            raise ValueError("thoughts='search' states the explorer's search; it needs expert='explorer'")
        if thoughts != "none" and not self.format.thoughts:
            raise ValueError(f"thoughts={thoughts!r}: the {self.format.name} format has no place for a thought")
        self.thoughts = thoughts
        self.step_delay_s = step_delay_ms / 1000
        self.world: World | None = None
        self._plan: list[str] = []

    @property
    def blocks(self) -> bool:
        """Steps wait (step_delay_ms): the rollout runs them in worker threads."""
        return self.step_delay_s > 0

    # ---- Env protocol --------------------------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        self.task = task
        self.world = World(task.data, self.grammar)
        self.steps = 0
        self.invalid = 0
        self.format_errors = 0
        self.subgoals: set[str] = set()
        self._plan = []
        self._explorer = Explorer()
        self._note_progress()
        system = system_text(self.grammar) + "\n\n" + self.format.system_prompt()  # tool schemas go through tools(): the chat template lists them
        return [Message("system", system), Message("user", self._with_admissible(self.world.intro()))]

    def tools(self) -> list[dict] | None:
        return [ACTION_TOOL] if self.format.uses_tools else None

    def close(self) -> None:
        self.world = None

    def step(self, reply: Message | FormatError) -> StepResult:
        assert self.world is not None, "call reset(task) first"
        if self.step_delay_s:  # stands in for a sandbox or a simulated user that takes this long to answer
            time.sleep(self.step_delay_s)
        self.steps += 1
        hint = None
        defects: list[str] = []  # a format error is the miner's "format" reason, not an env defect
        if isinstance(reply, FormatError):
            self.format_errors += 1
            hint = self.format.error_observation(reply)
            text, call = (hint if self.hints else NOTHING), None
        else:
            action, call = action_of(reply)
            text, chk = self.world.step(action)
            self._advance_plan(action, chk.ok)
            self._explorer.observe(self.world)
            defects = self._defects(chk)
            if not chk.ok:
                self.invalid += 1
                hint = chk.reason
                if self.hints:
                    text = chk.reason
        self._note_progress()
        won = self.world.goal_reached()
        done = won or self.steps >= self.max_steps
        stop = StopReason.success if won else (StopReason.max_turns if done else None)
        info = {"progress": self.progress, "won": won, "defects": defects}
        if hint:
            info["hint"] = hint
        return StepResult([self._observation(text, call)], float(won), done, stop, info)

    def score(self) -> Score:
        won = self.world is not None and self.world.goal_reached()
        return Score(
            success=won,
            reward=float(won),
            progress=self.progress,
            details={
                "steps": self.steps,
                "invalid_actions": self.invalid,
                "tool_errors": self.invalid,  # the summary's count of refused actions
                "format_errors": self.format_errors,
                "subgoals": sorted(self.subgoals),
            },
        )

    # ---- scripted-policy support ---------------------------------------------------------------------

    def admissible_actions(self) -> list[str]:
        return self.world.admissible()

    def near_miss_actions(self) -> list[str]:
        return self.world.near_misses()

    def action_message(self, action: str) -> Message:
        return action_message(self.format, action)

    def expert_thought(self) -> str | None:
        """The THOUGHT the expert writes with its next action (`thoughts=goal`: the goal restated; `search`: also
        the place its search is at), or None. Asked after `expert_reply()`, so it states the decided search."""
        if self.thoughts == "none":
            return None
        goal = goal_thought(self.world.goal)
        return goal if self.thoughts == "goal" else f"{goal} {self._explorer.search_note(self.world)}".rstrip()

    def expert_reply(self) -> Message:
        if self.expert == "explorer":
            return self.action_message(self._explorer.next_action(self.world))
        if not self._plan:
            self._plan = expert_plan(self.world)
        return self.action_message(self._plan[0] if self._plan else "look")

    # ---- internals -----------------------------------------------------------------------------------

    def _defects(self, chk: Check) -> list[str]:
        """The per-step defects of a parsed command (design: contract_defects), from the state after it ran."""
        if not chk.ok:
            return ["invalid_action"]
        if chk.verb in ("goto", "open", "examine_receptacle") and self._implausible(chk.args[0]):
            return ["implausible_location"]
        return []

    def _implausible(self, rname: str) -> bool:
        """Searching (empty-handed) a receptacle type that never holds the goal object and serves no goal step."""
        g = self.world.goal
        if self.world.held is not None:  # carrying something: delivering or putting it down, not searching
            return False
        rtype = self.world.receptacles[rname].type
        if rtype in (g["receptacle"], TRANSFORM_APPLIANCE.get(g["transform"] or "")):
            return False
        return not is_plausible(g["object"], rtype) and not (g["toggle"] and is_plausible(g["toggle"], rtype))

    def _advance_plan(self, action: str, ok: bool) -> None:
        # The cached expert plan stays valid only while the episode follows it.
        if self._plan and ok and action.strip() == self._plan[0]:
            self._plan.pop(0)
        elif ok or (self._plan and action.strip() == self._plan[0]):
            self._plan = []

    def _observation(self, text: str, call: ToolCall | None) -> Message:
        return observation_message(self.format, self._with_admissible(text), call)

    def _with_admissible(self, text: str) -> str:
        if not self.show_admissible:
            return text
        return f"{text}\nAVAILABLE ACTIONS: {', '.join(self.world.admissible())}"

    def _note_progress(self) -> None:
        """Record subgoals reached (monotone): found, taken, transformed / lamp found, placed."""
        w, g = self.world, self.world.goal
        here = w.receptacles.get(w.at) if w.at else None
        visible = here.contents if here and (not here.openable or here.opened) else []
        if any(w.objects[n].type == g["object"] for n in visible) or (w.held and w.objects[w.held].type == g["object"]):
            self.subgoals.add("found")
        if w.held and w.objects[w.held].type == g["object"]:
            self.subgoals.add("taken")
        if g["transform"] and any(o.type == g["object"] and getattr(o, TRANSFORM_STATE[g["transform"]]) for o in w.objects.values()):
            self.subgoals.add("transformed")
        if g["toggle"] and here and any(w.objects[n].type == g["toggle"] for n in here.contents):
            self.subgoals.add("lamp_found")
        if not g["toggle"] and g["count"] == 2 and w.goal_objects_placed() >= 1:
            self.subgoals.add("placed_one")
        if w.goal_reached():
            self.subgoals.add("done")

    @property
    def subgoal_names(self) -> list[str]:
        g = self.world.goal
        names = ["found", "taken"]
        if g["transform"]:
            names.append("transformed")
        if g["toggle"]:
            names.append("lamp_found")
        if g["count"] == 2:
            names.append("placed_one")
        return names + ["done"]

    @property
    def progress(self) -> float:
        names = self.subgoal_names
        return round(sum(n in self.subgoals for n in names) / len(names), 6)

