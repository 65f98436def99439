"""One sandbox worker: a pre-started Python process whose calls each run in a fresh forked child.

Started by `sandbox.SandboxPool` as `python .../sandbox_worker.py CONFIG_JSON` (a file of the standard library's
imports only: its memory is what every call's fork copies), under `unshare --net --mount` when the host
allows it (see docs/security.md). It reads one JSON request per line on stdin and writes one JSON result per
line on stdout. Once set up (mounts, environment cleared to SAFE_ENV, sys streams for the children, PRELOAD
imported, the parser warmed) it forks a *forker* (`_forker`): the pristine process every call's child is
forked from. Neither the worker nor the forker ever runs submitted code. Per call:

1. as soon as the previous call has ended, the forker forks the next child, which starts a new session,
   takes the limits (RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0), drops to the
   slot uid (no groups, no capabilities) and waits; after its reply the worker clears its private /tmp (a
   tmpfs of its own mount namespace) and makes the run's directory there, owned by the slot uid, mode 0700;
2. on the request the worker writes main.py and the stdin file and sends the child the call's CPU seconds
   (RLIMIT_CPU); the child runs the code as `__main__` — a copy-on-write copy of a clean interpreter, so a
   call costs a fork, not an interpreter start, and nothing from one call reaches the next;
3. the worker reads the child's stdout/stderr pipes (keeping the first `max_output_bytes` of each,
   draining and dropping the rest) until the forker reports the end, or kills the child at the deadline;
4. the forker, parent of the child and child subreaper of what it leaves, reaps it and kills every process
   of the slot uid (background processes, setsid escapes, fork bombs: a helper that becomes that uid and
   calls kill(-1, SIGKILL) until none is left) before it reports the child's wait status.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time
import traceback

PR_SET_CHILD_SUBREAPER = 36
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the usual world-writable dirs
# Imported once by the worker, so a call that imports it gets it for nothing (a child's own `import math`
# costs 0.5-2 ms here: the path search and dlopen); model-written math code imports it most. Each module the
# worker holds makes every call's fork a little dearer (heapq, bisect, fractions, string, random, statistics
# too: +20-50 page faults, +40-100 us a call), so only math (and what the worker needs: json, re, ...).
PRELOAD = ("math",)
STDIN_FILE = ".stdin"  # the call's stdin, in its working directory until the child opens it
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _private_tmpfs(size_mb: int) -> bool:
    """Mount fresh tmpfs over the world-writable dirs (in this worker's own mount namespace only)."""
    libc = _libc()
    ok = True
    for path in PRIVATE_DIRS:
        if not os.path.isdir(path):
            continue
        opts = f"size={size_mb}m,mode=1777".encode()
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, opts) != 0:
            ok = False
    return ok


MS_RDONLY, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 32, 4096, 8192, 16384
HOMES = ("/root", "/home")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _hide_homes() -> None:
    """Cover the home directories with empty tmpfs (no keys, tokens, history), keeping the interpreter's files.

    A pyenv or conda Python often lives under /root, which the call's uid cannot enter: each such directory
    the interpreter needs (its prefix and sys.path entries) is bind-mounted aside first, then moved back to
    the same path inside the empty tmpfs, so that only it is visible there.
    """
    homes = [h for h in HOMES if os.path.isdir(h)]
    needed = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, *sys.path) if p and os.path.isdir(p)})
    needed = [p for p in needed if any(p == h or p.startswith(h + "/") for h in homes)]
    needed = [p for p in needed if not any(p != q and p.startswith(q + "/") for q in needed)]
    stages = []
    for i, path in enumerate(needed):
        stage = f"/tmp/.stage{i}"
        os.makedirs(stage)
        _mount(path, stage, None, MS_BIND | MS_REC)
        stages.append((stage, path))
    for home in homes:
        _mount("tmpfs", home, "tmpfs", 0, "size=1m,mode=0755")
    for stage, path in stages:
        os.makedirs(path, mode=0o755, exist_ok=True)
        _mount(stage, path, None, MS_MOVE)
        os.rmdir(stage)


