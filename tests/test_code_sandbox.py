"""The sandbox pool: each limit holds, the pool stays healthy after every hostile program, calls run in parallel.

Every test ends with `_healthy(pool)`: the next call still works. docs/security.md lists these as rows.
"""

from __future__ import annotations

import json
import os
import shutil
import site as site_module
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import turnforge
from turnforge.envs.code.sandbox import SandboxLimits, SandboxPool, isolation_mode

NAMESPACES_ONLY = "holds in namespaces isolation only (docs/security.md)"


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(size=2, limits=SandboxLimits(timeout_s=3, cpu_s=3, memory_mb=512)) as p:
        yield p


def _healthy(pool: SandboxPool) -> None:
    result = pool.run("print(6 * 7)")
    assert result.stdout == "42\n" and result.exit_code == 0, result


def _needs_namespaces(pool: SandboxPool) -> None:
    if pool.isolation != "namespaces":
        pytest.skip(NAMESPACES_ONLY)


def test_normal_code_stdout_stderr_stdin_exit_code(pool):
    r = pool.run("import sys\nname = input()\nprint('hi', name)\nprint('warn', file=sys.stderr)\nsys.exit(3)",
                 stdin="ada\n")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out, r.killed) == ("hi ada\n", "warn\n", 3, False, False)
    assert pool.run("import sys\nimport os\nprint(repr(sys.stdin.read()), os.listdir())").stdout == "'' ['main.py']\n"


def test_an_exception_is_the_programs_output(pool):
    r = pool.run("x = 1\nx / 0")
    assert r.exit_code == 1 and r.stderr == ('Traceback (most recent call last):\n  File "main.py", line 2, in <module>\n'
                                             "    x / 0\n    ~~^~~\nZeroDivisionError: division by zero\n")


def test_infinite_loop_is_killed_at_the_wall_clock_limit(pool):
    r = pool.run("while True: pass", timeout=1)
    assert r.timed_out and r.killed and r.wall_s < 3
    _healthy(pool)


def test_cpu_burn_in_threads_hits_the_cpu_limit(pool):
    code = "import threading\ndef f():\n    while True: pass\nfor _ in range(4): threading.Thread(target=f).start()"
    r = pool.run(code)
    assert r.timed_out and r.killed
    _healthy(pool)


def test_10_gb_allocation_fails_with_memory_error(pool):
    r = pool.run("x = bytearray(10 * 1024**3)\nprint('allocated')")
    assert "MemoryError" in r.stderr and "allocated" not in r.stdout
    _healthy(pool)


def test_fork_bomb_is_contained_and_killed(pool):
    _needs_namespaces(pool)
    r = pool.run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=2)
    assert r.timed_out and r.killed
    _healthy(pool)


def test_huge_file_is_refused(pool):
    r = pool.run("open('big', 'wb').write(b'x' * 100 * 1024 * 1024)")
    assert r.exit_code != 0 and "File too large" in r.stderr
    _healthy(pool)


def test_writing_outside_the_working_directory_fails_or_stays_private(pool, tmp_path):
    _needs_namespaces(pool)
    target = tmp_path / "pwned"
    os.chmod(tmp_path, 0o777)
    r = pool.run(f"open({str(target)!r}, 'w').write('x')\nopen('/tmp/leak', 'w').write('x')")
    assert not target.exists() and not os.path.exists("/tmp/leak") and r.exit_code != 0
    assert pool.run("import os; print(os.path.exists('/tmp/leak'))").stdout in ("False\n",)


def test_secrets_and_parent_environment_are_unreadable(pool):
    _needs_namespaces(pool)
    os.environ["TURNFORGE_TEST_SECRET"] = "hunter2"
    r = pool.run("import os\nprint(dict(os.environ))\n"
                 "for p in ('/etc/shadow', f'/proc/{os.getppid()}/environ', '/proc/1/environ'):\n"
                 "    try: print(open(p).read()[:40])\n    except OSError as e: print('refused', p)")
    assert "hunter2" not in r.stdout and r.stdout.count("refused") == 3, r


