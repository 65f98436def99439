"""The code environment: math and programming problems with one sandboxed `code_interpreter` tool.

    turnforge sandbox run a.py b.py --timeout 5
    turnforge eval --env code --env-opt generate=200 --policy expert --out runs/code-gold
    turnforge eval --env code --env-opt data=problems.jsonl --policy hf --model M --samples 8 --temperature 1.0 --out runs/math

The seed is DemyAgent's GRPO-TCR agent (Open-AgentRL `recipe/demystify`, benchmarks.md §5). The sandbox
(sandbox.py) and what it isolates on which platform: docs/security.md. math-verify checks need
`pip install 'turnforge[code]'`; `math_verify=strict` (the seed's exact boxed match) does not.
"""

from __future__ import annotations

from turnforge.envs.base import MAX_GENERATED, EnvOption, EnvSpec, register_env
from turnforge.envs.code.checking import MATH_MODES
from turnforge.envs.code.metrics import code_metrics
from turnforge.envs.code.problems import CATEGORIES, SPLITS, generate, load_file
from turnforge.types import Task

__all__ = ["load_tasks", "make_code_env"]


def load_tasks(split: str, limit: int | None = None, *, data: str, seed: int, **options) -> list[Task]:
    """`data=FILE` lines (every split gets them all), else `generate=N` problems of the split (options resolved)."""
    n = options["generate"]
    if data:
        return load_file(data, split)[:limit]
    if n < 1:
        raise ValueError("code env: give --env-opt data=problems.jsonl or --env-opt generate=N")
    return generate(n if limit is None else min(n, limit), split, seed)  # problem i is the same for any n


def make_code_env(**options):
    from turnforge.envs.code.env import CodeEnv

    return CodeEnv(**options)


SPEC = register_env(
    EnvSpec(
        name="code",
        description="math (boxed answers) and programming (tests) problems with a sandboxed code_interpreter tool",
        factory=make_code_env,
        load_tasks=load_tasks,
        categories=CATEGORIES,
        splits=SPLITS,
        split_size=lambda _split, options: None if options["data"] else options["generate"] or None,
        env_metrics=code_metrics,
        corpus_options=("data", "generate", "seed"),
        options=[
            EnvOption("format", str, "tool_call", "Hermes <tool_call> JSON (the seed's multi_turn.format=hermes)",
                      ("tool_call",)),
            EnvOption("data", str, "", "problems JSONL (id, problem, answer | tests); every split gets all lines"),
            EnvOption("generate", int, 0, "N built-in generated problems per split (math and code; built in memory)",
                      at_least=0, at_most=MAX_GENERATED),
            EnvOption("seed", int, 0, "seed of the generated problems"),
            EnvOption("math_verify", str, "math_verify", "math check: math-verify, or the seed's strict boxed match",
                      MATH_MODES),
            EnvOption("binary", bool, False, "code score 1 only when every test passes (else the fraction)"),
            EnvOption("max_turns", int, 16, "replies per episode (the seed's grpo_tcr_qwen3_4b.sh: max_assistant_turns = 16)", at_least=1),
            EnvOption("timeout", float, 10.0, "sandbox wall-clock seconds per run", at_least=0.1, at_most=600),
            EnvOption("memory_mb", int, 1024, "sandbox address space per process, MiB", at_least=64),
            EnvOption("workers", int, 2, "sandbox worker processes", at_least=1, at_most=64),
            EnvOption("max_output_chars", int, 4096, "tool output shown to the model", at_least=64),
        ],
    )
)