def _read_only_elsewhere() -> list[str]:
    """Remount every other mount read-only (this namespace only): a run can write to its private tmpfs alone.

    Returns the mount points that could not be remounted (reported by the worker's hello line).
    """
    failed = []
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].encode().decode("unicode_escape") for line in f]
    for point in dict.fromkeys(points):
        if point in PRIVATE_DIRS or point.startswith(("/proc", "/sys")):
            continue
        try:
            _mount("none", point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            failed.append(point)
    return failed


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
    sys.stdin/stdout/stderr are the worker's own (made for the children and never used by the worker, see
    `_child_streams`), and only the descriptors under them change here.
    """
    status = 1
    try:
        os.setsid()
        os.dup2(ctl_r, 0)  # the worker's order, until the call's stdin replaces it
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        # SIGPIPE stays ignored, as Python sets it at start-up (and subprocess resets it for what it execs).
        for limit, value in cfg["limits"]:
            resource.setrlimit(limit, value)
        # Forked while the previous call may still run: it waits as root (out of reach of that call's uid and of
        # its kill rounds) and takes the slot uid only once its order comes, i.e. once all of that call is dead.
        order = _read_to_eof(0)  # the call's CPU seconds, once main.py and .stdin are written
        if not order:
            status = 0
            return  # the worker went away (or closes) without a call
        _become_sandbox_user(cfg["uid"])
        if cfg["block_network"]:
            _block_sockets()
        os.chdir(cfg["workdir"])  # made by the worker after this child was forked
        cpu = int(order)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL 1 s later
        stdin_fd = os.open(STDIN_FILE, os.O_RDONLY)
        os.unlink(STDIN_FILE)
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        main_fd = os.open("main.py", os.O_RDONLY)
        code = _read_to_eof(main_fd).decode("utf-8", "surrogatepass")
        os.close(main_fd)
        sys.path[0] = cfg["workdir"]
        namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
        try:
            exec(compile(code, "main.py", "exec"), namespace)
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException as e:  # the program's own error: its traceback (from main.py on) is its output
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
            status = 1
        _flush()  # what the main thread printed survives a thread that runs into the time limit
        if "threading" in sys.modules:  # as at interpreter exit: wait for the program's non-daemon threads
            sys.modules["threading"]._shutdown()
        _flush()
    finally:
        os._exit(status & 0xFF if isinstance(status, int) else 1)


def _child_streams() -> tuple:
    """Set sys.stdin/stdout/stderr up for the children (on fds 0-2, which each child points at its call's
    stdin file and output pipes) and return the worker's own request reader and reply writer (copies of
    fds 0 and 1). The worker never reads or writes the sys streams, so every child gets them empty."""
    requests = open(os.dup(0), "rb")  # noqa: SIM115
    replies = open(os.dup(1), "w", encoding="utf-8")  # noqa: SIM115
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    # Line-buffered: what a program printed before it ran into a limit (and was killed) is not lost.
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.argv = ["main.py"]
    return requests, replies


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
            os.killpg(pgid, signal.SIGKILL)
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
                os.kill(-1, signal.SIGKILL)  # every process of this uid but the helper itself
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
        return os.read(fd, 4096).split() != [b"%d" % spare]
    finally:
        os.close(fd)


def _read_some(fd: int, kept: bytearray, cap: int) -> tuple[bool, bool]:
    """Read what is there; returns (eof, dropped_something)."""
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return False, False
    if not chunk:
        return True, False
    room = cap - len(kept)
    kept += chunk[: max(room, 0)]
    return False, len(chunk) > room


def _receive(forker: socket.socket) -> tuple[bytes, list[int]]:
    """One message of the forker: a word (`r` at start, else the last call's wait status) and the next call's
    child's pidfd, order pipe and output pipes."""
    word, fds, _, _ = socket.recv_fds(forker, 32, 4)
    if not word or len(fds) != 4:
        _forker_gone()
    return word, fds


class _Ready:
    """A child forked ahead of its call by the forker, waiting on `ctl` for the order to run (no dataclasses:
    its import would grow the process every call's fork copies)."""

    def __init__(self, forker: socket.socket, fds: list[int]) -> None:
        self.forker = forker
        self.pidfd, self.ctl, self.out_r, self.err_r = fds
        self.status: int | None = None  # its wait status, once the forker has reaped it and all of the uid
        self.next_fds: list[int] = []  # the next call's child, which comes with that status

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)  # by pidfd: never another process

    def reap(self) -> int:
        """Its wait status, from the forker once the child and every other process of the uid are gone."""
        if self.status is None:
            word, self.next_fds = _receive(self.forker)
            self.status = int(word)
        return self.status

    def successor(self) -> _Ready:
        """The next call's child, once this one is reaped (`reap`)."""
        return _Ready(self.forker, self.next_fds)

    def discard(self) -> None:
        """Kill and reap it (wherever it is: waiting, running, gone) and close our ends of its pipes."""
        self.kill()
        self.reap()
        _close_all((self.ctl, self.out_r, self.err_r, self.pidfd))


