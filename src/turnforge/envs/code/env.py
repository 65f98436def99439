"""CodeEnv: math and programming problems solved with one `code_interpreter` tool (the DemyAgent setting).

Episode (Open-AgentRL `recipe/demystify`, benchmarks.md §5): the user message is the seed's math prompt (or
its LiveCodeBench-style code prompt); each reply with `<tool_call>`s runs each call's code in the sandbox
pool and answers with `tool` messages (stdout + stderr, truncated with a marker); a reply without a call is
the final answer and ends the episode; after `max_turns` replies (16, the seed's max_assistant_turns) the
episode ends unanswered. A malformed call, an unknown tool or a missing `code` argument is an observation
(the tool's error text), never an error of the run. The sandbox waits, so `blocks = True`.

Score: math — success when the last `\\boxed{}` is right (checking.py); reward ±1 is the recipe's
`signed_outcome`. Code — the fraction of tests the final program passes (`progress` and `reward`),
success when all pass (`binary=true`: progress 1 or 0). details: tool calls, sandbox timeouts and errors,
format errors, the sandbox's isolation mode (docs/security.md), the verdict's reasons.
"""

from __future__ import annotations

from typing import Any

from turnforge.envs.code import checking
from turnforge.envs.code.sandbox import SandboxLimits, shared_pool
from turnforge.envs.code.tool import TOOL_NAME, TOOL_SCHEMA, code_to_run, tool_output
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.formats.plain_text import PlainTextEndsTurn
from turnforge.types import Message, Score, StepResult, StopReason, Task, ToolCall

SYSTEM_TEXT = "You are a helpful assistant."
MATH_PROMPT = (  # Open-AgentRL recipe/demystify math prompt, verbatim
    "Analyze and solve the following math problem step by step. \n\n{problem}"
    "\n\nThe tool could be used for more precise and efficient calculation and could help you to verify your "
    "result before you reach the final answer."
    "\n\n**Note: You should first analyze the problem and form a high-level solution strategy, then utilize "
    "the tools to help you solve the problem.**"
    "\nRemember once you make sure the current answer is your final answer, do not call the tools again and "
    "directly output the final answer in the following text format, the answer format must be: "
    "\\boxed{{'The final answer goes here.'}}."
)
CODE_PROMPT = (  # the seed's LiveCodeBench prompt, shortened to its instructions
    "You will be given a question (problem specification) and will generate a correct Python program that "
    "matches the specification and passes all tests. You may use the tool to run and test code.\n\n"
    "Question: {problem}\n\n"
    "Read the inputs from stdin and write the answer to stdout, or define the named function, as the question "
    "asks. Submit your final code, without calling the tool again, within ```python\n# YOUR CODE HERE\n```"
)


