"""The GPU check's rehearsal: `benchmarks/gpu_check.py --device cpu --shape tiny` through the code path the GPU run
takes (a fresh process per part, the random model saved and loaded, turnforge's SFT / rollout / GRPO entry points),
so the one GPU run cannot fail on an import, a dtype or a path. The 4B shape is never built here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "benchmarks" / "gpu_check.py"
RETAIL = REPO.parent / "shared" / "data" / "tau2" / "retail"
BATCHES = [1, 2]
SMALL = ["--device", "cpu", "--shape", "tiny", "--seq-len", "256", "--sft-steps", "1", "--max-turns", "1",
         "--max-new-tokens", "4", "--batches", ",".join(map(str, BATCHES)), "--retail-dir", str(RETAIL)]
needs_retail = pytest.mark.skipif(not (RETAIL / "tasks.json").is_file(), reason="../shared/data/tau2 absent")


@pytest.fixture
def benchmarks_on_path():
    sys.path.insert(0, str(CHECK.parent))
    yield
    sys.path.remove(str(CHECK.parent))


def _rehearse(out: Path, budget_s: int) -> dict:
    done = subprocess.run([sys.executable, str(CHECK), *SMALL, "--budget-s", str(budget_s), "--out", str(out)],
                          capture_output=True, text=True, timeout=budget_s + 180, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((out / "gpu_check.json").read_text())


def test_parts_import_what_every_row_needs(benchmarks_on_path):
    """The parts import everything at the top: a part too short to reach a row has still imported it."""
    import gpu_check_parts

    assert callable(gpu_check_parts.run_one_part)


def test_rows_returns_only_measured_rows_and_writes_every_status(tmp_path, benchmarks_on_path):
    """A row past the deadline or one that raised is written with its status and never handed back as measured:
    the naive loop's row used to come back as {"status": "not reached: time"}, and the rows that read its
    tokens/s failed with KeyError."""
    import time

    from gpu_check_parts import Rows

    def broken() -> dict:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail")

    live, late = Rows(tmp_path, "rollouts", time.time() + 60), Rows(tmp_path, "rollouts", time.time() - 1)
    assert live.run("ok", lambda: {"tokens_per_s": 1.0}) == {"row": "ok", "status": "measured", "tokens_per_s": 1.0}
    assert live.run("broken", broken) is None
    assert late.run("late", lambda: {"tokens_per_s": 1.0}) is None
    written = [json.loads(line) for line in (tmp_path / "rows_rollouts.jsonl").read_text().splitlines()]
    assert [(r["row"], r["status"]) for r in written] == [
        ("ok", "measured"), ("broken", "failed: RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"),
        ("late", "not reached: time")]


def test_a_row_cut_short_by_a_kill_reads_as_its_part_ended(tmp_path, benchmarks_on_path):
    """A part killed at its cap while writing a row leaves half a JSON line: that row reads as the part ended
    ("not reached: time"), the rows before it as measured, and the table is still written."""
    from gpu_check import collect_rows, planned_rows

    first_sft = next(row for part, row in planned_rows(BATCHES) if part == "sft")
    (tmp_path / "rows_sft.jsonl").write_text(
        json.dumps({"part": "sft", "row": first_sft, "status": "measured"}) + '\n{"part": "sft", "ro')
    rows = collect_rows(tmp_path, {"sft": "not reached: time", "rollouts": None, "grpo": None}, BATCHES)
    sft = [r["status"] for r in rows if r["part"] == "sft"]
    assert sft[:2] == ["measured", "not reached: time"]
    assert len(rows) == len(planned_rows(BATCHES))


@pytest.mark.slow  # ~42 s: every row of the GPU check on the CPU; make test-all, and before a GPU session
@needs_retail
def test_rehearsal_writes_every_row_and_none_failed(tmp_path, benchmarks_on_path):
    from gpu_check import planned_rows

    result = _rehearse(tmp_path, budget_s=40)
    planned = planned_rows(BATCHES)
    assert [(r["part"], r["row"]) for r in result["rows"]] == planned
    table = (tmp_path / "gpu_check.md").read_text()
    rows = [line.split(" | ")[:2] for line in table.splitlines() if line.startswith("| ") and "| status |" not in line]
    assert rows == [[f"| {part}", row] for part, row in planned]
    # Rows may run out of this tiny budget, never fail: a failure here would be the GPU run's too.
    assert [r for r in result["rows"] if not r["status"].startswith(("measured", "not reached: time", "skipped: Liger"))] == []
    assert result["device_name"] == "cpu" and result["parameters"] > 0 and result["peak_bf16_flops"] is None
    assert {"setup.log", "sft.log", "rollouts.log", "grpo.log"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.slow
@needs_retail
def test_rehearsal_measures_every_row(tmp_path):
    """Every row through once (minutes on 2 cores): each code path the GPU run takes, run before it."""
    result = _rehearse(tmp_path, budget_s=600)
    assert [(r["row"], r["status"]) for r in result["rows"] if r["status"] != "measured" and not r["status"].startswith("skipped: Liger")] == []
