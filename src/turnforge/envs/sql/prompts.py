"""What the agent is told: AgentBench DBBench's prompts (v0.2 text protocol, and the function-calling one).

The prompt texts are benchmark facts reproduced word for word (AgentBench v0.2
`src/server/tasks/dbbench/__init__.py` big_prompt; `main` task.py SYSTEM_PROMPT), so that a model trained
here meets the same words at evaluation.
"""

from __future__ import annotations

from typing import Any

from turnforge.types import Message

BIG_PROMPT = """
I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose to operate or to answer.
your operation should be like this:
Action: Operation
```sql
SELECT * FROM table WHERE condition;
```
You MUST put SQL in markdown format without any other comments. Your SQL should be in one line.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If you are done operating, and you want to commit your final answer, then write down:
Action: Answer
Final Answer: ["ANSWER1", "ANSWER2", ...]
DO NOT write this pattern unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
Your input will be raw MySQL response, you have to deal with it by yourself.
"""

FC_SYSTEM_PROMPT = """I will ask you a question, then you should help me operate a MySQL database with SQL to answer the question.
You have to explain the problem and your solution to me and write down your thoughts.
After thinking and explaining thoroughly, every round you can choose to operate or to answer with the two specific tools provided.
If you should execute a SQL query, use the `execute_sql` function, Your SQL should be in one line.
Every time you can only execute one SQL statement. I will only execute the statement in the first SQL code block. Every time you write a SQL, I will execute it for you and give you the output.
If you are done operating, and you want to commit your final answer, then use the `commit_final_answer` function.
DO NOT use this tool unless you are sure about your answer. I expect an accurate and correct answer.
Your answer should be accurate. Your answer must be exactly the same as the correct answer.
If the question is about modifying the database, then after done operation, your answer field can be anything.
If your response cannot match any pattern I mentioned earlier, you will be judged as FAIL immediately.
You should always use the tools provided to submit your answer. Be careful not to write it in the content field.
Your input will be raw MySQL response, you have to deal with it by yourself."""

# AgentBench-FC's reply to a turn without a tool call (the episode goes on).
NO_TOOL_CALL = "No executable tool calls found. Please call a tool."

EXECUTE_SQL, COMMIT_ANSWER = "execute_sql", "commit_final_answer"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": EXECUTE_SQL,
            "description": "Run one SQL statement on the database and return its rows or its error.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "one SQL statement, in one line"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": COMMIT_ANSWER,
            "description": "Submit the final answer and end the task (any list after a modification task).",
            "parameters": {
                "type": "object",
                "properties": {
                    "answers": {"type": "array", "items": {"type": "string"}, "description": "the answer values"}
                },
                "required": ["answers"],
            },
        },
    },
]


def opening_messages(data: dict[str, Any], function_calling: bool) -> list[Message]:
    """The conversation before the agent's first turn, as AgentBench injects it.

    Text protocol: user = big prompt, agent = "Ok.", user = description + "\\n" + add_description.
    Function calling: system prompt, then one user message with the table information and the question.
    """
    if function_calling:
        user = ""
        if data.get("add_description"):
            user += "Additional table information about the question: " + data["add_description"] + "\n"
        user += "Question: " + data["question"] + "\n"
        return [Message("system", FC_SYSTEM_PROMPT), Message("user", user)]
    question = data["question"] + "\n" + data.get("add_description", "")
    return [Message("user", BIG_PROMPT), Message("assistant", "Ok."), Message("user", question)]