def _close_all(fds) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _forker_gone() -> None:
    """The forker died (only root can kill it): this worker cannot go on; the pool replaces a dead worker."""
    os._exit(70)


def _forker(sock: socket.socket, cfg: dict) -> None:
    """The process every call's child is forked from, forked once from the worker when it is set up. Never
    returns.

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
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a run come back to us to be reaped
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
            _reap(spare, children)
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


def _hand_over(sock: socket.socket, word: bytes, fds: list[int]) -> None:
    """Send the worker `word` and a child's fds, then close ours (a child left without its order pipe reads
    EOF and ends)."""
    try:
        socket.send_fds(sock, [word], fds)
    finally:
        for fd in fds:
            os.close(fd)


def prepare(cfg: dict) -> None:
    """Off the request path (after the previous reply): a fresh working directory for the next call.

    Its child (forked by the forker, with its limits, root until its order) blocks until `run_one` orders it
    to run; nothing of the uid runs by then (the forker has killed all of it), and it runs no submitted code yet.
    """
    _clear_private_dirs(cfg)
    os.mkdir(cfg["workdir"], mode=0o700)
    if cfg["uid"] is not None:
        os.chown(cfg["workdir"], cfg["uid"], cfg["uid"])


def run_one(request: dict, ready: _Ready, cfg: dict) -> dict:
    """Run one request's code in the prepared child; always returns a result (the child is gone after)."""
    try:
        _write_file(os.path.join(cfg["workdir"], "main.py"), request["code"].encode("utf-8", "surrogatepass"), cfg)
        _write_file(os.path.join(cfg["workdir"], STDIN_FILE), (request.get("stdin") or "").encode("utf-8", "replace"), cfg)
        timeout = float(request.get("timeout") or cfg["timeout_s"])
        cpu = max(1, int(min(cfg["cpu_s"], timeout) + 0.999))  # whole seconds: RLIMIT_CPU's unit
        start = time.monotonic()
        os.write(ready.ctl, str(cpu).encode())
        os.close(ready.ctl)  # EOF: the child starts
        ready.ctl = -1  # (its number may soon name one of the spare's fds, which must not be closed with it)
        result = _watch(ready, start + timeout, cfg)
        result["wall_s"] = round(time.monotonic() - start, 4)
        return result
    finally:  # whatever failed above: the child and everything of the uid are gone before the reply
        ready.discard()


