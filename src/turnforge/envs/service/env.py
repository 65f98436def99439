"""ServiceEnv: a tau2-bench customer-service episode (half duplex: agent <-> user, agent <-> tools).

The conversation opens as tau2's orchestrator opens it: the system prompt (`<instructions>` + `<policy>`), the
assistant greeting "Hi! How can I help you today?", and the user's first message. Each agent turn is one
action: a message to the user (a reply without tool calls; its answer is the user's next message) or tool
calls (each run on the episode's own DB; its answer is one tool message per call, errors included as
"Error: ..." observations). Termination as tau2's orchestrator: the agent's `###STOP###` (AGENT_STOP), the
user's `###STOP###` / `###TRANSFER###` / `###OUT-OF-SCOPE###` (USER_STOP), `max_steps` orchestrator steps
(each agent message, tool answer and user message is one) and `max_errors` tool errors, checked where tau2
checks them; a user that breaks protocol (empty message) ends it as USER_ERROR. Only AGENT_STOP and USER_STOP
are graded (evaluation.py).

A reply whose tool call cannot be read (arguments that are not JSON, a `<tool_call>` block that is not a call)
ends the episode as AGENT_ERROR, reward 0: tau2's agent runs `json.loads` on each call's arguments and the
conversation ends there (utils/llm_utils.py `generate`). `on_bad_call="observe"` (for training) answers it with the
format's error as a tool observation, counted as a tool error, and the episode goes on.

The user's tool calls (each call message and each answer is a step, their errors count) are run on the user's
side and answered to the user only, until it says something to the agent, which is all the agent sees. Dual
control (telecom): the task's initial state is applied at reset (state.py) and the calls run on the user's device
tools. A user without tools (retail, airline) that sends one gets tau2's "Error: User tools not available" and goes
on. The user's side (its messages, tool calls and their results, in order) is recorded in the score's details as
`user_side`, so a re-grading (`--env-opt user=replay`) replays the user's calls too.
"""

from __future__ import annotations

import json
import random
from typing import Any

from turnforge.envs.isolation import CheckerUnavailable
from turnforge.envs.service.domain import Domain, Gold, load_domain
from turnforge.envs.service.evaluation import (
    ENV_ASSERTION,
    GRADED_ENDINGS,
    actions_done_in_order,
    evaluate,
    judge_messages,
    read_judge_reply,
)
from turnforge.envs.service.random_calls import DRAWS, random_calls, shown_values
from turnforge.envs.service.user_faults import read_review, review_messages, user_faults
from turnforge.envs.service.users import STOP, ModelUser, ScriptedUser, User, is_user_stop
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.formats.plain_text import PlainTextEndsTurn
from turnforge.types import Message, Score, StepResult, StopReason, Task, ToolCall

GREETING = "Hi! How can I help you today?"  # tau2 orchestrator DEFAULT_FIRST_AGENT_MESSAGE
AGENT_STOP_TOKEN = "###STOP###"
AGENT_INSTRUCTION = """You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."""
SCRIPTED_USERS = ("scripted",)

_STOPS = {"user_stop": StopReason.user_stop, "max_steps": StopReason.max_turns,
          "too_many_errors": StopReason.failure, "user_error": StopReason.failure, "agent_error": StopReason.failure}
BAD_CALL_ENDINGS = ("end", "observe")  # tau2's live behaviour; the forgiving one for training


def agent_system_prompt(policy: str) -> str:
    """tau2's LLMAgent system prompt, exactly."""
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


def do_nothing_wins(domain: Domain, task: dict) -> bool:
    """Whether an agent that does nothing wins `task`: tau2's verdict on the task's initial state after a conversation
    of the greeting alone, ended by the user (the scripted user acts only when asked, so neither side changes
    anything); NL assertions are not judged, as without a judge. The home of the do-nothing floor an evaluation
    reports beside its success (each graded episode's `do_nothing_wins`; env_metrics `do_nothing_floor`). Computed
    once per task (every sample's grading asks)."""
    with domain._lock:
        if task["id"] not in domain._do_nothing:
            state = domain.new_state(task)
            verdict = evaluate(task, [Message("assistant", GREETING)], "user_stop", state,
                               domain.gold(task["id"]).state, assertion=state.assertion_met)
            domain._do_nothing[task["id"]] = abs(verdict["reward"] - 1.0) < 1e-6
        return domain._do_nothing[task["id"]]


