"""Several training processes under `accelerate launch`: which one writes the run's files, and where the others wait.

`accelerate launch --config_file configs/accelerate/ddp.yaml -m turnforge run RECIPE --out OUT` starts the whole
command once per process. TRL's trainers spread the SFT, DPO and GRPO steps over them; everything else here is
the main process's job: it holds the run directory's lock, writes config.toml, stage.json, done.json, the
summary and the report, and runs the stages that do not train (collect, eval; rft's sampling, dpo's mining)
while the others wait for its result (`main_process_result`). A single process (no launcher, or one process)
takes none of these paths: accelerate is not even imported.

The waiting is a collective on the process group, which accelerate creates here with a long timeout: an
evaluation on the main process can take hours, and torch's default (30 min) would kill the waiting processes.
"""

from __future__ import annotations

import datetime
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
WAIT_TIMEOUT = datetime.timedelta(hours=12)  # the longest a process waits for the main one (a long evaluation)
_alone = threading.local()  # set while the main process runs a step alone: nested steps just run


def launched() -> bool:
    """True in one of several processes started by `accelerate launch` / torchrun (WORLD_SIZE > 1)."""
    return processes() > 1


def processes() -> int:
    """How many processes `accelerate launch` / torchrun started (1 without a launcher)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def refused_launch() -> str | None:
    """One line when `accelerate launch` was asked for several processes but started this one alone, or for FSDP on
    CPU processes (which would train as DDP), else None.

    `accelerate launch --cpu --num_processes 2` without a multi-process config runs the command once, in a plain
    process (no WORLD_SIZE), having set MASTER_ADDR for the processes it was asked for (accelerate 1.x's simple
    launcher): the run would be a one-process run that looks like a two-process one."""
    env = os.environ
    if "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env and "WORLD_SIZE" not in env:
        return ("accelerate launch was asked for several processes but started one (its --cpu form runs the command "
                "once): launch them with `accelerate launch --config_file configs/accelerate/ddp.yaml "
                "--num_processes N -m turnforge ...` (on a CPU too: it makes gloo processes)")
    if launched() and env.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        import torch

        if not torch.cuda.is_available():
            # accelerate 1.x makes FSDP of GPU process groups only (AcceleratorState): CPU processes would train
            # as DDP (MULTI_CPU) under a config that says FSDP, though torch's FSDP2 itself runs on gloo here
            return ("an FSDP launch on a machine without a GPU would train as DDP (accelerate turns FSDP on for GPU "
                    "processes only): on a CPU launch with configs/accelerate/ddp.yaml")
    return None


def quiet_other_processes() -> None:
    """Under a launcher, every process but the main one prints nothing to stdout and shows no warnings or library
    logs (the main process says it all once); errors and tracebacks still reach its stderr. Decided by RANK, which the
    launcher sets before the process starts (no collective needed)."""
    if not launched() or os.environ.get("RANK", "0") == "0":
        return
    import logging
    import sys
    import warnings

    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the life of the process
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"


def _state() -> Any:
    import torch
    from accelerate import PartialState

    # cpu=True makes a CPU-only launch a gloo process group (MULTI_CPU), as TRL's `use_cpu` config expects.
    return PartialState(cpu=not torch.cuda.is_available(), timeout=WAIT_TIMEOUT)


def is_main_process() -> bool:
    """The process that writes the run's files (always, without a launcher)."""
    return not launched() or _state().is_main_process


def wait_for_everyone() -> None:
    """A barrier across the launched processes (nothing without a launcher, or inside a main-only step)."""
    if launched() and not getattr(_alone, "active", False):
        _state().wait_for_everyone()


def on_main_process(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: every call runs on the main process only (`main_process_result`), e.g. an evaluation."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return main_process_result(lambda: fn(*args, **kwargs))

    return wrapper


def forget_zero3() -> None:
    """Every process drops transformers' global DeepSpeed ZeRO-3 config (left by the last trainer): with it, a model
    the main process loads alone (to evaluate, to sample) is partitioned by `deepspeed.zero.Init`, a collective the
    waiting processes never join (measured with ZeRO-3 on 2 CPU processes: the eval after GRPO died in gloo, "Received
    data size doesn't match expected size"). The next trainer sets its own again."""
    import sys

    deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    if deepspeed is not None:
        deepspeed.unset_hf_deepspeed_config()


def main_process_result(fn: Callable[[], T]) -> T:
    """`fn()` on the main process only; every process returns its result (pickled across), or raises its error.

    The other processes wait here. Called by every process at the same point (it is a collective), except
    inside another `main_process_result`, where only the main process is running: there it simply runs `fn`.
    """
    if not launched() or getattr(_alone, "active", False):
        return fn()
    from accelerate.utils import broadcast_object_list

    forget_zero3()

    state = _state()
    box: list[Any] = [None]
    if state.is_main_process:
        _alone.active = True
        try:
            box = [("ok", fn())]
        except BaseException as e:  # the others must not wait for ever: they fail with it
            broadcast_object_list([("error", f"{type(e).__name__}: {e}", isinstance(e, ValueError))], from_process=0)
            raise
        finally:
            _alone.active = False
    broadcast_object_list(box, from_process=0)
    status, *rest = box[0]
    if status == "error":
        message, user_error = rest
        raise (ValueError if user_error else RuntimeError)(f"the main process failed: {message}")
    return rest[0]
