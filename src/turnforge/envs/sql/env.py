"""SqlEnv: AgentBench DBBench episodes (text protocol "react_sql" or function calling "tool_call").

Text protocol, as AgentBench v0.2 runs it: every reply is either `Action: Operation` + a ```sql block
(the statement, newlines turned into spaces, is executed; the observation is `str(rows)` or the error,
cut to 800 characters) or `Action: Answer` + `Final Answer: [...]`, which ends the episode. At most
`max_rounds` (15) statements; a 16th operation ends the episode unexecuted. A reply that matches no
pattern ends the episode as AgentBench does ("judged as FAIL") unless `hints=True`, which answers with the
format's correction and goes on (Environment Tuning).

Function calling (AgentBench-FC): tools `execute_sql(query)` and `commit_final_answer(answers)`; the first
call of a reply runs; a reply with no call is told "No executable tool calls found. Please call a tool.";
at most `max_rounds` replies.

Verdict (scoring.py): SELECT-style against `label`; INSERT/UPDATE/DELETE by the MD5 table hash after the
episode, however it ended (as in AgentBench). `info` carries `progress` and the per-step `defects`.
"""

from __future__ import annotations

import json
import weakref
from typing import Any

from turnforge.envs.sql.backends import SqlBackend, open_backend
from turnforge.envs.sql.data import Table, is_mutation
from turnforge.envs.sql.defects import (
    ANSWER_WITHOUT_QUERY,
    SQL_ERROR,
    WRONG_TABLE,
    is_read_only,
    task_tables,
    touches_task_table,
)
from turnforge.envs.sql.expert import expert_action
from turnforge.envs.sql.prompts import COMMIT_ANSWER, EXECUTE_SQL, NO_TOOL_CALL, TOOLS, opening_messages
from turnforge.envs.sql.scoring import select_correct, values_correct
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.formats.families import accepts_format
from turnforge.formats.react import FINAL_ANSWER
from turnforge.types import Message, Score, StepResult, StopReason, Task, ToolCall

FORMATS = ("react_sql", "tool_call")


