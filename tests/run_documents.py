"""What every run writes besides its results: the report (Markdown, HTML, plots) and its final model's card."""

from __future__ import annotations

from pathlib import Path

from turnforge.rundir import read_run


def assert_documented(out: Path) -> None:
    assert (out / "report.md").exists() and (out / "report.html").exists()
    assert any((out / "plots").glob("*.png")), "no learning curve plotted"
    final = read_run(out).final_model()
    assert final is not None and (final[1] / "README.md").read_text().startswith("---\n"), final