def test_homes_show_only_what_the_sandbox_binds_for_its_interpreter(pool):
    """/root and /home are empty tmpfs but for the directories bound back for the interpreter (a pyenv, a venv or
    clone under /root, ...), wherever the clone and venv are: no other file of a home (keys, tokens, history)."""
    _needs_namespaces(pool)
    bound = pool.bound_dirs
    code = (f"import os\nbound = {bound!r}\n"
            "def inside(p): return any(p == b or p.startswith(b + '/') for b in bound)\n"
            "def above(p): return any(b.startswith(p + '/') for b in bound)\n"
            "extra = []\nfor home in ('/root', '/home'):\n    for top, dirs, files in os.walk(home):\n"
            "        paths = [os.path.join(top, n) for n in dirs + files]\n"
            "        extra += [p for p in paths if not inside(p) and not above(p)]\n"
            "        dirs[:] = [n for n in dirs if above(os.path.join(top, n))]\n"
            "print(extra, sorted(os.listdir('/root')) if os.path.isdir('/root') else None)")
    expected_root = sorted({b.split("/")[2] for b in bound if b.startswith("/root/")})
    assert pool.run(code).stdout == f"[] {expected_root if os.path.isdir('/root') else None}\n"


def test_what_leads_to_a_bound_dir_stays_when_the_private_dirs_are_emptied():
    """The entry of each private dir above a bound interpreter dir is kept (else emptying /var/tmp after every
    call would walk a venv there, failing on its read-only files); nothing else is."""
    from turnforge.envs.code.sandbox_worker import kept_entries

    bound = ["/tmp/clone/.venv", "/tmp/clone/src", "/var/tmp/a/b/venv", "/dev/shm/x", "/root/.pyenv/versions/3.11.7"]
    assert kept_entries(bound, ["/tmp", "/var/tmp", "/dev/shm"]) == {"/tmp/clone", "/var/tmp/a", "/dev/shm/x"}
    assert kept_entries(["/tmpfoo/venv"], ["/tmp"]) == set()


def test_files_of_other_calls_are_gone(pool):
    pool.run("open('mine.txt', 'w').write('secret')")
    r = pool.run("import os, glob\nprint(os.listdir('.'), glob.glob('/tmp/**/mine.txt', recursive=True))")
    assert "mine.txt" not in r.stdout


@pytest.mark.parametrize("address", ["127.0.0.1", "1.1.1.1"])
def test_no_network(pool, address):
    r = pool.run(f"import socket\ns = socket.create_connection(({address!r}, 80), timeout=2)\nprint('connected')")
    assert "connected" not in r.stdout and r.exit_code != 0
    _healthy(pool)


def test_the_parent_cannot_be_killed(pool):
    _needs_namespaces(pool)
    r = pool.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    assert "Operation not permitted" in r.stderr
    _healthy(pool)


def test_background_process_does_not_outlive_the_call(pool):
    _needs_namespaces(pool)
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(0.5)\n"
            "    open('/dev/shm/alive', 'w').write('x')\n    time.sleep(100)\nprint('parent done')")
    assert pool.run(code).stdout == "parent done\n"
    time.sleep(1.0)
    assert pool.run("import os; print(os.path.exists('/dev/shm/alive'))").stdout == "False\n"


def test_the_next_calls_child_is_out_of_reach_of_the_call_before():
    """The next call's child is forked while a call runs and waits as root until its order: a call that tries to
    kill it (a sibling in /proc), and then every process it may signal, leaves the next call on that worker whole.
    (Without a /proc children file the forker forks it after the call: no sibling to try.)"""
    with SandboxPool(size=1) as one:
        _needs_namespaces(one)
        code = ("import os, signal, time\ntime.sleep(0.3)  # (the spare is waiting by then)\n"
                "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                "    try:\n        fields = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
                "    except OSError:\n        continue\n"
                "    if int(fields[1]) == os.getppid() and int(pid) != os.getpid():\n"
                "        try:\n            os.kill(int(pid), signal.SIGKILL)\n            print('killed')\n"
                "        except PermissionError:\n            print('refused')\n"
                "os.kill(-1, signal.SIGKILL)\nprint('done')")
        spare_expected = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
        assert one.run(code).stdout == ("refused\ndone\n" if spare_expected else "done\n")
        _healthy(one)


