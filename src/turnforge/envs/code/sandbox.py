"""A pool of pre-started sandbox workers that run model-written Python under the kernel's limits.

    pool = SandboxPool(size=4, limits=SandboxLimits(timeout_s=5))
    result = pool.run("print(2**10)")          # RunResult(stdout='1024\\n', exit_code=0, ...)
    turnforge sandbox run a.py b.py --timeout 5  # the same, one JSON line per file

Each worker (sandbox_worker.py) is a Python process started once; every call runs in a fresh child forked
from it (from its *forker*, a pristine copy made once), set up ahead of the call, so a call costs about a
millisecond, not an interpreter start, and nothing of one call is visible to the next. What holds where
(docs/security.md):

- `namespaces` isolation (root and `unshare` available — the Docker/CI case): each worker lives in its own
  network namespace (no interface but a downed loopback: no connection anywhere, 127.0.0.1 included) and
  mount namespace (fresh tmpfs over /tmp, /var/tmp, /dev/shm, /run/lock, wiped after every call; /root and
  /home replaced by empty tmpfs; the interpreter's own directories bound back wherever they lie; every mount
  but the private tmpfs read-only); each call runs as
  the worker's own unprivileged uid (so RLIMIT_NPROC counts only that call's processes, the host's files
  readable only by root — /etc/shadow, /proc/<pid>/environ of other processes — stay closed, and the
  parent cannot be signalled), and every process of that uid is killed when the call ends.
- `rlimits` isolation (anything else): the same rlimits, but no network namespace — socket creation is
  refused by an audit hook inside Python only (a C extension or ctypes could get around it), no private
  /tmp, no separate uid, so no process-count limit, and background processes are killed by process group
  only. The pool says which mode it runs in (`SandboxPool.isolation`); nothing pretends.

A call that passes its wall-clock limit is killed and reported (`timed_out`); a worker that stops
answering is killed and replaced; `run` always returns.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import cache

# Run as a file, not `-m turnforge...`: importing the package (envs, policies, asyncio) would double the
# worker's memory, and every call's fork and exit copy and free its page tables (~1 ms at 24 MB, ~0.35 at 10).
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")
START_TIMEOUT_S = 30.0
GRACE_S = 5.0  # how long past a call's own timeout the worker may take before it is presumed stuck
_slots = itertools.count()


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. Defaults follow the seed's SandboxFusion settings where it has them."""

    timeout_s: float = 10.0
    """Wall-clock seconds per call (SandboxFusion tool: 30; a call's own `timeout` overrides it)."""
    cpu_s: float = 10.0
    """CPU seconds per call, all threads together (RLIMIT_CPU); capped at the call's timeout."""
    memory_mb: int = 1024
    """Address space per process (RLIMIT_AS); the seed's SandboxFusion tool allows 2048."""
    processes: int = 32
    """Processes and threads of one call (RLIMIT_NPROC on the call's own uid; namespaces mode only)."""
    file_mb: int = 16
    """Largest file a call may write (RLIMIT_FSIZE)."""
    open_files: int = 64
    max_output_bytes: int = 64 * 1024
    """Kept of stdout and of stderr each; the rest is read and dropped (`truncated`)."""
    tmpfs_mb: int = 256
    """Size of the private /tmp (namespaces mode): all a call's files together."""


@dataclass
class RunResult:
    stdout: str
    stderr: str
    exit_code: int
    """The program's exit status; -N when killed by signal N."""
    timed_out: bool = False
    """Killed at the wall-clock or CPU-time limit."""
    killed: bool = False
    """Ended by a signal (a limit, or the program's own doing)."""
    truncated: bool = False
    """stdout or stderr was longer than `max_output_bytes` and was cut."""
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def as_dict(self) -> dict:
        return asdict(self)


