"""One sandbox worker: a pre-started Python process whose calls each run in a fresh forked child.

Started by `sandbox.SandboxPool` as `python .../sandbox_worker.py CONFIG_JSON`, under `unshare --net --mount`
when the host allows it (see docs/security.md). It reads one JSON request per line on stdin and writes one
JSON result per line on stdout. Once set up (mounts, environment cleared to SAFE_ENV) it starts the *forker*
(sandbox_forker.py, a fresh lean interpreter): the pristine process every call's child is forked from.
Neither the worker nor the forker ever runs submitted code. Per call:

1. while the previous call runs, the forker forks the next child, which starts a new session, takes the
   limits (RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0) and waits, as root; after
   its reply the worker clears its private /tmp (a tmpfs of its own mount namespace) and makes the run's
   directory there, owned by the slot uid, mode 0700;
2. on the request the worker writes main.py and the stdin file and sends the child the call's CPU seconds
   (RLIMIT_CPU); the child drops to the slot uid (no groups, no capabilities) and runs the code as
   `__main__` — a copy-on-write copy of a clean interpreter, so a call costs a fork, not an interpreter
   start, and nothing from one call reaches the next;
3. the worker reads the child's stdout/stderr pipes (keeping the first `max_output_bytes` of each,
   draining and dropping the rest) until the forker reports the end, or kills the child at the deadline;
4. the forker, parent of the child and child subreaper of what it leaves, reaps it and kills every process
   of the slot uid (background processes, setsid escapes, fork bombs: a helper that becomes that uid and
   calls kill(-1, SIGKILL) until none is left) before it reports the child's wait status.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import sys
import time

FORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_forker.py")
PR_SET_CHILD_SUBREAPER = 36
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # the usual world-writable dirs
STDIN_FILE = ".stdin"  # the call's stdin, in its working directory until the child opens it
SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}


def _libc():
    return ctypes.CDLL(None, use_errno=True)


MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
HOMES = ("/root", "/home")  # covered by empty tmpfs: no keys, tokens, shell history


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    if libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def interpreter_dirs() -> list[str]:
    """The directories this interpreter needs: its prefixes and executable, every sys.path directory
    (site-packages, what .pth files add, such as an editable install's src/) and this file's own.

    Started by the pool without PYTHONPATH, the worker has the sys.path of the forker and of every call's child.
    Each path is kept as written and resolved (a venv's python is a link into the base interpreter's prefix).
    """
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(__file__)), *sys.path}
    found = set()
    for path in filter(None, paths):
        path = os.path.abspath(path)
        if os.path.isfile(path):  # a zip archive on sys.path
            path = os.path.dirname(path)
        if os.path.isdir(path):
            found |= {path, os.path.realpath(path)}
    return sorted(found)


def _private_view(tmpfs_mb: int) -> list[str]:
    """This mount namespace's view of the file system, as bubblewrap or nsjail build one: fresh tmpfs over the
    world-writable dirs (PRIVATE_DIRS) and empty tmpfs over the homes, then every interpreter directory that
    lay under them bound back (read-only once `_read_only_elsewhere` has run). Returns those directories.

    Each is opened before the tmpfs hides it and bound from its descriptor (/proc/self/fd/N still names the
    host's directory). A covered dir itself is never bound back: that would show all of it.
    """
    covered = [d for d in (*PRIVATE_DIRS, *HOMES) if os.path.isdir(d)]
    hidden = [p for p in interpreter_dirs() if any(p.startswith(d + "/") for d in covered)]
    bound = [p for p in hidden if not any(p.startswith(q + "/") for q in hidden)]  # (outermost: binds are recursive)
    fds = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in bound]
    try:
        for path in covered:
            options = f"size={tmpfs_mb}m,mode=1777" if path in PRIVATE_DIRS else "size=1m,mode=0755"
            _mount("tmpfs", path, "tmpfs", 0, options)
        for path, fd in zip(bound, fds, strict=True):
            _make_mount_point(path)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        _close_all(fds)
    return bound


def _make_mount_point(path: str) -> None:
    """The missing directories of `path` in the fresh tmpfs: root's, mode 0755 whatever the umask (a call's uid
    passes through them, and can write nothing there)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory)
        os.chmod(directory, 0o755)


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


