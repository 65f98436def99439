"""Checker calls (math-verify, BFCL's MathAPI) run in one shared pool of warm child processes.

    result = call_isolated("turnforge.envs.code.checking", "MathVerifier", "verify", {"answer": "2", "reply": r})

Why a child: a reply may ask `power(base=10, exponent=10**12)` of BFCL's MathAPI, which computes in Python big
integers for minutes while holding the GIL (no thread timeout can stop it); math-verify times itself out with
`signal.alarm`, which raises off the main thread (envs step in worker threads). A child runs
`getattr(module.class_name(), method)(**arguments)`, one pickled request at a time over its stdin/stdout, and
keeps one instance per class (the classes are stateless).

Why one shared pool (issue 40): a child started per open episode imported math-verify (sympy, ~1.5 CPU s) 64
times at once, and on a loaded machine every check ran past its wall clock and was graded wrong. The pool keeps
at most `pool_size()` children, started on demand and kept warm (each imports a module once, at its first call),
shared by every env and thread of the process and closed at its exit; a call waits for a free child.

Limits, and what each outcome is (the rule for every checker: load never becomes a verdict):

- CPU seconds (`cpu_s`, RLIMIT_CPU set around the call, after the import) and memory (`memory_bytes`,
  RLIMIT_AS): the call's own cost, the same on an idle or a busy machine. A call past either comes back with
  `over_budget` set (the child is killed by SIGXCPU, or the call raised MemoryError): a property of the call
  (a model-written runaway), which the caller may score.
- Wall seconds (`wall_s`, generous: WALL_S): a child that has not answered by then is hung or starved by the
  machine; it is killed and replaced, and the call raises `CheckerUnavailable`, as it does when the child dies
  any other way (a crash, the OOM killer). No verdict exists: the env lets it propagate, which ends only that
  episode with `StopReason.env_error` (counted, redone on resume, failing eval beyond `--max-env-errors`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import math
import os
import pickle
import queue
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

CPU_S = 5.0
MEMORY_BYTES = 1 << 30  # 1 GiB of address space (Python + bfcl-eval's math module need ~100 MiB)
# A check that may use CPU_S of CPU and has not answered after WALL_S is starved beyond any sensible load (or
# hung without using CPU): 120 s is 24x the default CPU budget and ~1000x a typical math-verify check (~0.1 s).
WALL_S = 120.0
MAX_POOL_SIZE = 8
_HEADER = struct.Struct("<I")


class CheckerUnavailable(RuntimeError):
    """A checker call gave no answer (hung, starved, crashed): an env error of the episode, never a verdict."""


@dataclass
class IsolatedResult:
    """What a call did: returned `value`, raised (`error` = its message), or used more than its budget."""

    value: Any = None
    error: str | None = None
    over_budget: str | None = None  # "cpu" or "memory": the call's own cost, independent of the machine's load


def pool_size() -> int:
    """min(usable cores, MAX_POOL_SIZE): checks are single-threaded CPU work, so more children than cores only
    queue inside the kernel instead of here; past 8, each child (~150 MB with sympy) costs memory that the
    checks (milliseconds each) do not need."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_POOL_SIZE))


def call_isolated(module: str, class_name: str, method: str, arguments: dict[str, Any], cpu_s: float = CPU_S,
                  memory_bytes: int = MEMORY_BYTES, wall_s: float = WALL_S) -> IsolatedResult:
    """`getattr(module.class_name(), method)(**arguments)` in a warm child of the shared pool.

    Raises CheckerUnavailable when the child does not answer within `wall_s` or dies other than by its budget.
    """
    return shared_pool().call((module, class_name, method, arguments, cpu_s, memory_bytes), wall_s)


