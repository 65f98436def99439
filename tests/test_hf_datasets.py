"""`turnforge data export|import`: a run's trajectories and DPO pairs as Hugging Face datasets, and back, unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from typer.testing import CliRunner

from turnforge.cli import app
from turnforge.data.dpo_pairs import Pair, save_pairs
from turnforge.data.hf_datasets import export_dataset, import_dataset, schema_records
from turnforge.data.sft import record_examples
from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import make_policy
from turnforge.rollout import run_episodes

OUTS = ("dataset", "data.parquet", "data.jsonl")


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def service_episodes(tmp_path_factory) -> Path:
    """Expert episodes of the service env: tool schemas, tool messages with call ids (~0.5 s)."""
    tasks = load_tasks("service", "test", limit=2)
    episodes = run_episodes(make_policy("expert"), lambda: make_env("service"), tasks, 1)
    return _jsonl(tmp_path_factory.mktemp("service") / "episodes.jsonl", [e.to_dict() for e in episodes])


def _conversations(tmp_path: Path) -> Path:
    """Conversational records whose structured tool calls have different argument keys (Arrow fills the gaps)."""
    def call(name, args):
        return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1", "function": {"name": name, "arguments": args}}]}

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    return _jsonl(tmp_path / "conv.jsonl", [
        {"messages": [{"role": "user", "content": "a"}, call("f", {"x": 1}), {"role": "tool", "content": "1", "tool_call_id": "c1"},
                      {"role": "assistant", "content": "done"}], "tools": tools},
        {"messages": [{"role": "user", "content": "b"}, call("g", {"y": [1, 2], "z": "s"}), {"role": "assistant", "content": "ok"}]},
    ])


def _pairs(service_episodes: Path) -> list[Pair]:
    env, pairs = make_env("household"), []
    for task in load_tasks("household", "test", limit=2):
        history = [m.to_dict() for m in env.reset(task)]
        pairs.append(Pair(history, env.format.render(env.expert_reply()), "ACTION: fly", "invalid_action", None, task.id, 0, "expert"))
    service = json.loads(service_episodes.read_text().splitlines()[0])
    pairs.append(Pair(service["messages"][:3], "Let me look that up.", "Done!", "task_succeeded_negative", service["tools"],
                      service["task_id"], 1, "sibling"))
    return pairs


@pytest.mark.parametrize("out_name", OUTS)
def test_trajectories_export_and_import_unchanged(quickstart_run, service_episodes, tmp_path, out_name):
    run = quickstart_run[0]
    sources = [run / "stages/01-collect/trajectories.jsonl", run / "eval/sft/episodes.jsonl", service_episodes,
               _conversations(tmp_path)]
    for k, source in enumerate(sources):
        expected = schema_records(source, "trl-sft")
        exported = export_dataset(source, "trl-sft", tmp_path / str(k) / out_name)
        assert schema_records(exported, "trl-sft") == expected, source
        imported, n = import_dataset(exported, "trl-sft", tmp_path / str(k) / "imported.jsonl")
        assert n == len(expected) and [json.loads(line) for line in imported.read_text().splitlines()] == expected
    assert expected[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert json.loads(expected[0]["tools"])[0]["function"]["name"] == "f" and expected[1]["tools"] is None


def test_an_exported_sft_dataset_is_a_datasets_folder_that_sft_reads(quickstart_run, tmp_path):
    run = quickstart_run[0]
    folder = export_dataset(run / "stages/01-collect/trajectories.jsonl", "trl-sft", tmp_path / "sft")
    loaded = datasets.load_from_disk(str(folder))
    assert loaded.column_names == ["messages", "tools"] and len(loaded) == 12
    imported, _ = import_dataset(folder, "trl-sft", tmp_path / "sft.jsonl")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "models/tiny")
    record = json.loads(imported.read_text().splitlines()[0])
    (example,) = record_examples("row 0", record, tokenizer, None)
    assert any(example.completion_mask)


@pytest.mark.parametrize("schema", ["trl-preference", "roundwise-dpo"])
@pytest.mark.parametrize("out_name", OUTS)
def test_pairs_export_and_import_unchanged(service_episodes, tmp_path, schema, out_name):
    source = save_pairs(_pairs(service_episodes), tmp_path / "pairs.jsonl")
    expected = schema_records(source, schema)
    exported = export_dataset(source, schema, tmp_path / out_name)
    assert schema_records(exported, schema) == expected
    imported, _ = import_dataset(exported, schema, tmp_path / "imported.jsonl")
    assert [json.loads(line) for line in imported.read_text().splitlines()] == expected
    keys = {"prompt", "chosen", "rejected", "tools", "reason"} if schema == "trl-preference" else {
        "messages", "chosen", "rejected", "reason", "tools", "task_id", "turn", "chosen_from"}
    assert set(expected[0]) == keys and expected[-1]["reason"] == "task_succeeded_negative"


def test_cli_export_then_import_and_a_bad_schema(service_episodes, tmp_path):
    source = save_pairs(_pairs(service_episodes), tmp_path / "pairs.jsonl")
    runner = CliRunner()
    result = runner.invoke(app, ["data", "export", str(source), "--format", "trl-preference", "--out", str(tmp_path / "pairs")])
    assert result.exit_code == 0, result.output
    assert datasets.load_from_disk(str(tmp_path / "pairs")).column_names == ["prompt", "chosen", "rejected", "tools", "reason"]
    result = runner.invoke(app, ["data", "import", str(tmp_path / "pairs"), "--schema", "roundwise-dpo", "--out", str(tmp_path / "back.jsonl")])
    assert result.exit_code == 0 and "wrote 3 records" in result.output
    back = [json.loads(line) for line in (tmp_path / "back.jsonl").read_text().splitlines()]
    assert [(r["chosen"], r["reason"]) for r in back] == [(p.chosen, p.reason) for p in _pairs(service_episodes)]
    result = runner.invoke(app, ["data", "export", str(source), "--format", "sharegpt", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "unknown schema 'sharegpt'" in result.output
