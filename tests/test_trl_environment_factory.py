"""`turnforge.integrations.trl`: turnforge's tool envs as TRL `environment_factory` environments, trained by TRL's
own GRPOTrainer (no turnforge rollout code in the loop)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.utils import get_json_schema

from turnforge.envs.base import load_tasks, make_env
from turnforge.integrations.trl import (
    TurnforgeEnvironment,
    env_progress,
    env_reward,
    environment_factory,
    task_dataset,
)
from turnforge.types import Message, ToolCall

ROOT = Path(__file__).resolve().parents[1]
TAU2 = ROOT.parent / "shared" / "data" / "tau2"
needs_tau2 = pytest.mark.skipif(not (TAU2 / "retail").is_dir(), reason="needs ../shared/data/tau2")
RETAIL = {"domain": "retail", "data_dir": str(TAU2 / "retail")}
TOOL_ENVS = [  # every tool-based env, with the options that make it tool-based and small
    ("code", {"generate": 3}),
    ("sql", {"format": "tool_call"}),
    ("household", {"format": "tool_call"}),
    ("bfcl", {}),
    ("service", {"domain": "desk"}),
    pytest.param("service", RETAIL, marks=needs_tau2),
    pytest.param("service", {"domain": "airline", "data_dir": str(TAU2 / "airline")}, marks=needs_tau2),
    pytest.param("service", {"domain": "telecom", "data_dir": str(TAU2 / "telecom")}, marks=needs_tau2),
]


def _classes(factory: type | dict[str, type]) -> list[type]:
    return list(factory.values()) if isinstance(factory, dict) else [factory]


def _what_hints_can_write(tool: dict[str, Any]) -> dict[str, Any]:
    """An env's tool schema as transformers' get_json_schema can write it (docs/decisions.md): no pydantic
    `title` / `default`, nested objects (`$ref`) as plain objects, argument descriptions on one line, no empty
    `required`."""
    tool = copy.deepcopy(tool)
    parameters = tool["function"]["parameters"]
    defs = parameters.pop("$defs", {})
    for key in ("title", "default"):
        parameters.pop(key, None)
    if not parameters.get("required", True):
        del parameters["required"]
    parameters["properties"] = {name: _argument(prop, defs) for name, prop in parameters["properties"].items()}
    for prop in parameters["properties"].values():
        if "description" in prop:
            prop["description"] = " ".join(prop["description"].split())
    return tool


def _argument(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema or (schema.get("type") == "object" and "properties" in schema):
        return {"type": "object"} | ({"description": schema["description"]} if "description" in schema else {})
    out = {k: v for k, v in schema.items() if k not in ("title", "default")}
    if "anyOf" in out:
        kinds = [_argument(s, defs) for s in out.pop("anyOf")]
        if all(kind == kinds[0] for kind in kinds):  # transformers writes a union of one type as that type
            return out | kinds[0]
        out["anyOf"] = kinds
    if isinstance(out.get("items"), dict):
        out["items"] = _argument(out["items"], defs)
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    return out


@pytest.mark.parametrize(("name", "options"), TOOL_ENVS)
def test_generated_tool_schemas_are_the_envs(name, options):
    """TRL renders an environment's tools with get_json_schema: the generated methods give back the env's own
    schemas (code, sql, household: exactly; tau2, BFCL: less what type hints cannot write)."""
    env = make_env(name, **options)
    expected = {}
    for task in load_tasks(name, "test", **options)[:20]:
        env.reset(task)
        expected |= {t["function"]["name"]: t for t in env.tools()}
    rendered = {}
    for cls in _classes(environment_factory(name, **options)):
        instance = cls()
        rendered |= {m.__name__: get_json_schema(m) for m in (getattr(instance, n) for n in vars(cls))
                     if callable(m) and not m.__name__.startswith("_")}
    assert expected.keys() <= rendered.keys()
    for tool, schema in expected.items():
        assert rendered[tool] == _what_hints_can_write(schema), tool
    if name in ("code", "sql", "household"):
        assert [rendered[t] for t in expected] == list(expected.values())


def _trl_episode(factory, row: dict[str, Any]) -> tuple[TurnforgeEnvironment, list[Message], list[str], list[dict]]:
    """The expert's episode as TRL plays it: each call through its method, the first reply without a call last."""
    environment = (factory[row["environment"]] if isinstance(factory, dict) else factory)()
    assert environment.reset(**row) is None
    replies, observations, completion = [], [], []
    while not environment._done:
        reply = environment._env.expert_reply()
        replies.append(reply)
        if not reply.tool_calls:
            completion.append({"role": "assistant", "content": reply.content})
            break
        completion.append({"role": "assistant", "content": "", "tool_calls": [c.to_dict() for c in reply.tool_calls]})
        for call in reply.tool_calls:
            observations.append(getattr(environment, call.name)(**call.arguments))
            completion.append({"role": "tool", "name": call.name, "content": observations[-1]})
    return environment, replies, observations, completion