class ServiceEnv:
    """One tau2-style episode at a time. `make_env("service", domain="retail", data_dir=PATH)`."""

    name = "service"

    def __init__(self, *, domain: str, data_dir: str, tasks: str, retrieval: str, user: str, user_temperature: float,
                 judge: str, max_steps: int, max_errors: int, format: str, on_bad_call: str):
        # No defaults here: the family's EnvOptions hold them, and make_env passes every option resolved.
        self.domain: Domain = load_domain(domain, data_dir, tasks, retrieval)
        self.format = PlainTextEndsTurn(get_format(format))
        if not self.format.uses_tools:
            raise ValueError(f"the service env needs a tool format (tool_call), not {format!r}")
        if on_bad_call not in BAD_CALL_ENDINGS:
            raise ValueError(f"on_bad_call is one of {', '.join(BAD_CALL_ENDINGS)}, not {on_bad_call!r}")
        self.user_kind, self.max_steps, self.max_errors = user, max_steps, max_errors
        self.on_bad_call = on_bad_call
        self.roles: tuple[str, ...] = (() if user in SCRIPTED_USERS else ("user",)) + (("judge",) if judge else ())
        self.clients: dict[str, Any] = {}
        self._tools = self.domain.kind.toolkit.schemas()
        user_side = self.domain.kind.user
        self._user_tools = user_side.toolkit.schemas() if user_side is not None else None

    # ---- Env protocol ------------------------------------------------------------------------------------
    def use_roles(self, clients: dict[str, Any]) -> None:
        self.clients = clients

    def tools(self) -> list[dict] | None:
        return self._tools

    def reset(self, task: Task) -> list[Message]:
        self.task, self.spec = task, task.data  # tau2's task dict (its own "id" keys the gold DB)
        if task.data.get("id") not in self.domain.tasks:
            raise ValueError(f"task {task.id!r} is not a task of service domain {self.domain.name!r} ({self.domain.source})")
        if self.user_kind not in SCRIPTED_USERS and "user" not in self.clients:
            raise ValueError(f"service env option user={self.user_kind!r} plays the user with a model, but no `user` "
                             "role was given: run episodes through run_episodes(roles=...) (eval, recipe stages), or "
                             "set user=scripted where no model user can play (e.g. replaying saved episodes)")
        self.state = self.domain.new_state(self.spec)
        self.db = self.state.db
        self.user: User = ScriptedUser(self.spec) if self.user_kind in SCRIPTED_USERS else \
            ModelUser(self.clients["user"], self.spec.get("user_scenario") or {}, self._task_user_tools(), self.format)
        self.history: list[Message] = [Message("assistant", GREETING)]  # tau2's trajectory
        self.conversation: list[Message] = [Message("assistant", GREETING)]  # what the user sees
        self.steps = self.errors = self.tool_calls = self.user_errors = self.user_tool_errors = 0
        self.termination: str | None = None
        self.expert_done = 0
        self.progress = 0.0
        self._score: Score | None = None
        first = self._user_turn()
        self.ended_at_reset = self.termination is not None
        return [Message("system", agent_system_prompt(self.domain.policy_for(self.spec))), Message("assistant", GREETING),
                *first]

    def step(self, reply: Message | FormatError) -> StepResult:
        if self.termination is not None:  # the user ended it at its first message: tau2 stops there
            return self._reply_after_the_users_end()
        if isinstance(reply, FormatError):
            out = self._unparsable(reply)
        elif reply.tool_calls:
            out = self._tool_turn(reply)
        else:
            out = self._message_turn(reply)
        done = self.termination is not None
        return StepResult(out, done=done, stop=_STOPS.get(self.termination) if done else None,
                          info={"progress": self.progress, "steps": self.steps, "tool_errors": self.errors})

    def score(self) -> Score:
        if self._score is None:
            self._score = self._grade()
        return self._score

    def close(self) -> None:
        self.clients = {}

    def _task_user_tools(self) -> list[dict] | None:
        """The user's tools in this task: tau2 gives its user only those the task's `user_tools` names (all when
        it names none; none when it is an empty list, or names a tool the user lacks: tau2's look-up raises there
        and its runner gives the user no tools)."""
        names = self.spec.get("user_tools")
        if names is None or self._user_tools is None:
            return self._user_tools
        listed = [s for s in self._user_tools if s["function"]["name"] in names]
        return listed if listed and len(listed) == len(set(names)) else None

    # ---- turns -------------------------------------------------------------------------------------------
    def _message_turn(self, reply: Message) -> list[Message]:
        message = Message("assistant", reply.content)
        self.history.append(message)
        self.steps += 1
        if AGENT_STOP_TOKEN in reply.content:
            self.termination = "agent_stop"
            self._check_limits()
            return []
        self.conversation.append(message)
        self._check_limits()
        if self.termination is not None:
            return []
        return self._user_turn()

    def _user_turn(self) -> list[Message]:
        reply = self.user.reply(self.conversation, self.history)
        self.steps += 1
        while reply is not None and reply.tool_calls:
            if not self._user_tool_turn(reply):
                return []
            reply = self.user.reply(self.conversation, self.history)
            self.steps += 1
        if reply is None:  # no message: the user broke protocol
            self.user_errors += 1
            self.termination = "user_error"
            return []
        text = reply.content
        message = Message("user", text)
        self.history.append(message)
        self.conversation.append(message)
        if is_user_stop(text):
            self.termination = "user_stop"
        self._check_limits()
        return [message]

    def _user_tool_turn(self, reply: Message) -> bool:
        """The user's calls on its own tools, answered to the user; False when the episode ended there. A user
        without tools gets tau2's "Error: User tools not available" for each (state.py)."""
        calls = [ToolCall(c.name, c.arguments, c.id or f"user_call_{self.tool_calls + i}")
                 for i, c in enumerate(reply.tool_calls)]
        message = Message("user", reply.content, tool_calls=calls)
        self.history.append(message)
        self.conversation.append(message)
        for call in calls:
            result = self.state.call(call.name, call.arguments, "user")
            self.tool_calls += 1
            self.errors += result.error
            self.user_tool_errors += result.error
            answer = Message("tool", result.content, tool_call_id=call.id, name=call.name)
            self.history.append(answer)
            self.conversation.append(answer)
        self.steps += 1
        self.progress = self._progress()
        self._check_limits()
        return self.termination is None

    def _tool_turn(self, reply: Message) -> list[Message]:
        calls = [ToolCall(c.name, c.arguments, c.id or f"call_{self.tool_calls + i}") for i, c in enumerate(reply.tool_calls)]
        self.history.append(Message("assistant", reply.content, tool_calls=calls))
        self.steps += 1
        if AGENT_STOP_TOKEN in reply.content:  # tau2 stops before the calls reach the environment
            self.termination = "agent_stop"
            return []
        out, wrote = [], False
        for call in calls:
            result = self.state.call(call.name, call.arguments)
            self.tool_calls += 1
            self.errors += result.error
            wrote |= self.domain.tool_kinds().get(call.name) == "write"
            self.history.append(Message("tool", result.content, tool_call_id=call.id, name=call.name))
            out.append(self.format.observation(result.content, call))
        self.steps += 1
        if wrote or self._assertion_progress():
            self.progress = self._progress()
        self._check_limits()
        return out

    def _unparsable(self, error: FormatError) -> list[Message]:
        if self.on_bad_call == "end":  # tau2's json.loads raised before the reply became a message or a step
            self.termination = "agent_error"
            return []
        self.history.append(Message("assistant", error.text))
        text = self.format.error_observation(error)
        self.history.append(Message("tool", text))
        self.steps += 2
        self.errors += 1
        self._check_limits()
        return [self.format.observation(text)]

    def _reply_after_the_users_end(self) -> StepResult:
        """The step after a reset whose user ended the episode (###STOP### or a protocol break as its first
        message): tau2's simulation ended before the agent's turn, so this reply is not part of it."""
        assert self.ended_at_reset, "the episode has ended; call reset(task)"
        self.ended_at_reset = False  # asked once
        return StepResult([], done=True, stop=_STOPS.get(self.termination),
                          info={"progress": self.progress, "steps": self.steps, "tool_errors": self.errors})

    def _check_limits(self) -> None:
        """tau2's `_check_termination`, run where it runs (not while tool calls await their answer)."""
        if self.steps >= self.max_steps:
            self.termination = "max_steps"
        if self.errors >= self.max_errors:
            self.termination = "too_many_errors"

    # ---- grading -----------------------------------------------------------------------------------------
    def _assertion_progress(self) -> bool:
        criteria = self.spec.get("evaluation_criteria") or {}
        return ENV_ASSERTION in (criteria.get("reward_basis") or []) and bool(criteria.get("env_assertions"))

    def _progress(self) -> float:
        """Fraction of the gold write actions (either side's) whose changed records already equal the gold ones; for a
        task graded on env assertions (telecom), the fraction of its assertions already met. The score's progress of
        a solved episode is 1.0 (`_grade`)."""
        if self._assertion_progress():
            assertions = self.spec["evaluation_criteria"]["env_assertions"]
            return sum(map(self.state.assertion_met, assertions)) / len(assertions)
        gold = self.domain.gold(self.spec["id"])
        if not gold.write_records:
            return 0.0
        hits = sum(self.db.same_state(gold.db, keys) for keys in gold.write_records)
        return hits / len(gold.write_records)

    def _grade(self) -> Score:
        termination = self.termination or "not_ended"
        gold = self.domain.gold(self.spec["id"])
        judge = self._judge if "judge" in self.clients else None
        verdict = evaluate(self.spec, self.history, termination, self.state, gold.state,
                           assertion=self.state.assertion_met, judge=judge)
        reward = verdict.pop("reward")
        details = {
            "domain": self.domain.name,
            "termination": termination,
            "reward_basis": verdict.pop("reward_basis"),
            "reward_breakdown": verdict.pop("reward_breakdown"),
            **verdict,
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "tool_errors": self.errors,
            "user_errors": self.user_errors,
            "user_tokens": self.user.tokens,
            "user_side": [m.to_dict() for m in self.conversation if m.role != "assistant"],
            "user_faults": self._user_faults(termination, gold),
        }
        if gold.errors:
            details["gold_errors"] = gold.errors
        details["do_nothing_wins"] = do_nothing_wins(self.domain, self.spec)
        success = termination in GRADED_ENDINGS and abs(reward - 1.0) < 1e-6
        if not success and not details["user_faults"] and "judge" in self.clients:
            self._review_user(details)
        # A solved episode reached every subgoal: its partial score cannot say less (a task whose gold writes nothing
        # has no subgoal to count, and progress stayed 0.0 on solved episodes of it: issue 60).
        return Score(success=success, reward=reward, progress=1.0 if success else self.progress, details=details)

    def _user_faults(self, termination: str, gold: Gold) -> list[str]:
        """What the user side did wrong (user_faults.py), from the scenario it was given."""
        criteria = self.spec.get("evaluation_criteria") or {}
        has_goal = bool(gold.write_records) or self._assertion_progress()
        return user_faults(self.spec.get("user_scenario") or {}, self.conversation, self.history, termination,
                           has_goal and self.progress < 1.0, self.user_tool_errors, criteria.get("actions") or [])

    def _review_user(self, details: dict[str, Any]) -> None:
        """The judge's review of a failure no rule puts on the user (user_faults.py): a fault, or no verdict."""
        gen = self.clients["judge"].generate(review_messages(self.spec.get("user_scenario") or {}, self.conversation))
        verdict = read_review(gen.text)
        if verdict is None:
            details["user_review"] = "no_verdict"
        elif verdict:
            details["user_faults"].append("judged_user_fault")

    def _judge(self, history: list[Message], assertions: list[str]) -> list[bool]:
        """The judge's verdict per NL assertion. A reply that is not the JSON asked for is no verdict (issue 40):
        CheckerUnavailable, the episode's env error (tau2's evaluator raises on it too), never a reward computed
        without the component. A judge backend that fails raises its own BackendError, which stops the run."""
        gen = self.clients["judge"].generate(judge_messages(history, assertions))
        verdicts = read_judge_reply(gen.text, len(assertions))
        if verdicts is None:
            raise CheckerUnavailable(f"task {self.spec['id']}: the NL-assertion judge's reply is not the JSON asked "
                                     f"for ({gen.text[:120]!r}): no verdict; check the judge model (--env-opt judge=)")
        return verdicts

    # ---- scripted policies -------------------------------------------------------------------------------
    def admissible_actions(self) -> list[str]:
        """For `--policy random`: calls of every tool of the domain with arguments drawn from what the conversation
        has shown (random_calls.py; never the task's gold calls), a question to the user and the stop token."""
        rng = random.Random(f"{self.spec['id']}/{len(self.history)}")
        calls = random_calls(self._tools, shown_values(self.history), rng)
        talk = ["Could you give me more details, please?", AGENT_STOP_TOKEN] * DRAWS
        return [json.dumps(c, sort_keys=True) for c in calls] + talk

    def action_message(self, action: str) -> Message:
        if action.startswith("{"):
            call = json.loads(action)
            return Message("assistant", "", tool_calls=[ToolCall(call["name"], call["arguments"])])
        return Message("assistant", action)

    def _gold_actions(self) -> list[dict]:
        return [a for a in (self.spec.get("evaluation_criteria") or {}).get("actions") or []
                if a.get("requestor", "assistant") == "assistant"]

    def expert_reply(self) -> Message:
        """The gold actions in order (one call per turn; for one of the user's, a message asking the user to do
        it), then the task's `communicate_info`, then stop."""
        actions = (self.spec.get("evaluation_criteria") or {}).get("actions") or []
        calls = [c for m in self.history if m.role in ("assistant", "user") for c in m.tool_calls or []]
        done = actions_done_in_order(actions, calls)
        if done < len(actions) and self.expert_done < 2 * len(actions):  # two turns per action at most: nothing loops
            self.expert_done += 1
            action = actions[done]
            arguments = dict(action.get("arguments") or {})
            if action.get("requestor", "assistant") == "user":
                arguments_text = json.dumps(arguments, ensure_ascii=False)  # the values as written: asks_for finds them
                return Message("assistant", f"Please do this on your phone: {action['name']} {arguments_text}")
            return Message("assistant", "", tool_calls=[ToolCall(action["name"], arguments)])
        if self.expert_done < 2 * len(actions) + 1:
            self.expert_done = 2 * len(actions) + 1
            info = (self.spec.get("evaluation_criteria") or {}).get("communicate_info") or []
            return Message("assistant", "; ".join(info) if info else "Your request has been handled.")
        return Message("assistant", STOP)
