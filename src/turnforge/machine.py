"""What a run ran on, recorded in summary.json so that reported timings say their machine."""

from __future__ import annotations

import contextlib
import os
import platform
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch


def machine_info() -> dict[str, Any]:
    """CPU model, cores this process may use, torch threads, GPU (or None), torch and Python versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


# --- OpenMP threads on a CPU shared with other processes -------------------------------------------------------
# torch runs one OpenMP thread per core. When another process keeps a core busy, a parallel region's thread on that
# core waits for the scheduler and the region's barrier waits for it: on 2 cores beside one `yes`, the hf engine's
# step took 72-136 ms with 2 threads and ~5 ms with 1 (BENCHMARKS.md, "The CPU path beside a busy process").
# So each thread that computes keeps as many threads as the cores other processes leave free, re-measured at most
# once a second (`CpuThreads`). `OMP_NUM_THREADS`, when set, is the user's fixed choice and is left alone.
RECHECK_S = 1.0
FIRST_WINDOW_S = 0.1  # the first measurement's window: jiffies are 10 ms, so ~20 of them on 2 cores
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # /proc/stat: user nice system (idle iowait) irq softirq steal


def cpu_jiffies(cpus: set[int]) -> tuple[int, int]:
    """(busy, total) jiffies of these CPUs since boot, from /proc/stat (steal counts as busy: another guest ran)."""
    busy = total = 0
    with open("/proc/stat", encoding="ascii") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cpus:
                values = [int(v) for v in fields[:8]]
                busy += sum(values[i] for i in BUSY_FIELDS)
                total += sum(values)
    return busy, total


def own_jiffies() -> int:
    """This process's CPU time (user + system, all its threads) in jiffies, from /proc/self/stat."""
    with open("/proc/self/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)


def free_cores(cores: int, others_busy: float) -> int:
    """Cores left to this process when other processes keep `others_busy` cores' worth busy: a core another process
    used more than half of counts as taken; at least one.

    >>> free_cores(2, 0.0), free_cores(2, 0.4), free_cores(2, 0.6), free_cores(2, 1.0), free_cores(2, 3.9)
    (2, 2, 1, 1, 1)
    """
    return max(1, min(cores, int(cores - others_busy + 0.5)))


class CpuThreads:
    """The OpenMP thread count of each thread that computes on a CPU: the cores other processes leave free.

    `keep()` is called before a model's forward (`watch_cpu_threads`): at most once a second it measures what other
    processes used of this process's CPUs since the last measurement (their busy jiffies less this process's own),
    and sets the calling thread's count (`torch.set_num_threads`) when it differs. Where `computing` threads of this
    process compute at once (`computing_threads`), each gets its share: OpenMP's count is per thread, so two
    threads of 2 each put 4 on 2 cores (two threads doing matmuls at once: 1.79 s at 2 threads each, 1.36 s at 1). Training, the hf engine's loop
    thread and GRPO's scoring all pass through a forward, each on its own thread."""

    def __init__(self) -> None:
        self.cpus = os.sched_getaffinity(0)
        self.lock = threading.Lock()
        self.sample: tuple[float, int, int, int] | None = None  # (when, busy, total, own) at the last measurement
        self.threads = len(self.cpus)
        self.applied = threading.local()
        self.held = 0  # > 0: the count is not re-measured (`held_cpu_threads`)
        self.computing = 1  # this process's threads computing at once (async GRPO: the trainer and the engine's)

    def measure(self) -> int:
        """The free cores since the last measurement (the first one waits `FIRST_WINDOW_S`)."""
        if self.sample is None:
            self.sample = (time.monotonic(), *cpu_jiffies(self.cpus), own_jiffies())
            time.sleep(FIRST_WINDOW_S)
        now, (busy, total), own = time.monotonic(), cpu_jiffies(self.cpus), own_jiffies()
        _, busy0, total0, own0 = self.sample
        if total > total0:
            others = max(0, (busy - busy0) - (own - own0)) / ((total - total0) / len(self.cpus))
            self.threads = free_cores(len(self.cpus), others)
            self.sample = (now, busy, total, own)
        return self.threads

    def keep(self) -> None:
        with self.lock:
            if self.sample is None or (not self.held and time.monotonic() - self.sample[0] >= RECHECK_S):
                self.measure()
            threads = max(1, self.threads // self.computing)
        if getattr(self.applied, "threads", None) != threads:
            torch.set_num_threads(threads)
            self.applied.threads = threads


_CPU_THREADS: CpuThreads | None = None


def cpu_threads() -> CpuThreads | None:
    """The process's `CpuThreads`, made on first use; None where `OMP_NUM_THREADS` fixes the count or /proc is not
    there to measure."""
    global _CPU_THREADS
    if os.environ.get("OMP_NUM_THREADS") or not os.path.exists("/proc/stat") or not hasattr(os, "sched_getaffinity"):
        return None
    if _CPU_THREADS is None:
        _CPU_THREADS = CpuThreads()
    return _CPU_THREADS


def watch_cpu_threads(model: torch.nn.Module) -> None:
    """Keep the OpenMP threads of every thread that runs `model` (on a CPU) at the cores other processes leave free
    (`cpu_threads`)."""
    if cpu_threads() is not None and not getattr(model, "_turnforge_cpu_threads", False):
        model.register_forward_pre_hook(lambda module, args: _CPU_THREADS.keep())
        model._turnforge_cpu_threads = True


def computing_threads(n: int) -> None:
    """Say how many threads of this process compute at once from now on (>= 1); each thread's next forward takes its
    share of the free cores. A no-op where `OMP_NUM_THREADS` fixes the count."""
    threads = cpu_threads()
    if threads is not None:
        threads.computing = max(1, n)


@contextlib.contextmanager
def held_cpu_threads() -> Iterator[None]:
    """One OpenMP thread count (the cores free now) for every forward inside: float sums may round differently with
    another count, so computations compared for exact equality run inside (the test suite holds one per test)."""
    threads = cpu_threads()
    if threads is None:
        yield
        return
    with threads.lock:
        threads.measure()
        threads.held += 1
    try:
        yield
    finally:
        with threads.lock:
            threads.held -= 1
