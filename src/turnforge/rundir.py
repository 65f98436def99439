"""A run directory is used by one process at a time (design.md §7): `with locked(out):` holds `OUT/.lock`.

The lock is an advisory `flock` on that file, so the operating system drops it when its process dies: a lock
left by a killed run is simply taken over by the next one, with nothing to clean up. The file says which
process holds it, for the message the second process prints. Under `accelerate launch` the main process holds
it for all of them (`turnforge.scale.processes`); the others wait for its outcome and fail with it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from turnforge.scale.processes import main_process_result

LOCK_FILE = ".lock"


def check_out_dir(out: Path) -> None:
    """An output folder must be a folder (or not exist yet)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; give a folder for the run's results")


@contextmanager
def locked(out: str | Path) -> Iterator[Path]:
    """Create `out` if needed and hold its lock; a second process fails at once, saying who holds it."""
    out = Path(out)
    check_out_dir(out)
    held: list = []
    main_process_result(lambda: held.append(_acquire(out)))  # the other launched processes hold nothing
    try:
        yield out
    finally:
        for handle in held:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


def _acquire(out: Path):
    """The open, flock-ed lock file of `out` (a ValueError naming the holder when another process has it)."""
    out.mkdir(parents=True, exist_ok=True)
    handle = (out / LOCK_FILE).open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(
            f"{out} is in use by {holder}; wait for it to finish, or give another --out"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"turnforge pid {os.getpid()}\n")
    handle.flush()
    return handle
