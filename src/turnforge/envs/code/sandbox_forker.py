"""The sandbox's forker: the pristine process every call's child is forked from (see sandbox_worker.py).

Started by the worker, once it is set up (mounts, environment), as `python -c SOURCE_OF_THIS_FILE CONFIG_JSON`
(the mounts may hide this file) with the worker's socket on fd 3, /dev/null on fds 0-2 and the child subreaper attribute already set. A fresh
interpreter with as little as the children need (PRELOAD, the parser warmed, sys streams for the children,
traceback for their errors), not a fork of the worker: every call's fork copies this process's page tables,
its exit frees them and its child faults in what it touches, so each module held here costs every call
(the worker's own imports — json, re, socket, ctypes, shutil, select — cost ~60 us a call as a fork of it).
It runs no submitted code and touches as little as it can between forks (no signal or socket module: each
would import enum and more; _socket and a plain SIGKILL do).

Per call (`_forker`): the next call's child (`_child`) is forked while the current one runs and waits as
root; once the current child is dead the forker kills every process of the slot uid (`_kill_uid`) and sends
the worker the child's wait status with the next child's pidfd, order pipe and output pipes.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import gc
import importlib
import json
import linecache
import os
import resource
import sys
import time
import traceback

SIGKILL = 9  # (signal.py would import enum into the process every call's fork copies)
# Imported once here, so a call that imports it gets it for nothing (a child's own `import math` costs
# 0.5-2 ms: the path search and dlopen); model-written math code imports it most. Each module held here makes
# every call's fork a little dearer (heapq, bisect, fractions, string, random, statistics too: +20-50 page
# faults, +40-100 us a call), so only math.
PRELOAD = ("math",)
# Run once by the forker through the children's own path (compile, exec, print, a traceback): what a first
# use sets up lazily (the parser, type attribute caches and version tags, interned names, the traceback
# machinery) is set up here once, not copied into every call's child (each page written after the fork is a
# page fault there, ~2 us). Typical model-written code, and an error: printing a traceback.
WARM_UP = """import math
xs = [i * i for i in range(100)]
mean = sum(xs) / len(xs)
print(f"{mean:.3f}", round(math.sqrt(mean), 2), max(xs), sorted({"b": 2, "a": 1}.items()), "a b".split(), str(12))
1 / 0
"""
# Run by each child while it waits (the next call's, forked while a call runs): the pages every program writes
# (the parser's, the eval loop's, print's: ~half of a call's ~200 copy-on-write faults) are copied then, off
# the call's path: a call ~0.15 ms sooner here. More (WARM_UP itself) copies pages most calls never write.
SPARE_WARM_UP = "n = 2\nprint(n * 3)"


def _limits(cfg: dict) -> list[tuple[int, tuple[int, int]]]:
    """The rlimits of every call but its CPU time (set once the call's timeout is known), computed once."""
    mem = cfg["memory_bytes"]
    limits = [
        (resource.RLIMIT_AS, (mem, mem)),
        (resource.RLIMIT_FSIZE, (cfg["file_bytes"], cfg["file_bytes"])),
        (resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if cfg["uid"] is not None:
        # Counted per uid: the slot uid belongs to this worker alone, so the limit is this run's.
        limits.append((resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"])))
    return limits


def _become_sandbox_user(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _child(ctl_r: int, out_w: int, err_w: int, cfg: dict) -> None:
    """In the child forked ahead of its call: limits and identity, then wait for the call and run its code
    (main.py of the working directory) as __main__. Never returns.

    Every Python object the child touches costs a copy-on-write page fault, so it does as little as it can:
    sys.stdin/stdout/stderr are the forker's own (made for the children and never used by the forker, see
    `_child_streams`), and only the descriptors under them change here. Its order is the call's CPU seconds,
    and ` stdin` when the worker wrote a stdin file; without one, stdin stays the order pipe, at its end.
    """
    status = 1
    try:
        os.setsid()
        _run_main(SPARE_WARM_UP, "warm-up")  # (to /dev/null: fds 1 and 2 are still the forker's)
        os.dup2(ctl_r, 0)  # the worker's order, until the call's stdin replaces it
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        # SIGPIPE stays ignored, as Python sets it at start-up (and subprocess resets it for what it execs).
        for limit, value in cfg["limits"]:
            resource.setrlimit(limit, value)
        # Forked while the previous call may still run: it waits as root (out of reach of that call's uid and of
        # its kill rounds) and takes the slot uid only once its order comes, i.e. once all of that call is dead.
        order = _read_to_eof(0)  # sent once main.py (and the stdin file) are written
        if not order:
            status = 0
            return  # the worker went away (or closes) without a call
        _become_sandbox_user(cfg["uid"])
        if cfg["block_network"]:
            _block_sockets()
        os.chdir(cfg["workdir"])  # made by the worker after this child was forked
        cpu, _, stdin = order.partition(b" ")
        resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))  # SIGXCPU at the soft limit, SIGKILL 1 s later
        if stdin:
            stdin_fd = os.open(cfg["stdin_file"], os.O_RDONLY)
            os.unlink(cfg["stdin_file"])
            os.dup2(stdin_fd, 0)
            os.close(stdin_fd)
        main_fd = os.open("main.py", os.O_RDONLY)
        code = _read_to_eof(main_fd).decode("utf-8", "surrogatepass")
        os.close(main_fd)
        sys.path[0] = cfg["workdir"]
        status = _run_main(code, "main.py")
    finally:
        os._exit(status & 0xFF if isinstance(status, int) else 1)


def _run_main(code: str, filename: str) -> int:
    """Run `code` as `__main__`, as `python FILE` would: its exit status, its traceback on stderr."""
    namespace = {"__name__": "__main__", "__file__": filename, "__builtins__": __builtins__}
    try:
        exec(compile(code, filename, "exec"), namespace)
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # the program's own error: its traceback (from the file on) is its output
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        status = 1
    _flush()  # what the main thread printed survives a thread that runs into the time limit
    if "threading" in sys.modules:  # as at interpreter exit: wait for the program's non-daemon threads
        sys.modules["threading"]._shutdown()
    _flush()
    return status


def _child_streams() -> None:
    """Set sys.stdin/stdout/stderr up for the children, on fds 0-2 (/dev/null here), which each child points at
    its call's stdin file and output pipes. The forker never uses them, so every child gets them empty."""
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    # Line-buffered: what a program printed before it ran into a limit (and was killed) is not lost.
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.argv = ["main.py"]


def _read_to_eof(fd: int) -> bytes:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    return data


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _block_sockets() -> None:
    """Fallback where no network namespace exists: refuse socket creation through an audit hook."""

    def hook(event: str, args: tuple) -> None:
        if event in {"socket.__new__", "socket.connect", "socket.bind"}:
            raise PermissionError("network access is disabled in the sandbox")

    sys.addaudithook(hook)


def _forker(sock: _socket.socket, cfg: dict) -> None:
    """The loop of the process every call's child is forked from. Never returns.

    After a fork, every page of the forking process is shared copy-on-write, so each page it then writes
    costs it a page fault (~2 us here): the worker's own bookkeeping between two calls cost ~130 faults. The
    forker does next to nothing between forks; it is the parent of each call's child and the child subreaper
    of what the child leaves, so it reaps them and kills every process of the uid before it reports the
    child's wait status. The next call's child (the *spare*) is forked while a call runs, off its path; it
    waits as root until its order. Per call, once the child and all of the uid are gone, it sends the worker
    the child's wait status with the spare's pidfd, order pipe and output pipes (one message); it ends when
    the worker does (its sends fail). Where /proc gives no children file (no way to tell the spare from what
    a call left) and in `rlimits` mode, the spare is forked after the call instead.
    """
    children = f"/proc/self/task/{os.getpid()}/children"
    # (Not in rlimits mode: a call there runs as the forker's own uid and could kill a spare waiting beside it.)
    early = cfg["uid"] is not None and os.path.exists(children)
    spare = 0
    try:
        pid, fds = _fork_child(cfg)
        _hand_over(sock, b"r", fds)
        while True:
            spare, spare_fds = _fork_child(cfg) if early else (0, [])
            status = os.waitpid(pid, 0)[1]
            _kill_uid(cfg["uid"], pid, spare, children)  # background processes and escapes die with the run
            pid, fds = (spare, spare_fds) if spare else _fork_child(cfg)
            _hand_over(sock, b"%d" % status, fds)
    finally:  # the worker is gone
        if cfg["uid"] is not None:
            _kill_uid(cfg["uid"], 0, spare, children)
        os._exit(0)


def _fork_child(cfg: dict) -> tuple[int, list[int]]:
    """Fork a call's child (see `_child`); its pid and the worker's ends: pidfd, order pipe, output pipes."""
    ctl_r, ctl_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child(ctl_r, out_w, err_w, cfg)
    for fd in (ctl_r, out_w, err_w):
        os.close(fd)
    return pid, [os.pidfd_open(pid), ctl_w, out_r, err_r]


def _hand_over(sock: _socket.socket, word: bytes, fds: list[int]) -> None:
    """Send the worker `word` and a child's fds, then close ours (a child left without its order pipe reads
    EOF and ends)."""
    try:
        sock.sendmsg([word], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
    finally:
        for fd in fds:
            os.close(fd)


def _kill_uid(uid: int | None, pgid: int, spare: int, children: str) -> None:
    """Kill everything the run started: all processes of the slot uid (or its process group without one).

    A helper that becomes the slot uid calls kill(-1, SIGKILL): every process of that uid, wherever it went
    (setsid, double fork). Run by the forker: every process of the uid descends from it (only root can become
    the uid, and the forker is the child subreaper: orphans come back to it), so "no child left but the spare"
    (the next call's child, still root) means "none of the uid left" — rounds of kill + reap go on until then
    (kill(-1) cannot say it, it succeeds while any exists; a /proc scan for the uid said it at ~0.15 ms a call).
    """
    if uid is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, SIGKILL)
        _reap(spare, children)
        return
    for _ in range(200):
        if not _reap(spare, children):
            return
        helper = os.fork()
        if helper == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, SIGKILL)  # every process of this uid but the helper itself
            finally:
                os._exit(0)
        os.waitpid(helper, 0)
        time.sleep(0.002)


def _reap(spare: int, children: str) -> bool:
    """Collect dead children and the orphans that came to this process; True while a child other than `spare`
    (pid 0: none) is still alive. `children`: this process's /proc children file (its live children's pids)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            break
    if not spare:
        return True
    fd = os.open(children, os.O_RDONLY)
    try:
        # (256 bytes, from Python's allocator: a larger read made malloc consolidate its free lists, ~4 faults a
        # call; a longer list is cut, which still reads as "another child")
        return os.read(fd, 256).split() != [b"%d" % spare]
    finally:
        os.close(fd)


def _warm_up() -> None:
    """Run WARM_UP through the children's own path; its output goes to /dev/null (fds 1 and 2 here)."""
    # As a file would be: its traceback then shows the failing line and its carets (ast, imported by traceback
    # for them, is then held too: a first traceback in a child cost ~2.5 ms).
    linecache.cache["warm-up"] = (len(WARM_UP), None, WARM_UP.splitlines(True), "warm-up")
    _run_main(WARM_UP, "warm-up")
    linecache.clearcache()


def main(cfg: dict) -> None:
    os.environ.pop("LD_BIND_NOW", None)  # (bound once at start for all children: not theirs to inherit)
    cfg["limits"] = _limits(cfg)
    own_dir = sys.path.pop(0)  # (the current directory: none of its modules may stand in for a standard one)
    for name in PRELOAD:
        importlib.import_module(name)
    sys.path.insert(0, own_dir)  # (each child puts its working directory there)
    _child_streams()
    _warm_up()
    gc.collect()
    _forker(_socket.socket(fileno=cfg["socket_fd"]), cfg)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
