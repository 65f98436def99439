"""`turnforge sandbox ...`: run Python files exactly as the code env's tool runs model-written code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

sandbox_app = typer.Typer(help="The code env's sandbox (a pool of isolated Python workers).", no_args_is_help=True)


@sandbox_app.command("run")
def run(
    files: Annotated[list[Path], typer.Argument(help="Python files, run one after another")],
    timeout: Annotated[float, typer.Option(help="wall-clock seconds per file (also caps its CPU time)", min=0.1)] = 10.0,
    memory_mb: Annotated[int, typer.Option(help="address space per process, MiB", min=64)] = 1024,
) -> None:
    """Run each FILE through one worker pool; print one JSON object per file (isolation, stdout, stderr, exit_code,
    ...). `isolation` is the mode that ran: namespaces, or rlimits where the host allows no more (docs/security.md)."""
    from turnforge.envs.code.sandbox import SandboxLimits, SandboxPool

    programs = [(str(path), _read(path)) for path in files]  # (all read first: a bad file stops before any run)
    limits = SandboxLimits(timeout_s=timeout, cpu_s=timeout, memory_mb=memory_mb)
    try:
        with SandboxPool(size=1, limits=limits) as pool:
            for name, code in programs:
                result = pool.run(code)
                typer.echo(json.dumps({"file": name, "isolation": pool.isolation, **result.as_dict()}))
    except RuntimeError as e:  # a worker that cannot start (or be replaced): its own reason, on one line
        _fail(str(e), 1)


def _read(path: Path) -> str:
    if not path.exists():
        _fail(f"no such file: {path}", 2)
    if not path.is_file():
        _fail(f"not a file: {path} (give Python files)", 2)
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        _fail(f"cannot read {path}: {e.strerror or e}", 2)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
