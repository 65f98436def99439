"""One sandbox worker: a pre-started Python process that runs each request in a fresh forked child.

Started by `sandbox.SandboxPool` as `python .../sandbox_worker.py CONFIG_JSON` (a file of the standard library's
imports only: its memory is what every call's fork copies), under
`unshare --net --mount` when the host allows it (see docs/security.md). It reads one JSON request per line
on stdin and writes one JSON result per line on stdout. The worker itself never runs the submitted code:

1. it clears its private /tmp (a tmpfs of its own mount namespace) and makes the run's directory there,
   owned by the worker's slot uid, mode 0700;
2. it forks; the child starts a new session, takes the limits (RLIMIT_AS, RLIMIT_CPU, RLIMIT_NPROC,
   RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0), drops to the slot uid (no groups, no capabilities), and
   `exec`s the code as `__main__` with the worker's environment (cleared to SAFE_ENV at start) — a
   copy-on-write copy of a clean interpreter, so a call costs a fork, not an interpreter start, and nothing
   from one call reaches the next;
3. the worker reads the child's stdout/stderr pipes (keeping the first `max_output_bytes` of each,
   draining and dropping the rest), and waits for the child's exit or the wall-clock deadline;
4. then it kills every process of the slot uid (background processes, setsid escapes, fork bombs: a
   helper that becomes that uid and calls kill(-1, SIGKILL) until none is left), reaps them, and removes
   everything the run wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
import traceback

PR_SET_CHILD_SUBREAPER = 36
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the usual world-writable dirs
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


def _set_limits(cfg: dict) -> None:
    mem = cfg["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = max(1, int(cfg["cpu_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL one second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_bytes"], cfg["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["uid"] is not None:
        # Counted per uid: the slot uid belongs to this worker alone, so the limit is this run's.
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))


def _become_sandbox_user(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _child(code: str, workdir: str, stdin_path: str, out_w: int, err_w: int, cfg: dict) -> None:
    """In the forked child: limits, identity, then run `code` as __main__. Never returns."""
    status = 1
    try:
        os.setsid()
        stdin_fd = os.open(stdin_path, os.O_RDONLY)
        os.unlink(stdin_path)
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.chdir(workdir)
        _set_limits(cfg)
        _become_sandbox_user(cfg["uid"])
        if cfg["block_network"]:
            _block_sockets()
        # The program's own streams for the rest of the child's life (closed by os._exit).
        sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        # Line-buffered: what a program printed before it ran into a limit (and was killed) is not lost.
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.argv = ["main.py"]
        sys.path[0] = workdir
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


def _kill_uid(uid: int | None, pgid: int) -> None:
    """Kill everything the run started: all processes of the slot uid (or its process group without one).

    A helper that becomes the slot uid calls kill(-1, SIGKILL): every process of that uid, wherever it went
    (setsid, double fork). Every process of the uid descends from this worker (only root can become the uid,
    and the worker is the child subreaper: orphans come back to it), so "no child left" means "none of the
    uid left" — rounds of kill + reap go on until then (kill(-1) cannot say it, it succeeds while any exists).
    """
    if uid is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return
    for _ in range(200):
        if not _reap():
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


def _reap() -> bool:
    """Collect dead children and the orphans that came to this worker; True while any child is still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


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


def run_one(request: dict, cfg: dict) -> dict:
    """Run one request's code in a fresh child; always returns a result."""
    _clear_private_dirs(cfg)
    workdir = os.path.join(cfg["run_root"], "run")
    os.makedirs(workdir, mode=0o700)
    with open(os.path.join(workdir, "main.py"), "w") as f:
        f.write(request["code"])
    stdin_path = os.path.join(workdir, ".stdin")
    with open(stdin_path, "w") as f:
        f.write(request.get("stdin") or "")
    if cfg["uid"] is not None:
        for path in (workdir, os.path.join(workdir, "main.py"), stdin_path):
            os.chown(path, cfg["uid"], cfg["uid"])
    timeout = float(request.get("timeout") or cfg["timeout_s"])
    run_cfg = {**cfg, "cpu_s": min(cfg["cpu_s"], timeout)}
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child(request["code"], workdir, stdin_path, out_w, err_w, run_cfg)
    os.close(out_w)
    os.close(err_w)
    result = _watch(pid, out_r, err_r, start + timeout, cfg)
    result["wall_s"] = round(time.monotonic() - start, 4)
    _clear_private_dirs(cfg)
    return result


def _watch(pid: int, out_r: int, err_r: int, deadline: float, cfg: dict) -> dict:
    """Collect output until the child exits or the deadline; then kill what is left and reap."""
    cap = cfg["max_output_bytes"]
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    open_fds = {out_r: out, err_r: err}
    for fd in open_fds:
        os.set_blocking(fd, False)
    pidfd = os.pidfd_open(pid)
    exited = False
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([pidfd, *open_fds], [], [], left)
        for fd in ready:
            if fd == pidfd:
                exited = True
            else:
                eof, dropped = _read_some(fd, open_fds[fd], cap)
                truncated |= dropped
                if eof:
                    del open_fds[fd]
    if not exited:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    _kill_uid(cfg["uid"], pid)  # background processes and escapes die with the run
    _reap()
    drain_until = time.monotonic() + 0.5  # every writer is dead: the rest is in the pipe buffers
    while open_fds and time.monotonic() < drain_until:
        ready, _, _ = select.select(list(open_fds), [], [], 0.05)
        for fd in ready:
            eof, dropped = _read_some(fd, open_fds[fd], cap)
            truncated |= dropped
            if eof:
                del open_fds[fd]
    for fd in (out_r, err_r, pidfd):
        os.close(fd)
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
    if not cfg["private_tmp"]:
        shutil.rmtree(os.path.join(cfg["run_root"], "run"), ignore_errors=True)
        return
    for base in PRIVATE_DIRS:
        if not os.path.isdir(base):
            continue
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
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a run come back to us to be reaped
    os.chdir("/")
    # What every child inherits, set once here: only SAFE_ENV and the run's directory as HOME and TMPDIR.
    workdir = os.path.join(cfg["run_root"], "run")
    os.environ.clear()
    os.environ.update(SAFE_ENV, HOME=workdir, TMPDIR=workdir)
    # The first compile() in a process costs ~1.2 ms (the parser's lazy set-up): paid here once, not per call.
    compile("print(sum(range(3)))", "warm-up", "exec")
    out = sys.stdout
    hello = {"ready": True, "private_tmp": cfg["private_tmp"], "writable_mounts": cfg.get("writable_mounts")}
    print(json.dumps(hello), file=out, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = run_one(request, cfg)
        except Exception as e:  # the worker's own failure, reported as the call's error
            result = {"stdout": "", "stderr": f"sandbox error: {type(e).__name__}: {e}", "exit_code": -1,
                      "timed_out": False, "killed": False, "truncated": False, "wall_s": 0.0}
        print(json.dumps(result), file=out, flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