def _write_file(path: str, data: bytes, cfg: dict) -> None:
    """A file of the call's, owned by its uid (raw os calls: each Python object the worker touches after a
    fork costs it a page fault)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if cfg["uid"] is not None:
            os.fchown(fd, cfg["uid"], cfg["uid"])
    finally:
        os.close(fd)


def _watch(ready: _Ready, deadline: float, cfg: dict) -> dict:
    """Collect output until the child has ended (the forker says so, once all of the uid is gone) or the
    deadline (then the child is killed); then the rest of the output."""
    done, out_r, err_r = ready.forker.fileno(), ready.out_r, ready.err_r
    cap = cfg["max_output_bytes"]
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    open_fds = {out_r: out, err_r: err}
    for fd in open_fds:
        os.set_blocking(fd, False)
    exited = False
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        readable, _, _ = select.select([done, *open_fds], [], [], left)
        for fd in readable:
            if fd == done:
                exited = True
            else:
                eof, dropped = _read_some(fd, open_fds[fd], cap)
                truncated |= dropped
                if eof:
                    del open_fds[fd]
    if not exited:
        ready.kill()
    status = ready.reap()  # the forker has killed the rest of the uid by then
    drain_until = time.monotonic() + 0.5  # every writer is dead: the rest is in the pipe buffers
    while open_fds and time.monotonic() < drain_until:
        readable, _, _ = select.select(list(open_fds), [], [], 0.05)
        for fd in readable:
            eof, dropped = _read_some(fd, open_fds[fd], cap)
            truncated |= dropped
            if eof:
                del open_fds[fd]
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if signum == signal.SIGXCPU:
        timed_out = True  # the CPU-time limit
    return {
        "stdout": out.decode("utf-8", "replace"),
        "stderr": err.decode("utf-8", "replace"),
        "exit_code": os.WEXITSTATUS(status) if signum is None else -signum,
        "timed_out": timed_out,
        "killed": signum is not None,
        "truncated": truncated,
    }


def _clear_private_dirs(cfg: dict) -> None:
    with contextlib.suppress(OSError):  # the usual leftovers, without rmtree's walk
        os.unlink(os.path.join(cfg["workdir"], "main.py"))
        os.rmdir(cfg["workdir"])
    if not cfg["private_tmp"]:
        shutil.rmtree(cfg["workdir"], ignore_errors=True)
        return
    for base in cfg["private_dirs"]:
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def serve(cfg: dict) -> None:
    """The worker's loop: one JSON request per stdin line, one JSON result per stdout line."""
    if cfg["private_tmp"]:
        cfg["private_tmp"] = _private_tmpfs(cfg["tmpfs_mb"])
        if cfg["private_tmp"]:
            _hide_homes()
            cfg["writable_mounts"] = _read_only_elsewhere()
    # Without a mount namespace of our own, runs live in a scratch dir the pool made for this worker.
    cfg["run_root"] = "/tmp" if cfg["private_tmp"] else cfg["scratch_dir"]
    os.chdir("/")
    # What every child inherits, set once here: only SAFE_ENV and the run's directory as HOME and TMPDIR.
    cfg["workdir"] = os.path.join(cfg["run_root"], "run")
    cfg["limits"] = _limits(cfg)
    cfg["private_dirs"] = [path for path in PRIVATE_DIRS if os.path.isdir(path)]
    os.environ.clear()
    os.environ.update(SAFE_ENV, HOME=cfg["workdir"], TMPDIR=cfg["workdir"])
    # The first compile() in a process costs ~1.2 ms (the parser's lazy set-up): paid here once, not per call.
    compile("print(sum(range(3)))", "warm-up", "exec")
    own_dir = sys.path.pop(0)  # (this file's directory: none of its modules may stand in for a standard one)
    for name in PRELOAD:
        importlib.import_module(name)
    sys.path.insert(0, own_dir)
    requests, out = _child_streams()
    cfg["forker"], forker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    forker = os.fork()
    if forker == 0:
        cfg["forker"].close()
        requests.close()
        out.close()
        _forker(forker_end, cfg)
    forker_end.close()
    ready = _Ready(cfg["forker"], _receive(cfg["forker"])[1])
    prepare(cfg)
    prepared = True
    hello = {"ready": True, "private_tmp": cfg["private_tmp"], "writable_mounts": cfg.get("writable_mounts")}
    print(json.dumps(hello), file=out, flush=True)
    for line in requests:
        request = json.loads(line)
        try:
            if not prepared:  # (a preparation that failed after the last reply is retried here)
                prepare(cfg)
            result = run_one(request, ready, cfg)
        except Exception as e:  # the worker's own failure, reported as the call's error
            result = {"stdout": "", "stderr": f"sandbox error: {type(e).__name__}: {e}", "exit_code": -1,
                      "timed_out": False, "killed": False, "truncated": False, "wall_s": 0.0}
        if ready.status is not None:  # it ran (or was killed): the next call takes the spare that came with it
            ready = ready.successor()
        prepared = False
        print(json.dumps(result), file=out, flush=True)
        with contextlib.suppress(Exception):  # the next call's directory, while the caller reads this reply
            prepare(cfg)
            prepared = True
    ready.discard()
    _close_all(ready.next_fds)
    cfg["forker"].close()
    os.waitpid(forker, 0)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