@cache
def isolation_mode() -> str:
    """`namespaces` where a root process can `unshare` network and mount namespaces, else `rlimits`."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "rlimits"
    try:
        probe = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "--", "true"],
                               capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "rlimits"
    return "namespaces" if probe.returncode == 0 else "rlimits"


class _Worker:
    """One worker process and its slot uid."""

    def __init__(self, limits: SandboxLimits, mode: str) -> None:
        slot = next(_slots) % 256
        self.uid = 100_000 + (os.getpid() % 20_000) * 256 + slot if mode == "namespaces" else None
        self.scratch = tempfile.mkdtemp(prefix="turnforge-sandbox-")
        cfg = {
            "uid": self.uid, "timeout_s": limits.timeout_s, "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_mb << 20, "processes": limits.processes,
            "file_bytes": limits.file_mb << 20, "open_files": limits.open_files,
            "max_output_bytes": limits.max_output_bytes, "tmpfs_mb": limits.tmpfs_mb,
            "private_tmp": mode == "namespaces", "block_network": mode != "namespaces", "scratch_dir": self.scratch,
        }
        command = [sys.executable, WORKER_SCRIPT, json.dumps(cfg)]
        if mode == "namespaces":
            command = ["unshare", "--net", "--mount", "--propagation", "private", "--", *command]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}
        errors = os.path.join(self.scratch, "worker.err")  # (the worker writes there only when it fails)
        with open(errors, "wb") as err:
            self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         env=env, start_new_session=True, text=True)
        hello = self._read_line(time.monotonic() + START_TIMEOUT_S)
        self.hello = json.loads(hello) if hello else {}
        if not self.hello.get("ready"):  # (its stdout ended: it has exited, all it wrote is there)
            why = _last_line(errors) or f"no answer within {START_TIMEOUT_S:g} s"
            self.kill()
            raise RuntimeError(f"a sandbox worker did not start ({mode} isolation): {why} (docs/security.md)")

    def run(self, code: str, stdin: str, timeout: float) -> RunResult | None:
        """The call's result, or None when the worker died or stopped answering (then it is killed)."""
        try:
            self.proc.stdin.write(json.dumps({"code": code, "stdin": stdin, "timeout": timeout}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.kill()
            return None
        line = self._read_line(time.monotonic() + timeout + GRACE_S)
        if line is None:
            self.kill()
            return None
        return RunResult(**json.loads(line))

    def _read_line(self, deadline: float) -> str | None:
        fd = self.proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        line = self.proc.stdout.readline()
        return line or None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker and every process of its uid (a run it left behind)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 9)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):  # (left open, each was a ResourceWarning at exit)
            with contextlib.suppress(OSError):
                pipe.close()
        if self.uid is not None:
            subprocess.run(["/bin/sh", "-c", _KILL_ALL], user=self.uid, group=self.uid, extra_groups=[],
                           env={}, timeout=30, check=False, capture_output=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _last_line(path: str) -> str:
    """The last line a failed worker wrote (its error: the end of a traceback, or the interpreter's complaint)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else ""


# As the slot uid: all its processes (a few rounds: kill(-1) still counts zombies that init has to reap).
_KILL_ALL = "for i in 1 2 3 4 5 6 7 8 9 10; do kill -9 -1 2>/dev/null || exit 0; sleep 0.02; done"


class SandboxPool:
    """`size` pre-started workers; `run` takes an idle one (waiting if none is) and gives it back after."""

    def __init__(self, size: int = 2, limits: SandboxLimits | None = None, isolation: str | None = None) -> None:
        """`isolation`: None = the strongest this host allows (`isolation_mode()`); "rlimits" forces the fallback."""
        if size < 1:
            raise ValueError(f"a sandbox pool needs at least 1 worker, got {size}")
        if isolation not in (None, "rlimits", "namespaces"):
            raise ValueError(f"isolation must be rlimits or namespaces, got {isolation!r}")
        if isolation == "namespaces" and isolation_mode() != "namespaces":
            raise ValueError("namespaces isolation needs root and a working `unshare --net --mount` (docs/security.md)")
        self.limits = limits or SandboxLimits()
        self.isolation = isolation or isolation_mode()
        self.size = size
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        for _ in range(size):
            self._add_worker()

    @property
    def bound_dirs(self) -> list[str]:
        """The host directories under /tmp, /root, /home, ... that the sandbox binds back, read-only, for its
        interpreter (its prefixes, sys.path, the worker's files): all a call sees of them (namespaces mode)."""
        with self._lock:
            return self._workers[0].hello["bound_dirs"] if self._workers else []

    def _add_worker(self) -> None:
        worker = _Worker(self.limits, self.isolation)
        with self._lock:
            self._workers.append(worker)
        self._idle.put(worker)

    def run(self, code: str, stdin: str = "", timeout: float | None = None) -> RunResult:
        """Run `code` as a program (stdin given, stdout/stderr captured); never raises for what the code does."""
        if self._closed:
            raise RuntimeError("this sandbox pool is closed")
        timeout = float(timeout if timeout is not None else self.limits.timeout_s)
        worker = self._idle.get()
        start = time.monotonic()
        result = worker.run(code, stdin, timeout)
        if result is not None and worker.alive():
            self._idle.put(worker)
            return result
        with self._lock:
            self._workers.remove(worker)
        worker.kill()
        self._add_worker()  # the pool replaces a dead worker before the caller hears about it
        wall = round(time.monotonic() - start, 4)
        if result is not None:
            return result
        return RunResult("", "sandbox: the run's worker stopped answering and was replaced", -9,
                         timed_out=wall >= timeout, killed=True, wall_s=wall)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_shared: dict[tuple, SandboxPool] = {}
_shared_lock = threading.Lock()


def shared_pool(size: int = 2, limits: SandboxLimits | None = None) -> SandboxPool:
    """One pool per (size, limits) for the whole process (every env of a run shares it); closed at exit."""
    key = (size, limits or SandboxLimits())
    with _shared_lock:
        if key not in _shared:
            _shared[key] = SandboxPool(size, key[1])
        return _shared[key]


@atexit.register
def _close_shared() -> None:
    for pool in _shared.values():
        pool.close()
