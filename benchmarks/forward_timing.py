"""Not a benchmark: the model-forward timer that the generation benchmarks share (grpo_rollout_precision.py,
cpu_gqa_prefill.py)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def timed_forward(model) -> Iterator[dict[str, float]]:
    """Within the block, each call of `model.forward` adds its seconds and a count to the dict yielded: `prefill_s`,
    `prefill_calls` for calls that encode more than one new token a row, `decode_s`, `decode_steps` for decoding
    steps (one token a row). The forward in place on entry is put back on leaving."""
    inner = model.forward
    seconds = {"prefill_s": 0.0, "prefill_calls": 0, "decode_s": 0.0, "decode_steps": 0}

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        decode = kwargs["input_ids"].shape[1] == 1
        seconds["decode_s" if decode else "prefill_s"] += time.perf_counter() - start
        seconds["decode_steps" if decode else "prefill_calls"] += 1
        return out

    model.forward = timed
    try:
        yield seconds
    finally:
        model.forward = inner