class SqlEnv:
    """One DBBench-style episode at a time. `make_env("dbbench", db_url="mysql://root@127.0.0.1:3306")`."""

    blocks = True  # statements wait on a database (a server's, or SQLite's up to the statement timeout)

    def __init__(
        self,
        name: str = "dbbench",
        *,
        format: str,
        db_url: str,
        max_rounds: int,
        timeout: float,
        hints: bool,
        **_task_options: Any,
    ):
        # No defaults here: the family's EnvOptions hold them, and `make_env` passes every option resolved.
        if not accepts_format(format, FORMATS):
            raise ValueError(f"the sql envs speak {' or '.join(FORMATS)}, not {format!r}")
        self.name = name
        self.format = get_format(format)
        self.function_calling = self.format.uses_tools
        self.max_rounds = max_rounds
        self.hints = hints
        self.backend: SqlBackend = open_backend(db_url, timeout)
        # URL backends hold a server database per episode: drop it when the env is garbage collected.
        self._finalizer = weakref.finalize(self, self.backend.close)

    # ---- Env protocol --------------------------------------------------------------------------------

    def reset(self, task: Task) -> list[Message]:
        self.task = task
        self.table = Table.from_dict(task.data["table"])
        self.mutation = is_mutation(task.category)
        self.allowed_tables = task_tables(self.table.name, task.data.get("gold_sql"))
        self.setup_error = self.backend.create(self.table)
        self.initial_hash = self.backend.table_hash(self.table) if self.mutation else ""
        self.statements: list[str] = []  # every statement run, in order (the expert reads them)
        self.replies = 0
        self.format_errors = 0
        self.sql_errors = 0
        self.answer: list[Any] | str | None = None
        self.subgoals: set[str] = set()
        self.verdict: tuple[bool, str] | None = None  # (success, what was compared), fixed at the end
        return opening_messages(task.data, self.function_calling)

    def tools(self) -> list[dict] | None:
        return TOOLS if self.function_calling else None

    def close(self) -> None:
        """Drop the episode's database now (also done at the next reset and when the env is collected)."""
        self.backend.close()

    def step(self, reply: Message | FormatError) -> StepResult:
        assert hasattr(self, "task"), "call reset(task) first"
        self.replies += 1
        sql, answer, call_id, problem = self._read(reply)
        defects: list[str] = []
        if sql is not None and self._out_of_rounds():
            return self._finish(StopReason.max_turns, [], defects)
        if sql is not None:
            text = self._run(sql, defects)
            return self._go_on(self._observation(text, call_id, EXECUTE_SQL), defects)
        if answer is not None:
            if not self.statements:
                defects.append(ANSWER_WITHOUT_QUERY)
            self.answer = answer
            return self._finish(None, [], defects)
        self.format_errors += 1
        if self.function_calling or self.hints:
            return self._go_on(self._observation(problem, call_id, None), defects, hint=problem)
        return self._finish(StopReason.format_error_limit, [], defects)  # AgentBench: AGENT_VALIDATION_FAILED

    def score(self) -> Score:
        success, compared = self.verdict if self.verdict is not None else self._judge()
        return Score(
            success=success,
            reward=float(success),
            progress=self.progress(success),
            details={
                "type": self.task.category,
                "compared": compared,
                "statements": len(self.statements),
                "sql_errors": self.sql_errors,
                "tool_errors": self.sql_errors,  # the summary's count of refused actions
                "format_errors": self.format_errors,
                "subgoals": sorted(self.subgoals),
                **({"setup_error": self.setup_error} if self.setup_error else {}),
            },
        )

    # ---- scripted-policy support ---------------------------------------------------------------------

    def expert_reply(self) -> Message:
        """The gold solver at the current state: run the gold statement once, then answer."""
        kind, value = expert_action(self.task.data, self.backend, self.statements, self.table)
        if kind == "sql":
            return self.action_message(value)
        return self.answer_message(value)

    def action_message(self, sql: str) -> Message:
        if self.function_calling:
            return Message("assistant", "", tool_calls=[ToolCall(EXECUTE_SQL, {"query": sql})])
        return Message("assistant", sql)

    def answer_message(self, answers: list[str]) -> Message:
        if self.function_calling:
            return Message("assistant", "", tool_calls=[ToolCall(COMMIT_ANSWER, {"answers": answers})])
        return Message("assistant", json.dumps(answers, ensure_ascii=False), name=FINAL_ANSWER)

    # ---- internals -----------------------------------------------------------------------------------

    def _read(self, reply: Message | FormatError) -> tuple[str | None, Any, str | None, str]:
        """(sql, answer, tool call id, problem): exactly one of sql / answer / problem is set."""
        if isinstance(reply, FormatError):
            problem = NO_TOOL_CALL if self.function_calling else self.format.error_observation(reply)
            return None, None, None, problem
        if not self.function_calling:
            if reply.name == FINAL_ANSWER:
                # AgentBench reads the rest of the "Final Answer:" line, space included.
                return None, " " + reply.content.split("\n", 1)[0], None, ""
            return reply.content.replace("\n", " "), None, None, ""  # AgentBench: newlines -> spaces
        if not reply.tool_calls:
            return None, None, None, NO_TOOL_CALL
        call = reply.tool_calls[0]
        if call.name == EXECUTE_SQL and isinstance(call.arguments.get("query"), str):
            return call.arguments["query"], None, call.id, ""
        if call.name == COMMIT_ANSWER and isinstance(call.arguments.get("answers"), list):
            return None, call.arguments["answers"], call.id, ""
        return None, None, call.id, (
            f"Invalid call {call.name}({json.dumps(call.arguments, ensure_ascii=False)[:200]}): use "
            f"{EXECUTE_SQL}(query: string) or {COMMIT_ANSWER}(answers: list of strings)."
        )

    def _out_of_rounds(self) -> bool:
        if self.function_calling:
            return self.replies > self.max_rounds
        return len(self.statements) >= self.max_rounds

    def _run(self, sql: str, defects: list[str]) -> str:
        """Execute one statement; record defects and subgoals; return the observation text."""
        self.statements.append(sql)
        result = self.backend.execute(sql)
        on_task_table = touches_task_table(sql, self.allowed_tables)
        if not on_task_table:
            defects.append(WRONG_TABLE)
        if not result.ok:
            self.sql_errors += 1
            defects.append(SQL_ERROR)
        else:
            self.subgoals.add("query_ok")
            if on_task_table:
                self.subgoals.add("right_table")
            if self.mutation and not is_read_only(sql) and self.backend.table_hash(self.table) != self.initial_hash:
                self.subgoals.add("table_changed")
        return result.observation()

    def _observation(self, text: str, call_id: str | None, tool: str | None) -> Message:
        if self.function_calling and tool is not None:
            return Message("tool", text, tool_call_id=call_id, name=tool)
        return Message("user", text)

    def _go_on(self, observation: Message, defects: list[str], hint: str | None = None) -> StepResult:
        if self.function_calling and self.replies >= self.max_rounds:
            return self._finish(StopReason.max_turns, [observation], defects)
        info: dict[str, Any] = {"progress": self.progress(False), "defects": defects}
        if hint:
            info["hint"] = hint
        return StepResult([observation], 0.0, False, None, info)

    def _finish(self, stop: StopReason | None, messages: list[Message], defects: list[str]) -> StepResult:
        """End the episode: fix the verdict (table hash now, as AgentBench), then drop the database."""
        self.verdict = self._judge()
        self.backend.close()
        success = self.verdict[0]
        stop = stop or (StopReason.success if success else StopReason.failure)
        info = {"progress": self.progress(success), "defects": defects, "won": success}
        return StepResult(messages, float(success), True, stop, info)

    def _judge(self) -> tuple[bool, str]:
        """(success, the compared value): table hash for mutations, the answer for SELECT-style."""
        if self.mutation:
            found = self.backend.table_hash(self.table)
            return found == self.task.data["answer_md5"], found
        if self.answer is None:
            return False, ""
        label = self.task.data["label"]
        if isinstance(self.answer, str):
            return select_correct(self.answer, label), self.answer
        return values_correct(self.answer, label), json.dumps(self.answer, ensure_ascii=False)

    def progress(self, success: bool) -> float:
        """1.0 on success; else the fraction of subgoals reached (a statement ran, on the task table,
        and for modifications the table changed), scaled to leave room for success."""
        if success:
            return 1.0
        names = ["query_ok", "right_table"] + (["table_changed"] if self.mutation else [])
        return round(sum(n in self.subgoals for n in names) / (len(names) + 1), 6)