def _read_some(fd: int, kept: bytearray, cap: int) -> tuple[bool, bool]:
    """Read what is there; returns (eof, dropped_something)."""
    chunk = os.read(fd, 65536)
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
        if self.status is None:  # (once reaped it is gone: no signal, no ProcessLookupError to catch)
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
        timeout = float(request.get("timeout") or cfg["timeout_s"])
        _write_file(os.path.join(cfg["workdir"], "main.py"), request["code"].encode("utf-8", "surrogatepass"), cfg)
        order = b"%d" % max(1, int(min(cfg["cpu_s"], timeout) + 0.999))  # whole CPU seconds: RLIMIT_CPU's unit
        if request.get("stdin"):  # (without it, the child's stdin is its order pipe, at its end: empty)
            _write_file(os.path.join(cfg["workdir"], STDIN_FILE), request["stdin"].encode("utf-8", "replace"), cfg)
            order += b" stdin"
        start = time.monotonic()
        os.write(ready.ctl, order)
        os.close(ready.ctl)  # EOF: the child starts
        ready.ctl = -1  # (its number may soon name one of the spare's fds, which must not be closed with it)
        result = _watch(ready, start + timeout, cfg)
        result["wall_s"] = round(time.monotonic() - start, 4)
        return result
    finally:  # whatever failed above: the child and everything of the uid are gone before the reply
        ready.discard()


def _write_file(path: str, data: bytes, cfg: dict) -> None:
    """A file of the call's, owned by its uid."""
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
    open_fds = {out_r: out, err_r: err}  # (read only when select says so: a read of a readable pipe never blocks)
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


def kept_entries(bound_dirs: list[str], private_dirs: list[str]) -> set[str]:
    """The entries of the private dirs that lead to a bound dir: they stay when the dirs are emptied after a call
    (made by root, mode 0755: a call can add nothing there).

    >>> sorted(kept_entries(["/tmp/clone/.venv", "/var/tmp/a/b", "/root/.pyenv"], ["/tmp", "/var/tmp"]))
    ['/tmp/clone', '/var/tmp/a']
    """
    return {os.path.join(base, path[len(base) + 1:].split("/")[0])
            for path in bound_dirs for base in private_dirs if path.startswith(base + "/")}


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
            if path in cfg["kept"]:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _start_forker(cfg: dict, source: str) -> tuple[socket.socket, int]:
    """Start the forker as a fresh interpreter in this worker's namespaces (not a fork of this worker: each
    module held by the process every call's fork copies costs every call); its socket and pid. `source`:
    sandbox_forker.py, read before the mounts (which may hide where it lies, /tmp for one)."""
    sock, end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    keys = ("uid", "memory_bytes", "file_bytes", "open_files", "processes", "block_network", "workdir")
    argv = [sys.executable, "-c", source, json.dumps({**{k: cfg[k] for k in keys}, "socket_fd": 3,
                                                      "stdin_file": STDIN_FILE})]
    # LD_BIND_NOW: every symbol bound once in the forker, not on first use in each child (a copied GOT page and
    # a symbol lookup per call); the forker drops it from the children's environment.
    env = {**os.environ, "LD_BIND_NOW": "1"}
    pid = os.fork()
    if pid == 0:
        try:
            _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of a run come back to it (kept by exec)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # (the children's stdin/out/err point at their call's files and pipes)
                os.dup2(null, fd)
            os.dup2(end.fileno(), 3)
            os.set_inheritable(3, True)
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    end.close()
    return sock, pid


def serve(cfg: dict) -> None:
    """The worker's loop: one JSON request per stdin line, one JSON result per stdout line."""
    with open(FORKER_SCRIPT, encoding="utf-8") as f:
        forker_source = f.read()
    cfg["bound_dirs"] = []
    if cfg["private_tmp"]:  # (a mount that fails ends the worker: the pool says why, nothing runs unisolated)
        cfg["bound_dirs"] = _private_view(cfg["tmpfs_mb"])
        cfg["writable_mounts"] = _read_only_elsewhere()
    # Without a mount namespace of our own, runs live in a scratch dir the pool made for this worker.
    cfg["run_root"] = "/tmp" if cfg["private_tmp"] else cfg["scratch_dir"]
    os.chdir("/")
    # What every child inherits, set once here: only SAFE_ENV and the run's directory as HOME and TMPDIR.
    cfg["workdir"] = os.path.join(cfg["run_root"], "run")
    cfg["private_dirs"] = [path for path in PRIVATE_DIRS if os.path.isdir(path)]
    cfg["kept"] = kept_entries(cfg["bound_dirs"], cfg["private_dirs"])
    os.environ.clear()
    os.environ.update(SAFE_ENV, HOME=cfg["workdir"], TMPDIR=cfg["workdir"])
    cfg["forker"], forker = _start_forker(cfg, forker_source)
    ready = _Ready(cfg["forker"], _receive(cfg["forker"])[1])
    prepare(cfg)
    prepared = True
    hello = {"ready": True, "private_tmp": cfg["private_tmp"], "writable_mounts": cfg.get("writable_mounts"),
             "bound_dirs": cfg["bound_dirs"]}
    print(json.dumps(hello), flush=True)
    for line in sys.stdin.buffer:
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
        print(json.dumps(result), flush=True)
        with contextlib.suppress(Exception):  # the next call's directory, while the caller reads this reply
            prepare(cfg)
            prepared = True
    ready.discard()
    _close_all(ready.next_fds)
    cfg["forker"].close()
    os.waitpid(forker, 0)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
