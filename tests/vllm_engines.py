"""What the vLLM tests share: the reason they skip, the engine settings they run vLLM's CPU build with, and how
two runs' episodes are compared.

The vLLM tests (marked `vllm`) run in .venv-vllm (`make install-vllm`; `make test` runs them there): vLLM's CPU
build needs transformers below 5.20, which .venv does not have. Elsewhere they skip, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from turnforge.types import Trajectory

VLLM_ABSENT = ("vLLM is not installed in this environment: the vLLM tests run in .venv-vllm "
               "(make install-vllm; make test runs them there)")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=VLLM_ABSENT)
needs_vllm_engine = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or " " in sys.prefix,
    reason=VLLM_ABSENT if importlib.util.find_spec("vllm") is None else (
        "vLLM's CPU engine cannot start from a path with a space (turnforge.policies.vllm.CPU_PATH_WITH_SPACE): "
        "clone under a path without spaces to run the engine tests"))

TEST_ENGINE = {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": 256 * 2**20}
"""The tiny model as the hf policy runs it on a CPU (float32), without torch.compile (it doubles the ~1 min an
engine takes to start on 2 cores, for nothing in a test), with a 256 MiB KV cache (64k tokens of the tiny model)."""


def assert_same_episodes(ours: list[Trajectory], theirs: list[Trajectory], logprob_tol: float | None = None) -> None:
    """The same episodes token for token (messages, generated ids per turn, stop reason, score), and their
    log-probabilities within `logprob_tol` when given."""
    assert [e.key for e in ours] == [e.key for e in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert [t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns], a.key
        assert [m.to_dict() for m in a.messages] == [m.to_dict() for m in b.messages], a.key
        assert (a.stop_reason, a.score) == (b.stop_reason, b.score), a.key
        if logprob_tol is not None:
            for k, (x, y) in enumerate(zip(a.turns, b.turns, strict=True)):
                assert x.logprobs == pytest.approx(y.logprobs, abs=logprob_tol), (a.key, k)

COLOCATE_MEMORY_SHARE = round(min(0.5, 3 * 2**30 / (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))), 3)
"""TRL's `vllm_gpu_memory_utilization` for its colocated engine on vLLM's CPU backend: the share of the machine's
memory vLLM reserves, the trainer's process included (~2 GiB after a tiny SFT), the rest for the KV cache; 3 GiB
(0.05 of 24 GiB left no KV cache)."""


def colocate_memory_share(kv_bytes: int = 2**30) -> float:
    """`COLOCATE_MEMORY_SHARE` measured now: this process's resident memory plus `kv_bytes` of KV cache, as a share of
    the machine's. A test after another colocated one in the same process starts bigger (an earlier engine and
    trainer not all freed: 3.0 GiB resident, so the fixed 3 GiB share left -0.01 GiB of KV cache and vLLM refused)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return round(min(0.5, (resident + kv_bytes) / (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))), 3)

