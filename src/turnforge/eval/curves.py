"""Learning curves of a run's training stages: loss, reward, success, KL and entropy per step, as PNGs.

A training stage logs TRL's metrics to `metrics.jsonl` (one line per logging step: `step`, `loss`, GRPO's
`reward`, `kl`, `entropy`) and GRPO its rollouts to `rollouts.jsonl` (one line per batch: `success`, ...; distill's `teacher_kl`). Each
key a stage logged becomes one plot, `plots/<stage>_<key>.png`; a key it never logged gives none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CURVES = (
    # (file, x key, y key, what the plot shows)
    ("metrics.jsonl", "step", "loss", "training loss"),
    ("metrics.jsonl", "step", "reward", "reward per step"),
    ("rollouts.jsonl", "batch", "success", "rollout success per batch"),
    ("rollouts.jsonl", "batch", "drawn_reward", "reward of the drawn tasks per batch (before dynamic sampling)"),
    ("metrics.jsonl", "step", "kl", "KL to the reference"),
    ("rollouts.jsonl", "batch", "teacher_kl", "reverse KL to the teacher per generated token (distill)"),
    ("metrics.jsonl", "step", "entropy", "entropy"),
)  # fmt: skip


@dataclass
class Curve:
    """One plotted curve: its stage, key, title and the PNG (relative to the run directory)."""

    stage: str
    key: str
    what: str
    png: Path


def read_points(path: Path, x: str, y: str) -> list[tuple[float, float]]:
    """(x, y) of every JSON line of `path` holding both as numbers; [] when the file is absent."""
    points = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(entry, dict) and isinstance(entry.get(x), int | float) and isinstance(entry.get(y), int | float):
                points.append((entry[x], entry[y]))
    return points


def quarter_means(values: list[float]) -> tuple[float, float] | None:
    """The means of the first and of the last quarter of `values` (a quarter is at least one value); None for none.
    How a training curve moved from its start to its end, less noisy than its first and last points."""
    if not values:
        return None
    quarter = max(1, len(values) // 4)
    return sum(values[:quarter]) / quarter, sum(values[-quarter:]) / quarter


def plot_points(points: list[tuple[float, float]], png: Path, title: str, xlabel: str, ylabel: str) -> Path:
    """A line plot of `points` saved to `png`."""
    from matplotlib.figure import Figure  # the object API renders with Agg; no pyplot, no display needed

    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, marker="o" if len(points) < 30 else None)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    return png


def stage_curves(run_dir: Path, stage_id: str, stage_dir: Path, plots_dir: Path) -> list[Curve]:
    """Every curve `stage_dir`'s logs hold, plotted into `plots_dir` (`<stage>_<key>.png`)."""
    curves = []
    for file, x, key, what in CURVES:
        points = read_points(stage_dir / file, x, key)
        if points:
            xlabel = "optimizer step" if x == "step" else "rollout batch"
            png = plot_points(points, plots_dir / f"{stage_id}_{key}.png", f"{stage_id}: {what}", xlabel, what)
            curves.append(Curve(stage_id, key, what, png.relative_to(run_dir)))
    return curves
