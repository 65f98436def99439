"""Characters per token of each env family's first prompt under a tiny tokenizer: the household-only one the tiny
model always had before issue 40, and one built for the env itself (`build_tiny_model(..., envs=[...])`).

A prompt is the first task's system + first user message(s) with the env's tool schemas, rendered by the
tokenizer's chat template with the generation prompt: what the model reads before its first reply. The tiny model
has 4,096 positions (`tiny_model.py` MAX_POSITIONS), so a prompt must be well inside that.

    .venv/bin/python benchmarks/tiny_tokenizer.py --data ../../shared/data     # from the worktree
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any


def cases(data: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, env, options) of one first prompt per family (tau2 retail / airline from the shared data)."""
    return [
        ("household", "household", {"format": "tool_call"}),
        ("retail", "service", {"domain": "retail", "data_dir": str(data / "tau2/retail")}),
        ("airline", "service", {"domain": "airline", "data_dir": str(data / "tau2/airline")}),
        ("desk", "service", {"domain": "desk"}),
        ("sql", "sql", {"format": "react_sql"}),
        ("dbbench", "dbbench", {"data": str(data / "dbbench/dev.jsonl")}),
        ("bfcl", "bfcl", {}),
        ("code", "code", {"generate": 8}),
    ]


def first_prompt(env_name: str, options: dict[str, Any]) -> tuple[list[dict], list[dict] | None]:
    from turnforge.envs.base import get_env_spec, load_tasks, make_env

    split = "test" if "test" in get_env_spec(env_name).splits else "train"
    task = load_tasks(env_name, split, limit=1, **options)[0]
    env = make_env(env_name, **options)
    try:
        return [m.to_dict() for m in env.reset(task)], env.tools()
    finally:
        env.close()


def measure(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[int, int]:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return len(text), len(tokenizer(text, add_special_tokens=False)["input_ids"])


def main() -> None:
    from transformers import AutoTokenizer

    from turnforge.tiny_model import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../../shared/data"), help="the shared data folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        household = AutoTokenizer.from_pretrained(build_tiny_model(Path(tmp) / "household"))
        print("| prompt | characters | household tokenizer: tokens (chars/token) | own env's tokenizer: tokens "
              "(chars/token) | vocab | build s |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, env_name, options in cases(args.data):
            messages, tools = first_prompt(env_name, options)
            start = time.perf_counter()
            own = AutoTokenizer.from_pretrained(build_tiny_model(Path(tmp) / label, envs=[(env_name, options)]))
            build_s = time.perf_counter() - start
            chars, before = measure(household, messages, tools)
            _, after = measure(own, messages, tools)
            print(f"| {label} | {chars:,} | {before:,} ({chars / before:.2f}) | {after:,} ({chars / after:.2f}) "
                  f"| {len(own):,} | {build_s:.0f} |")


if __name__ == "__main__":
    main()