@pytest.mark.parametrize(("name", "options", "reward"), [
    ("code", {"generate": 2}, 1.0),
    ("sql", {"format": "tool_call"}, 1.0),
    ("household", {"format": "tool_call"}, 1.0),
    pytest.param("service", RETAIL, 1.0, marks=needs_tau2),
    ("bfcl", {}, 0.0),  # TRL's one user turn: BFCL's later turns never come (force-terminated, progress 1/turns)
])
def test_reset_tools_and_reward_round_trip_a_direct_episode(name, options, reward):
    """The expert's calls through the methods and env_reward give the observations and the score of a direct
    episode with the same calls (each its own step, as TRL makes them)."""
    factory = environment_factory(name, **options)
    for row in task_dataset(name, "test", limit=2, **options):
        environment, replies, observations, completion = _trl_episode(factory, row)
        rewards = env_reward([completion], [environment]), env_progress([completion], [environment])

        env = make_env(name, **options)
        task = {t.id: t for t in load_tasks(name, "test", limit=2, **options)}[row["task_id"]]
        assert [{"role": m.role, "content": m.content} for m in env.reset(task)] == row["prompt"]
        direct_observations = []
        for reply in replies:
            for call in reply.tool_calls or []:
                step = env.step(Message("assistant", "", tool_calls=[ToolCall(call.name, call.arguments, "c")]))
                direct_observations.append("\n".join(m.content for m in step.messages))
            if not reply.tool_calls:
                env.step(reply)
        score = env.score()
        assert observations == direct_observations
        assert environment._env.score() == score
        assert rewards == ([score.reward], [score.progress])
        assert score.reward == reward
        if name == "bfcl":
            assert score.details["error_type"] == "multi_turn:force_terminated" and 0 < score.progress < 1


@pytest.mark.parametrize(("name", "options", "reward"), [
    ("sql", {"format": "tool_call"}, 1.0),
    ("bfcl", {}, 0.0),
    pytest.param("service", {"domain": "airline", "data_dir": str(TAU2 / "airline")}, 1.0, marks=needs_tau2),
])
def test_trls_parse_of_the_experts_calls_reaches_the_methods(tiny_model_dir, name, options, reward):
    """TRL's path from tokens to a method call: the tiny model's chat template renders the expert's replies with
    the generated tools, TRL's `parse_response` reads them back (BFCL's integers, airline's nested objects), and
    the calls give the expert's arguments and the env's reward."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, parse_response

    tokenizer = add_response_schema(AutoTokenizer.from_pretrained(tiny_model_dir))
    factory = environment_factory(name, **options)
    row = task_dataset(name, "test", limit=1, **options)[0]
    environment = (factory[row["environment"]] if isinstance(factory, dict) else factory)()
    environment.reset(**row)
    tools = [getattr(environment, n) for n in vars(type(environment)) if callable(getattr(environment, n))]
    conversation, completion = list(row["prompt"]), []
    while not environment._done:
        reply = environment._env.expert_reply()
        prompt_ids = tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
        ids = tokenizer.apply_chat_template(conversation + [reply.to_dict()], tools=tools, tokenize=True,
                                            return_dict=False)[len(prompt_ids):]
        parsed = parse_response(tokenizer, ids, prefix=prompt_ids, tools=tools)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls") or []]
        assert calls == [(c.name, c.arguments) for c in reply.tool_calls or []]
        conversation.append(parsed)
        completion.append(parsed)
        if not calls:
            break
        for call_name, arguments in calls:
            conversation.append({"role": "tool", "name": call_name, "content": getattr(environment, call_name)(**arguments)})
            completion.append(conversation[-1])
    assert env_reward([completion], [environment]) == [reward]


def test_a_call_after_the_end_is_the_tools_error_and_rewards_are_read_once():
    options = {"format": "tool_call"}
    factory = environment_factory("sql", **options)
    environment, _, _, completion = _trl_episode(factory, task_dataset("sql", "test", limit=1, **options)[0])
    assert environment._done  # the expert's commit_final_answer ended it
    with pytest.raises(ValueError, match="episode has ended; answer without calling a tool"):
        environment.execute_sql(query="SELECT 1")  # TRL feeds the message back as the tool's error
    late = completion + [{"role": "assistant", "content": "anything"}]
    assert env_reward([completion], [environment]) == env_reward([late], [environment]) == [1.0]


def test_an_unfinished_tau2_episode_gets_taus_verdict_of_one():
    """The model's last reply is a message to the user, who answers: the episode goes on, and tau2 gives an
    episode that did not end by ###STOP### reward 0."""
    factory = environment_factory("service", domain="desk")
    environment = factory()
    environment.reset(**task_dataset("service", "test", limit=1, domain="desk")[0])
    assert env_reward([[{"role": "assistant", "content": "Could you give me your patient id?"}]], [environment]) == [0.0]
    assert environment._env.score().details["termination"] == "not_ended"


