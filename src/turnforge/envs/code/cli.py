"""`turnforge sandbox ...`: run Python files exactly as the code env's tool runs model-written code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

sandbox_app = typer.Typer(help="The code env's sandbox (a pool of isolated Python workers).", no_args_is_help=True)


@sandbox_app.command("run")
def run(
    files: Annotated[list[Path], typer.Argument(help="Python files, run one after another")],
    timeout: Annotated[float, typer.Option(help="wall-clock seconds per file (also caps its CPU time)", min=0.1)] = 10.0,
    memory_mb: Annotated[int, typer.Option(help="address space per process, MiB", min=64)] = 1024,
) -> None:
    """Run each FILE through one worker pool; print one JSON object per file (stdout, stderr, exit_code, ...)."""
    from turnforge.envs.code.sandbox import SandboxLimits, SandboxPool

    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        typer.echo(f"error: no such file: {', '.join(missing)}", err=True)
        raise typer.Exit(2)
    limits = SandboxLimits(timeout_s=timeout, cpu_s=timeout, memory_mb=memory_mb)
    with SandboxPool(size=1, limits=limits) as pool:
        for path in files:
            code = path.read_text(encoding="utf-8", errors="replace")
            result = pool.run(code)
            typer.echo(json.dumps({"file": str(path), **result.as_dict()}), nl=True)
