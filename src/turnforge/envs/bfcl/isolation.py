"""Calls of BFCL's stateless classes (MathAPI) run in a child process with a time and a memory limit.

A reply may ask `power(base=10, exponent=10**12)` or `square_root(number=2, precision=10**9)`: bfcl-eval's
MathAPI computes it, in Python big integers, for minutes and gigabytes while holding the GIL — no thread
timeout can stop that, and it stalled every episode of a run. Stateless classes keep nothing between calls,
so their calls can run elsewhere: in a child process (`python -m turnforge.envs.bfcl.isolation`) that caps its
own address space, answering one pickled request at a time over its stdin/stdout. A call past `timeout_s`
kills that child (the next call starts another) and comes back as `timed_out`; the env ends the episode with
`StopReason.timeout`. The stateful classes (file system, trading, ...) stay in process: their state lives
there, and their work is bounded by it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import queue
import resource
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

TIMEOUT_S = 5.0
MEMORY_BYTES = 1 << 30  # 1 GiB of address space for the child (Python + bfcl-eval's math module need ~100 MiB)
_HEADER = struct.Struct("<I")


@dataclass
class IsolatedResult:
    """What a call did: returned `value`, raised (`error` = its message), or ran out of time."""

    value: Any = None
    error: str | None = None
    timed_out: bool = False


class _Child:
    """One child process; `call` sends a request and waits for its answer at most `timeout_s`."""

    def __init__(self, memory_bytes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "turnforge.envs.bfcl.isolation", str(memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    def call(self, request: tuple, timeout_s: float) -> IsolatedResult:
        _send(self.proc.stdin, request)
        reply = _receive(self.proc.stdout, time.monotonic() + timeout_s)
        if reply is None:
            self.kill()
            return IsolatedResult(timed_out=True)
        kind, payload = reply
        return IsolatedResult(value=payload) if kind == "ok" else IsolatedResult(error=payload)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


_idle: queue.SimpleQueue[_Child] = queue.SimpleQueue()  # shared by every env of the process (env threads)


def call_isolated(module: str, class_name: str, method: str, arguments: dict[str, Any],
                  timeout_s: float = TIMEOUT_S, memory_bytes: int = MEMORY_BYTES) -> IsolatedResult:
    """`getattr(module.class_name(), method)(**arguments)` in an idle child process (one is started if none is)."""
    try:
        child = _idle.get_nowait()
    except queue.Empty:
        child = _Child(memory_bytes)
    if not child.alive():
        child = _Child(memory_bytes)
    try:
        result = child.call((module, class_name, method, arguments), timeout_s)
    except (BrokenPipeError, EOFError, OSError) as e:  # the child died (e.g. killed by its memory cap)
        child.kill()
        return IsolatedResult(error=f"the call's process ended ({type(e).__name__}); it may have run out of memory")
    if child.alive():
        _idle.put(child)
    return result


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


def _serve(memory_bytes: int) -> None:
    """The child's loop: one request in, one answer out, until the parent closes stdin."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    instances: dict[tuple[str, str], Any] = {}
    while True:
        try:
            module, class_name, method, arguments = _receive(sys.stdin.buffer, None)
        except EOFError:
            return
        try:
            key = (module, class_name)
            if key not in instances:
                instances[key] = getattr(importlib.import_module(module), class_name)()
            answer = ("ok", getattr(instances[key], method)(**arguments))
            pickle.dumps(answer)  # an unpicklable value is the call's error, not the child's end
        except MemoryError:
            answer = ("raised", "the call ran out of memory")
        except Exception as e:
            answer = ("raised", str(e))
        _send(sys.stdout.buffer, answer)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