@pytest.mark.parametrize(("name", "options", "why"), [
    ("household", {}, r"\(format act_line\) acts by text, not tool calls"),
    ("sql", {}, r"\(format react_sql\) acts by text, not tool calls"),
    ("bfcl", {"format": "bfcl_python"}, "acts by text, not tool calls"),
    ("service", {"domain": "desk", "user": "hf:some/model"}, "model roles"),
])
def test_envs_that_do_not_map_are_refused_with_the_reason(name, options, why):
    with pytest.raises(ValueError, match=f"env {name!r}.*{why}"):
        environment_factory(name, **options)
    with pytest.raises(ValueError, match=why):
        task_dataset(name, "test", **options)


def test_bfcl_rows_name_their_tool_set_among_the_factorys():
    factory = environment_factory("bfcl")
    rows = task_dataset("bfcl", "test", limit=5)
    env = make_env("bfcl")
    for row, task in zip(rows, load_tasks("bfcl", "test", limit=5), strict=True):
        env.reset(task)
        cls = factory[row["environment"]]
        assert sorted(n for n in vars(cls) if not n.startswith("_") and n not in ("env_name", "env_options")) == \
            sorted(t["function"]["name"] for t in env.tools())


def _length(completions, **_kwargs) -> list[float]:
    return [len(str(c)) / 100 for c in completions]


def test_two_trl_grpo_steps_through_environment_factory_change_parameters(tiny_model_dir, tmp_path):
    """TRL's own GRPOTrainer plays the code env through environment_factory. The random tiny model earns the
    env's reward on no task (all equal: no advantage, no gradient), so a length reward gives the steps a signal;
    env_reward is TRL's logged reward column all the same."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(
        model=model, processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        reward_funcs=[env_reward, _length],
        train_dataset=task_dataset("code", "train", limit=2, generate=2),
        environment_factory=environment_factory("code", generate=2),
        args=GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=24, learning_rate=1e-2, report_to=[], use_cpu=True,
                        logging_steps=1, save_strategy="no"),
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert all("rewards/env_reward/mean" in row for row in trainer.state.log_history[:2])
    assert all(e._score is not None and e._env.task.id.startswith("gen-train-") for e in trainer.environments)
    assert [n for n, p in model.named_parameters() if torch.equal(p, before[n])] == []


def _readme_trl_script() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### From TRL's GRPOTrainer", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_trl_script_is_the_example():
    assert _readme_trl_script() == (ROOT / "examples" / "trl_grpo.py").read_text()


def test_the_readme_trl_script_runs_two_steps_on_a_cpu(tiny_model_dir, tmp_path):
    """The README's script itself, as a user runs it on a machine without a GPU (the suite's): TRL's default
    bf16=True had stopped it with "Your setup doesn't support bf16/gpu". Only the episode length is shortened."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRL_EXPERIMENTAL_SILENCE": "1"}
    script = [sys.executable, str(ROOT / "examples" / "trl_grpo.py"), str(tiny_model_dir), "--max-steps", "2",
              "--max-completion-length", "32"]
    result = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((tmp_path / "runs" / "trl-code" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and "'rewards/env_reward/mean'" in result.stdout


def test_a_row_of_another_split_or_options_is_a_clear_error():
    environment = environment_factory("sql", format="tool_call")()
    with pytest.raises(ValueError, match="task 'nope' is not in env 'sql' split 'test'.*task_dataset"):
        environment.reset(task_id="nope", split="test", prompt=[])


def test_an_argument_named_self_reaches_the_env_as_a_bad_argument():
    environment = environment_factory("code", generate=1)()
    environment.reset(**task_dataset("code", "test", generate=1)[0])
    assert environment.code_interpreter(self="print(1)") == "Error: code_interpreter needs a non-empty string argument 'code'."
