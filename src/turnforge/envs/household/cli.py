"""`turnforge household ...`: commands specific to the household environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

household_app = typer.Typer(help="Household environment tools (ALFWorld export).", no_args_is_help=True)


@household_app.command("export")
def export(
    out: Annotated[Path, typer.Option(help="output folder: OUT/<task_id>/{game.tw-pddl,traj_data.json}")],
    split: Annotated[str, typer.Option(help="split to export: train, valid_seen, test")] = "test",
    n: Annotated[int, typer.Option(help="the first N tasks of the split (the same as `eval --tasks N`)")] = 20,
    seed: Annotated[int, typer.Option(help="generator seed (env option seed)")] = 0,
) -> None:
    """Write household tasks as ALFWorld game files that alfworld's AlfredTWEnv loads."""
    from turnforge.envs.base import load_tasks
    from turnforge.envs.household.export import export_games
    from turnforge.rundir import check_out_dir, check_outside_runs

    try:
        check_out_dir(out)
        check_outside_runs(out)
        tasks = load_tasks("household", split, limit=n, seed=seed)
        paths = export_games(tasks, out)
    except (ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {len(paths)} ALFWorld games to {out}")