class _Child:
    """One child process; `call` sends a request and waits for its answer at most `wall_s`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnforge.envs.isolation"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    def call(self, request: tuple, wall_s: float) -> IsolatedResult:
        what = f"{request[1]}.{request[2]}"
        try:
            _send(self.proc.stdin, request)
            reply = _receive(self.proc.stdout, time.monotonic() + wall_s)
        except (BrokenPipeError, EOFError, OSError):  # the child ended: wait for its status (SIGXCPU or else)
            self.close()
            if self.proc.returncode == -signal.SIGXCPU:  # the child's own CPU limit: the call's cost
                return IsolatedResult(over_budget="cpu")
            raise CheckerUnavailable(f"the {what} checker process ended without an answer (exit status "
                                     f"{self.proc.returncode}): no verdict") from None
        if reply is None:
            self.close(kill=True)
            raise CheckerUnavailable(f"the {what} checker gave no answer within {wall_s:g} s (hung, or the machine "
                                     "is overloaded): no verdict; re-run the same command to redo this episode")
        kind, payload = reply
        if kind == "ok":
            return IsolatedResult(value=payload)
        return IsolatedResult(over_budget="memory") if kind == "memory" else IsolatedResult(error=payload)

    def close(self, kill: bool = False) -> None:
        """End the child and close its pipes: an idle child exits at the end of its input (killed if it does not
        within a second); a hung one (`kill`) is killed at once."""
        if kill and self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(OSError):  # a write cut short by the child's end leaves bytes to flush
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


class ChildPool:
    """At most `size` children; a call takes an idle one (or starts one) and gives it back when it answered."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._slots = threading.BoundedSemaphore(size)
        self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()  # the warmest child first
        self._lock = threading.Lock()
        self._children: set[_Child] = set()

    def call(self, request: tuple, wall_s: float) -> IsolatedResult:
        with self._slots:
            child = self._take()
            try:
                result = child.call(request, wall_s)
            except CheckerUnavailable:
                self._forget(child)
                raise
            if child.proc.returncode is None:
                self._idle.put(child)
            else:
                self._forget(child)
            return result

    def close(self) -> None:
        with self._lock:
            children, self._children = list(self._children), set()
        for child in children:
            child.close()

    def _take(self) -> _Child:
        """An idle child that is still alive (one killed while idle, e.g. by the OOM killer, is replaced: the call
        that takes it must not become an env error), else a new one."""
        while True:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                break
            if child.proc.poll() is None:
                return child
            child.close()
            self._forget(child)
        child = _Child()
        with self._lock:
            self._children.add(child)
        return child

    def _forget(self, child: _Child) -> None:
        with self._lock:
            self._children.discard(child)


_shared: ChildPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> ChildPool:
    """The process's one pool (started at first use, closed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ChildPool(pool_size())
            atexit.register(_shared.close)
        return _shared


def _send(stream, message: Any) -> None:
    data = pickle.dumps(message)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream, deadline: float | None) -> Any:
    """The next message, or None when the deadline passed first; EOFError when the other side closed."""
    fd = stream.fileno()
    chunks, need, header = [], _HEADER.size, None
    while need:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
        chunk = os.read(fd, need)
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        need -= len(chunk)
        if need == 0 and header is None:
            (need,) = _HEADER.unpack(b"".join(chunks))
            header, chunks = True, []
    return pickle.loads(b"".join(chunks))


def _answer(instances: dict[tuple[str, str], Any], request: tuple) -> tuple[str, Any]:
    """("ok", value), ("raised", message) or ("memory", None); the CPU limit kills the process instead."""
    module, class_name, method, arguments, cpu_s, memory_bytes = request
    try:
        key = (module, class_name)
        if key not in instances:  # the import is the child's start-up, not the call's cost
            instances[key] = getattr(importlib.import_module(module), class_name)()
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        with _soft_limit(resource.RLIMIT_CPU, math.ceil(used + cpu_s)), _soft_limit(resource.RLIMIT_AS, memory_bytes):
            answer = ("ok", getattr(instances[key], method)(**arguments))
        pickle.dumps(answer)  # an unpicklable value is the call's error, not the child's end
        return answer
    except MemoryError:
        return ("memory", None)
    except Exception as e:
        return ("raised", str(e))


@contextlib.contextmanager
def _soft_limit(which: int, value: int):
    """The soft limit `which` lowered to `value` (never above the hard one) while the block runs."""
    soft, hard = resource.getrlimit(which)
    resource.setrlimit(which, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(which, (soft, hard))


def _serve() -> None:
    """The child's loop: one request in, one answer out, until the parent closes stdin."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action would write a core file
    instances: dict[tuple[str, str], Any] = {}
    while True:
        try:
            request = _receive(sys.stdin.buffer, None)
        except EOFError:
            return
        _send(sys.stdout.buffer, _answer(instances, request))


if __name__ == "__main__":
    _serve()