def test_100_mb_of_output_is_truncated(pool):
    r = pool.run("import sys\nfor _ in range(100): sys.stdout.write('x' * 1024 * 1024)")
    assert r.truncated and len(r.stdout) == pool.limits.max_output_bytes and not r.timed_out
    _healthy(pool)


@pytest.mark.parametrize("code", ["import os\nos.close(1)\nos.close(2)\nwhile True: pass",
                                  "import sys, os\nsys.stdout = open(os.devnull, 'w')\nprint('hidden')"])
def test_closing_or_redirecting_its_own_stdout(pool, code):
    r = pool.run(code, timeout=1)
    assert r.stdout == ""
    _healthy(pool)


def test_a_dead_worker_is_replaced(pool):
    worker = pool._idle.get()
    worker.proc.kill()
    worker.proc.wait()
    pool._idle.put(worker)
    results = [pool.run("print(1)") for _ in range(3)]
    assert any(r.killed for r in results) or all(r.stdout == "1\n" for r in results)
    _healthy(pool)
    assert len(pool._workers) == pool.size


def test_parallel_runs_overlap(pool):
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.run("import time; time.sleep(1); print('ok')")))
               for _ in range(2)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.stdout for r in results] == ["ok\n", "ok\n"] and time.monotonic() - start < 1.9


def test_cli_runs_every_file_and_prints_json_lines(tmp_path):
    good, bad = tmp_path / "a.py", tmp_path / "b.py"
    good.write_text("print('a')")
    bad.write_text("while True: pass")
    out = subprocess.run([sys.executable, "-c", "from turnforge.cli import app; app()", "sandbox", "run", str(good), str(bad),
                          "--timeout", "1"], capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["file"] for r in rows] == [str(good), str(bad)]
    assert rows[0]["stdout"] == "a\n" and rows[1]["timed_out"]
    assert {r["isolation"] for r in rows} == {isolation_mode()}
    assert set(rows[0]) == {"file", "isolation", "stdout", "stderr", "exit_code", "timed_out", "killed", "truncated",
                            "wall_s"}


def test_cli_errors_are_one_line(tmp_path, monkeypatch):
    """A missing file, a directory, a worker that cannot start: `error: ...` on one line, never a traceback."""
    from typer.testing import CliRunner

    from turnforge.cli import app
    from turnforge.envs.code import sandbox

    good = tmp_path / "a.py"
    good.write_text("print(1)")
    runner = CliRunner()
    for args, says in [([str(tmp_path / "nope.py")], "no such file"), ([str(tmp_path)], "not a file")]:
        result = runner.invoke(app, ["sandbox", "run", *args])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.startswith("error: ") and says in result.stderr and result.stderr.count("\n") == 1
    monkeypatch.setattr(sandbox, "WORKER_SCRIPT", str(tmp_path / "gone/sandbox_worker.py"))  # a broken install
    result = runner.invoke(app, ["sandbox", "run", str(good)])
    assert result.exit_code == 1 and result.stdout == "" and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith("error: a sandbox worker did not start") and "gone/sandbox_worker.py" in result.stderr


def test_rlimits_fallback_still_bounds_time_memory_files_output_and_python_sockets():
    """Where no namespace can be made (docs/security.md, `rlimits` mode): what still holds."""
    with SandboxPool(size=1, limits=SandboxLimits(timeout_s=2, cpu_s=2, memory_mb=512), isolation="rlimits") as pool:
        assert pool.isolation == "rlimits"
        assert pool.run("while True: pass", timeout=1).timed_out
        assert "MemoryError" in pool.run("x = bytearray(10 * 1024**3)").stderr
        assert "File too large" in pool.run("open('big', 'wb').write(b'x' * 100 * 1024 * 1024)").stderr
        assert pool.run("print('x' * 10**7)").truncated
        r = pool.run("import socket\nsocket.socket()\nprint('opened')")
        assert "opened" not in r.stdout and "network access is disabled" in r.stderr
        r = pool.run("import os, time\nif os.fork() == 0:\n    time.sleep(0.3)\n    print('late')\n    time.sleep(100)\n"
                     "print('parent')")
        assert r.stdout == "parent\n"
        _healthy(pool)


