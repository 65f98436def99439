"""The evaluation summary as rich tables: overall (with the do-nothing floor where the env gives one), pass@k /
pass^k, stop reasons, per category."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def do_nothing_floor(summary: dict) -> float | None:
    """The success an agent that does nothing would get on the evaluated episodes, where the env computes it (its
    env_metrics' `do_nothing_floor`: the service env's, per domain and over "all"); None elsewhere.

    >>> do_nothing_floor({"env_metrics": {"airline": {"do_nothing_floor": 0.5}}})
    0.5
    """
    figures = summary.get("env_metrics") or {}
    entry = figures.get("all") if "all" in figures else next(iter(figures.values())) if len(figures) == 1 else None
    return entry.get("do_nothing_floor") if isinstance(entry, dict) else None


def _overall(summary: dict) -> Table:
    lo, hi = summary["success_ci"]
    table = Table(title=f"{summary['policy']} on {summary['env']} / {summary['split']}", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("success", f"{_pct(summary['success'])}  (95% CI {_pct(lo)}–{_pct(hi)})")
    floor = do_nothing_floor(summary)
    if floor is not None:  # what the same tasks give an agent that does nothing: the score to beat
        table.add_row("do-nothing floor", _pct(floor))
    table.add_row(
        "tasks × samples", f"{summary['n_tasks']} × {summary['samples_per_task']} = {summary['n_episodes']}"
    )
    table.add_row("mean reward", f"{summary['mean_reward']:.3f}")
    table.add_row("mean progress", f"{summary['mean_progress']:.3f}")
    table.add_row("mean turns", f"{summary['mean_turns']:.2f}")
    table.add_row("env steps", str(summary["env_steps"]))
    table.add_row("tokens generated", str(summary["tokens_generated"]))
    table.add_row("wall", f"{summary['wall_s']:.1f} s")
    return table


def _pass_k(summary: dict) -> Table:
    # pass@k: any of k tries succeeds (capability); pass^k: all k succeed (reliability).
    table = Table(title="pass@k / pass^k")
    table.add_column("k", justify="right")
    table.add_column("pass@k", justify="right")
    table.add_column("pass^k", justify="right")
    for k, at_k in summary["pass@k"].items():
        table.add_row(k, _pct(at_k), _pct(summary["pass^k"][k]))
    return table


def _stop_reasons(summary: dict) -> Table:
    table = Table(title="stop reasons")
    table.add_column("reason")
    table.add_column("episodes", justify="right")
    total = max(summary["n_episodes"], 1)
    for reason, count in summary["stop_reasons"].items():
        table.add_row(reason, f"{count} ({_pct(count / total)})")
    return table


def _by_category(summary: dict) -> Table:
    table = Table(title="per category")
    table.add_column("category")
    table.add_column("episodes", justify="right")
    table.add_column("success", justify="right")
    for category, row in summary["by_category"].items():
        table.add_row(category, str(row["n"]), _pct(row["success"]))
    return table


def summary_tables(summary: dict) -> Group:
    """All tables of a summary.json, stacked, ready for `Console.print`."""
    return Group(_overall(summary), _pass_k(summary), _stop_reasons(summary), _by_category(summary))


def print_summary(summary: dict, console: Console | None = None) -> None:
    (console or Console()).print(summary_tables(summary))