class CodeEnv:
    """`make_env("code", generate=20)`: one problem per episode, one code_interpreter tool."""

    name = "code"
    blocks = True  # every tool call and code check waits on the sandbox

    def __init__(self, *, format: str, max_turns: int, math_verify: str, binary: bool, timeout: float, memory_mb: int,
                 workers: int, max_output_chars: int, **_task_options: Any) -> None:
        # No defaults here: the family's EnvOptions hold them, and `make_env` passes every option resolved.
        if math_verify == "math_verify" and not checking.math_verify_available():
            raise ValueError("code env: math_verify=math_verify needs the math-verify package: "
                             "pip install 'turnforge[code]', or pass --env-opt math_verify=strict")
        self.format = PlainTextEndsTurn(get_format(format))  # a reply without a call is the final answer
        self.max_turns, self.math_mode, self.binary = max_turns, math_verify, binary
        self.timeout, self.max_output_chars = timeout, max_output_chars
        limits = SandboxLimits(timeout_s=timeout, cpu_s=timeout, memory_mb=memory_mb)
        self.pool = shared_pool(workers, limits)
        self.finished = True

    # ---- Env protocol --------------------------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        self.task = task
        self.turns = self.tool_calls = self.tool_errors = self.sandbox_timeouts = self.format_errors = 0
        self.last_output: str | None = None
        self.verdict: dict[str, Any] = {"success": False, "fraction": 0.0, "reason": "no final answer"}
        self.finished = False
        prompt = MATH_PROMPT if self.is_math else CODE_PROMPT
        return [Message("system", SYSTEM_TEXT), Message("user", prompt.format(problem=task.data["problem"]))]

    @property
    def is_math(self) -> bool:
        return "answer" in self.task.data

    def tools(self) -> list[dict] | None:
        return [TOOL_SCHEMA]

    def close(self) -> None:
        """Nothing per episode: the sandbox pool is shared by the process and closed at its exit."""

    def step(self, reply: Message | FormatError) -> StepResult:
        if self.finished:
            raise RuntimeError(f"episode of {self.task.id} is over (done was returned); call reset(task)")
        self.turns += 1
        if isinstance(reply, FormatError):
            self.format_errors += 1
            observation = [Message("user", self.format.error_observation(reply))]
        elif not reply.tool_calls:
            return self._final(reply.content or "")
        else:
            observation = [self._call(call) for call in reply.tool_calls]
        if self.turns >= self.max_turns:
            self.finished = True
            return StepResult(observation, 0.0, True, StopReason.max_turns, {"progress": 0.0})
        return StepResult(observation, 0.0, False, None, {"progress": 0.0})

    def score(self) -> Score:
        success = bool(self.verdict["success"])
        fraction = float(self.verdict["fraction"])
        progress = float(success) if self.binary or self.is_math else fraction
        return Score(success=success, reward=progress, progress=progress, details={
            "category": self.task.category, "turns": self.turns, "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors, "sandbox_timeouts": self.sandbox_timeouts,
            "format_errors": self.format_errors, "sandbox_isolation": self.pool.isolation,
            **{k: v for k, v in self.verdict.items() if k != "success"},
        })

    # ---- expert --------------------------------------------------------------------------------------

    def expert_reply(self) -> Message:
        """Run the known program through the tool, then answer from what it printed (or submit it)."""
        code = self.task.data.get("expert_code")
        if code is None:  # a file task without a program: answer with what the file knows
            if self.is_math:
                return Message("assistant", f"\\boxed{{{self.task.data['answer']}}}")
            return Message("assistant", "I cannot solve this problem.")
        if self.last_output is None:  # (a stdin program runs here on empty input: a smoke test)
            return self.format.action(TOOL_NAME, {"code": code}, "")
        if self.is_math:
            return Message("assistant", f"The computation gives \\boxed{{{self.last_output.strip()}}}.")
        return Message("assistant", f"Final solution:\n```python\n{code}```")

    # ---- internals -----------------------------------------------------------------------------------

    def _call(self, call: ToolCall) -> Message:
        self.tool_calls += 1
        code = call.arguments.get("code")
        if call.name != TOOL_NAME:
            self.tool_errors += 1
            content = f"Error: there is no tool named {call.name!r}; the only tool is {TOOL_NAME}(code)."
        elif not isinstance(code, str) or not code.strip():
            self.tool_errors += 1
            content = f"Error: {TOOL_NAME} needs a non-empty string argument 'code'."
        else:
            result = self.pool.run(code_to_run(code), timeout=self.timeout)
            self.sandbox_timeouts += result.timed_out
            self.tool_errors += result.exit_code != 0
            content = tool_output(result, self.max_output_chars, self.timeout)
        self.last_output = content
        return self.format.observation(content, call)

    def _final(self, text: str) -> StepResult:
        self.finished = True
        if self.is_math:
            ok, why = checking.check_math(text, self.task.data["answer"], self.math_mode)
            self.verdict = {"success": ok, "fraction": float(ok), "reason": why}
        else:
            program = checking.final_program(text)
            if program is None:
                self.verdict = {"success": False, "fraction": 0.0, "reason": "no ```python block that parses"}
            else:
                verdict = checking.check_code(program, self.task.data["tests"], self.pool, self.timeout)
                self.verdict = {"success": verdict.passed == verdict.total, "fraction": verdict.fraction,
                                "tests_passed": verdict.passed, "tests": verdict.total,
                                "test_timeouts": verdict.timeouts, "reason": "; ".join(verdict.failures) or None}
        score = self.score()
        stop = StopReason.success if score.success else StopReason.failure
        return StepResult([], score.reward, True, stop, {"progress": score.progress})
