"""The `turnforge` command. Thin: it parses options and calls the library; the work lives elsewhere.

    turnforge quickstart --out runs/qs
    turnforge run recipes/quickstart.toml --out runs/qs --set stages.sft.learning_rate=5e-4
    turnforge envs
    turnforge eval --env household --policy expert --split test --tasks 200 --out runs/expert
    turnforge eval --env household --policy random --split test --tasks 200 --samples 4 --out runs/random
    turnforge eval --env household --policy replay:runs/expert/episodes.jsonl --out runs/replayed

Bad input ends with a one-line `error: ...` on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from turnforge.envs.base import list_envs
from turnforge.envs.household.cli import household_app
from turnforge.eval.runner import run_eval
from turnforge.eval.table import print_summary
from turnforge.pipeline import print_comparison, run_recipe
from turnforge.policies.base import BackendNotInstalled
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits

app = typer.Typer(
    help="Train and evaluate small LLM agents on multi-turn, tool-using environments.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(household_app, name="household")

USAGE_ERROR = 2  # the exit code click uses for bad usage; scripts can tell it from a crash (1)


def _user_errors(command: Callable) -> Callable:
    """Turn the library's input errors into `error: ...` + exit 2 instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (ValueError, NotImplementedError, FileNotFoundError, BackendNotInstalled) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(USAGE_ERROR) from None

    return wrapper


def parse_env_options(pairs: list[str]) -> dict[str, str]:
    """["hints=true", "grammar=0.4"] -> {"hints": "true", "grammar": "0.4"} (the env coerces the types)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-opt {pair!r} is not KEY=VALUE (e.g. --env-opt hints=true)")
        options[key.strip()] = value.strip()
    return options


@app.command()
def envs() -> None:
    """List the environments with their splits, categories and options."""
    console = Console()
    for spec in list_envs():
        # Text, not markup: descriptions hold brackets such as "turnforge[alfworld]".
        console.print(Text.assemble((spec.name, "bold"), f" — {spec.description}"))
        console.print(Text(f"  splits: {', '.join(spec.splits)}\n  categories: {', '.join(spec.categories)}"))
        options = Table("--env-opt", "default", "choices", "help", box=box.SIMPLE, title_justify="left")
        for o in spec.options:
            options.add_row(
                *(Text(cell) for cell in (o.name, repr(o.default), " | ".join(o.choices or ()), o.help))
            )
        console.print(options)


@app.command("eval")
@_user_errors
def eval_command(
    env: Annotated[str, typer.Option(help="Environment name (see `turnforge envs`).")],
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")],
    env_opt: Annotated[list[str] | None, typer.Option(help="Env option KEY=VALUE; repeatable.")] = None,
    policy: Annotated[
        str, typer.Option(help="expert | random | replay:FILE | hf | vllm | openai:URL.")
    ] = "expert",
    model: Annotated[str | None, typer.Option(help="Model id or path, for the model backends.")] = None,
    split: Annotated[str, typer.Option(help="Task split.")] = "test",
    tasks: Annotated[int | None, typer.Option(help="First N tasks of the split (default: all).")] = None,
    samples: Annotated[int, typer.Option(help="Episodes per task (for pass@k / pass^k).")] = 1,
    seed: Annotated[int, typer.Option(help="Seed for sampling and the random policy.")] = 0,
    max_turns: Annotated[
        int | None, typer.Option(help="Turn limit per episode (default: the env's).")
    ] = None,
    limit_open: Annotated[int, typer.Option(help="Episodes open at once (the generate batch).")] = 64,
) -> None:
    """Evaluate a policy; writes OUT/episodes.jsonl and OUT/summary.json and prints the table."""
    summary = run_eval(
        env=env,
        env_options=parse_env_options(env_opt or []),
        policy_spec=policy,
        split=split,
        n_tasks=tasks,
        samples=samples,
        seed=seed,
        out_dir=out,
        model=model,
        limits=RolloutLimits(max_turns=max_turns, max_open=limit_open),
    )
    print_summary(summary)
    typer.echo(f"wrote {out / 'summary.json'} and {out / 'episodes.jsonl'}")


SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe value: KEY.PATH=VALUE, e.g. stages.sft.epochs=2."),
]
ModelOption = Annotated[str | None, typer.Option(help="Base model (model.name): tiny, a path or a hub id.")]


@app.command("run")
@_user_errors
def run_command(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a packaged recipe's name: quickstart.")],
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")],
    model: ModelOption = None,
    set_: SetOption = None,
    restart_from: Annotated[
        str | None, typer.Option(help="Redo this stage (id, name or number) and every later one.")
    ] = None,
    check: Annotated[bool, typer.Option(help="Validate the recipe, print it resolved, run nothing.")] = False,
) -> None:
    """Run a recipe's stages in OUT (resumable); prints the evaluations side by side."""
    loaded = load_recipe(recipe, overrides=set_ or [], model=model)
    if check:
        typer.echo(loaded.to_toml(), nl=False)
        return
    summary = run_recipe(loaded, out, restart_from=restart_from)
    print_comparison(summary)
    typer.echo(f"wrote {out / 'summary.json'} and {out / 'report.md'}")


@app.command()
@_user_errors
def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")] = Path(
        "runs/quickstart"
    ),
    model: ModelOption = None,
    set_: SetOption = None,
) -> None:
    """Tiny model on CPU in minutes: expert data -> SFT -> evaluation before/after (`run quickstart`)."""
    run_command("quickstart", out=out, model=model, set_=set_, restart_from=None, check=False)