def test_output_before_a_thread_that_runs_out_of_time_is_kept(pool):
    r = pool.run("import threading, time\nthreading.Thread(target=lambda: time.sleep(100)).start()\nprint('ok')",
                 timeout=1)
    assert r.timed_out and r.stdout == "ok\n"


def test_output_printed_before_a_timeout_is_kept():
    """A program that prints, then runs into its time limit: what it printed reaches the agent (line-buffered)."""
    from turnforge.envs.code.sandbox import SandboxLimits, SandboxPool

    pool = SandboxPool(1, SandboxLimits(timeout_s=1.0))
    try:
        result = pool.run("print(sum(range(10)))\nwhile True:\n    pass\n")
        assert result.timed_out and result.stdout == "45\n"
        assert pool.run("print('ok')").stdout == "ok\n"
    finally:
        pool.close()


def test_a_pool_started_from_a_venv_under_tmp_works_and_sees_nothing_else_there():
    """A clone under /tmp: its venv, its source (the worker's own files) and a `--target` dir added by a .pth file
    all lie under /tmp, which namespaces mode covers with a private tmpfs. They are bound back read-only: the pool
    runs code from there, and nothing else of the host's /tmp is visible or writable (it was refused up front)."""
    if isolation_mode() != "namespaces":
        pytest.skip(NAMESPACES_ONLY)
    with tempfile.TemporaryDirectory(dir="/tmp") as clone:
        base = Path(clone)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
        shutil.copytree(Path(turnforge.__file__).parent, base / "src/turnforge",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (base / "target").mkdir()
        (base / "target/tfprobe.py").write_text("WHERE = 'target'\n")
        (base / "sibling.txt").write_text("host secret")
        site = next((base / "venv/lib").glob("python3*/site-packages"))
        deps = "\n".join(site_module.getsitepackages())  # (this venv's packages, outside /tmp: pydantic, ...)
        (site / "paths.pth").write_text(f"{base / 'src'}\n{base / 'target'}\n{deps}\n")
        code = ("import os, sys, tfprobe\nprint(sys.prefix, tfprobe.WHERE)\n"
                f"print(sorted(os.listdir({clone!r})), sorted(os.listdir('/tmp')), os.path.exists({str(base / 'sibling.txt')!r}))\n"
                f"try: open({str(base / 'venv/pwned')!r}, 'w')\nexcept OSError as e: print(type(e).__name__)\n"
                "open('/tmp/run/mine', 'w').write('ok')")
        script = ("import json, sys\nfrom turnforge.envs.code.sandbox import SandboxPool\n"
                  "with SandboxPool(1) as pool:\n"
                  "    print(json.dumps({'isolation': pool.isolation, 'bound': pool.bound_dirs,\n"
                  "                      **pool.run(sys.argv[1]).as_dict()}))")
        out = subprocess.run([str(base / "venv/bin/python"), "-c", script, code], capture_output=True, text=True,
                             timeout=120, cwd="/")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["isolation"] == "namespaces" and result["exit_code"] == 0, result
        prefix, listing, write = result["stdout"].splitlines()
        assert prefix == f"{base / 'venv'} target"
        # (this test's own venv shows too where it lies under /tmp: a clone there runs this test)
        shown_in_tmp = sorted({"run", *(b.split("/")[2] for b in result["bound"] if b.startswith("/tmp/"))})
        assert base.name in shown_in_tmp
        assert listing == f"['src', 'target', 'venv'] {shown_in_tmp} False"
        assert write in ("PermissionError", "OSError")  # (read-only mount, or a root-owned dir: either refuses)
        assert not (base / "venv/pwned").exists()


def test_a_closed_pool_leaves_no_pipe_open():
    """A worker's stdout pipe was never closed: one ResourceWarning per worker at the exit of every run (issue 40)."""
    script = ("import gc, warnings; warnings.simplefilter('always')\n"
              "from turnforge.envs.code.sandbox import SandboxPool\n"
              "pool = SandboxPool(1); assert pool.run('print(1)').stdout == '1\\n'; pool.close(); del pool; gc.collect()\n")
    done = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr
