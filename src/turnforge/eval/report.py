"""The report of a run: evaluations side by side (rich on the terminal, Markdown in report.md) and loss plots.

One function, `comparison_rows`, decides what is compared (success with its 95 % interval, pass@k,
pass^k, mean reward / progress / turns, success per category); the terminal table and the Markdown
table both render its rows, so they never disagree. With exactly two evaluations a Δ column (second
minus first, in percentage points for rates) shows the change, e.g. base -> sft.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

REPORT_FILE = "report.md"
PLOTS_DIR = "plots"


@dataclass
class Row:
    """One compared metric: a value per evaluation (None where an evaluation lacks it)."""

    label: str
    values: list[float | None]
    rate: bool = True
    """A rate in [0, 1] (shown as %, Δ in points) rather than a plain number."""
    intervals: list[list[float] | None] | None = None


def comparison_rows(summaries: dict[str, dict[str, Any]]) -> list[Row]:
    """The rows that compare evaluation summaries (summary.json dicts), in display order."""
    runs = list(summaries.values())
    rows = [
        Row("success (95% CI)", [s["success"] for s in runs], intervals=[s.get("success_ci") for s in runs]),
    ]
    for key in ("pass@k", "pass^k"):
        ks = sorted({k for s in runs for k in s[key]}, key=int)
        rows += [Row(f"{key.replace('k', k)}", [s[key].get(k) for s in runs]) for k in ks if k != "1"]
    rows += [
        Row("mean reward", [s["mean_reward"] for s in runs], rate=False),
        Row("mean progress", [s["mean_progress"] for s in runs]),
        Row("mean turns", [s["mean_turns"] for s in runs], rate=False),
        Row("episodes", [s["n_episodes"] for s in runs], rate=False),
    ]
    categories = sorted({c for s in runs for c in s["by_category"]})
    rows += [Row(f"  {c}", [s["by_category"].get(c, {}).get("success") for s in runs]) for c in categories]
    return rows


def _cell(row: Row, i: int) -> str:
    value = row.values[i]
    if value is None:
        return "–"
    if not row.rate:
        return f"{value:g}" if float(value).is_integer() else f"{value:.2f}"
    text = f"{100 * value:.1f}%"
    interval = row.intervals[i] if row.intervals else None
    return f"{text} ({100 * interval[0]:.1f}–{100 * interval[1]:.1f})" if interval else text


def _delta(row: Row) -> str:
    first, last = row.values[0], row.values[-1]
    if first is None or last is None or row.label == "episodes":
        return ""
    change = last - first
    return f"{100 * change:+.1f} pp" if row.rate else f"{change:+.2f}"


def _header(summaries: dict[str, dict[str, Any]]) -> list[str]:
    return ["metric", *summaries, *(["Δ"] if len(summaries) == 2 else [])]


def _cells(row: Row, n: int) -> list[str]:
    return [row.label, *(_cell(row, i) for i in range(n)), *([_delta(row)] if n == 2 else [])]


def comparison_table(summaries: dict[str, dict[str, Any]], title: str = "evaluation") -> Table:
    """The comparison as a rich table (the per-category rows are indented under "success per category")."""
    table = Table(title=title)
    for i, name in enumerate(_header(summaries)):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in comparison_rows(summaries):
        table.add_row(*_cells(row, len(summaries)))
    return table


def comparison_markdown(summaries: dict[str, dict[str, Any]]) -> str:
    """The comparison as a Markdown table."""
    header = _header(summaries)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
    for row in comparison_rows(summaries):
        cells = _cells(row, len(summaries))
        cells[0] = cells[0].replace("  ", "&nbsp;&nbsp;", 1) if cells[0].startswith("  ") else cells[0]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_loss(metrics_file: Path, png: Path, title: str, key: str = "loss") -> Path | None:
    """`key` (the training loss; GRPO's mean episode `reward`) against step from a metrics.jsonl (lines with
    `step` and `key`); None when it has none."""
    points = []
    if metrics_file.exists():
        for line in metrics_file.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if isinstance(entry, dict) and entry.get(key) is not None and "step" in entry:
                points.append((entry["step"], entry[key]))
    if not points:
        return None
    from matplotlib.figure import Figure  # the object API renders with Agg; no pyplot, no display needed

    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    steps, losses = zip(*points, strict=True)
    ax.plot(steps, losses, marker="o" if len(points) < 30 else None)
    ax.set(xlabel="optimizer step", ylabel="training loss" if key == "loss" else f"mean {key}", title=title)
    ax.grid(alpha=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120, bbox_inches="tight")
    return png


def stage_result_text(kind: str, result: dict[str, Any]) -> str:
    """A stage's done.json result in a few words, for the report's stage table."""
    if kind in ("collect", "eval"):
        episodes = result.get("episodes", result.get("n_episodes"))
        return f"{episodes} episodes, success {100 * result['success']:.1f}%"
    if kind == "sft":
        return (
            f"{result['steps']} steps on {result['examples']} examples, mean loss {result['train_loss']:.3f}"
        )
    if kind == "rft":
        y = result["yield"]
        if not result["steps"]:
            return f"kept 0 of {y['sampled']} sampled episodes: model unchanged"
        return (
            f"kept {y['kept']} of {y['sampled']} sampled episodes (yield {100 * y['yield']:.1f}%), "
            f"then {result['steps']} SFT steps on {result['examples']} examples"
        )
    if kind in ("grpo", "envtune") and "episodes" in result:
        return f"{result['steps']} steps, {result['episodes']} episodes"
    return ", ".join(f"{k} {v}" for k, v in result.items() if isinstance(v, int | float))


def write_report(
    out_dir: Path, summary: dict[str, Any], recipe_toml: str, loss_files: dict[str, Path]
) -> Path:
    """OUT/report.md (+ OUT/plots/<stage>_loss.png per training stage, <stage>_reward.png for GRPO) from the
    run's summary.json dict."""
    out_dir = Path(out_dir)
    lines = [f"# {summary['recipe']}", ""]
    if summary.get("description"):
        lines += [summary["description"], ""]
    lines += [
        f"Run directory `{out_dir}`; model `{summary['model']}`; this invocation took {summary['wall_s']:.1f} s.",
        "",
    ]
    if summary["eval"]:
        lines += ["## Evaluation", "", comparison_markdown(summary["eval"]), ""]
    lines += ["## Stages", "", "| stage | kind | status | wall | result |", "|---|---|---|---:|---|"]
    for stage in summary["stages"].values():
        text = stage_result_text(stage["kind"], stage["result"])
        lines.append(
            f"| `{stage['dir']}` | {stage['kind']} | {stage['status']} | {stage['wall_s']:.1f} s | {text} |"
        )
    lines.append("")
    plots = []
    for stage_id, metrics in loss_files.items():
        for key, what in (("loss", "training loss"), ("reward", "reward per step")):
            png = plot_loss(metrics, out_dir / PLOTS_DIR / f"{stage_id}_{key}.png", f"{stage_id}: {what}", key)
            if png is not None:
                plots.append(f"![{stage_id} {what}]({png.relative_to(out_dir)})")
    if plots:
        lines += ["## Training curves", "", *plots, ""]
    lines += ["## Recipe (resolved)", "", "```toml", recipe_toml.rstrip(), "```", ""]
    path = out_dir / REPORT_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
