"""The report of a run: report.md and one self-contained report.html (plots embedded), from the run directory.

    turnforge report runs/qs                      # runs/qs/report.md, report.html, plots/
    turnforge report runs/a runs/b --compare      # their evaluations side by side (`turnforge eval` folders too)

One function, `comparison_rows`, decides what is compared (success with its 95 % interval, pass@k,
pass^k, mean reward / progress / turns, success per category); the terminal table and the Markdown
table both render its rows, so they never disagree. With exactly two evaluations a Δ column (second
minus first, in percentage points for rates) shows the change, e.g. base -> sft.

The report then gives, evaluation after evaluation: success / pass@k / pass^k / mean reward per category with
Wilson intervals, stop reasons, failure modes (`turnforge.eval.failures`, with one example each); for a run also
each stage's tokens, wall time and settings, the learning curves (`turnforge.eval.curves`) and the resolved
recipe. Every number is read from the run's files. The HTML is the Markdown rendered by markdown-it (rich's
own dependency) with the PNGs inlined as base64, so it opens anywhere without the plots folder.
"""

from __future__ import annotations

import base64
import html
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from turnforge.eval.curves import stage_curves
from turnforge.eval.metrics import summarize
from turnforge.eval.table import do_nothing_floor
from turnforge.rundir import (
    EPISODES_FILE,
    RunFiles,
    check_out_dir,
    check_owner,
    claim,
    owner_of,
    read_eval,
    read_run,
)
from turnforge.types import read_trajectories

REPORT_FILE = "report.md"
REPORT_HTML = "report.html"
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
    floors = [do_nothing_floor(s) for s in runs]
    if any(f is not None for f in floors):  # the service env's: what the same tasks give an agent that does nothing
        rows.append(Row("do-nothing floor", floors))
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
        if not result["steps"]:  # nothing kept (or the greedy play solved every task it aimed at)
            return f"kept {y['kept']} of {y['sampled']} sampled episodes, none to learn from: model unchanged"
        return (
            f"kept {y['kept']} of {y['sampled']} sampled episodes (yield {100 * y['yield']:.1f}%), "
            f"then {result['steps']} SFT steps on {result['examples']} examples"
        )
    if kind in ("grpo", "envtune") and "episodes" in result:
        text = f"{result['steps']} steps, {result['episodes']} episodes"
        if result.get("drawn_reward_quarters"):
            first, last = result["drawn_reward_quarters"]
            text += f", reward on the drawn tasks {first:.2f} → {last:.2f} (first → last quarter)"
        return text
    if kind == "distill" and "episodes" in result:
        text = f"{result['steps']} steps, {result['episodes']} episodes"
        if result.get("teacher_kl_quarters"):
            first, last = result["teacher_kl_quarters"]
            text += f", KL to the teacher {first:.3f} → {last:.3f} (first → last quarter)"
        return text
    return ", ".join(f"{k} {v}" for k, v in result.items() if isinstance(v, int | float))




@dataclass
class Column:
    """One evaluation in the report's tables: its label, summary.json, episodes file and the report's folder."""

    label: str
    summary: dict[str, Any]
    episodes: Path | None
    link_base: Path


def _link(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path.resolve())


def _pct_ci(successes: int, n: int, rate: float, interval: list[float]) -> str:
    return f"{100 * rate:.1f}% ({100 * interval[0]:.0f}–{100 * interval[1]:.0f}, n={n})" if n else "–"


def category_table(columns: list[Column]) -> list[str]:
    """Per category, evaluation after evaluation: success (Wilson 95 %), best-k pass@k and pass^k, mean reward."""
    per_column: list[dict[str, dict[str, Any]]] = []
    for col in columns:
        groups: dict[str, list] = {}
        for traj in read_trajectories(col.episodes) if col.episodes else []:
            groups.setdefault(traj.category, []).append(traj)
        per_column.append({
            category: summarize(episodes, env=col.summary["env"], split=col.summary["split"], policy=col.summary["policy"],
                                samples_per_task=col.summary["samples_per_task"])
            for category, episodes in groups.items()
        })
    lines = ["| category | evaluation | success (95% CI) | pass@k | pass^k | mean reward |", "|---|---|---:|---:|---:|---:|"]
    for category in sorted({c for summaries in per_column for c in summaries}):
        for col, summaries in zip(columns, per_column, strict=True):
            s = summaries.get(category)
            if s is None:
                continue
            k = max(s["pass@k"], key=int, default=None)
            at_k = f"pass@{k} {100 * s['pass@k'][k]:.1f}%" if k else "–"
            hat_k = f"pass^{k} {100 * s['pass^k'][k]:.1f}%" if k else "–"
            success = _pct_ci(round(s["success"] * s["n_episodes"]), s["n_episodes"], s["success"], s["success_ci"])
            lines.append(f"| {category} | {col.label} | {success} | {at_k} | {hat_k} | {s['mean_reward']:.3f} |")
    return lines


def stop_reason_table(columns: list[Column]) -> list[str]:
    """Episodes per stop reason, per evaluation (count and share)."""
    reasons = list(dict.fromkeys(r for col in columns for r in col.summary["stop_reasons"]))
    lines = ["| stop reason | " + " | ".join(c.label for c in columns) + " |", "|---|" + "---:|" * len(columns)]
    for reason in reasons:
        cells = []
        for col in columns:
            n, total = col.summary["stop_reasons"].get(reason, 0), max(col.summary["n_episodes"], 1)
            cells.append(f"{n} ({100 * n / total:.0f}%)" if n else "–")
        lines.append(f"| {reason} | " + " | ".join(cells) + " |")
    return lines


def failure_table(columns: list[Column]) -> list[str]:
    """Failure modes per evaluation: episodes showing it (total count), and a link to the first such episode."""
    from turnforge.eval.failures import (  # reads env judging code: only when reporting
        FAILURE_MODES,
        failure_modes,
    )

    found = {col.label: failure_modes(col.episodes) for col in columns if col.episodes}
    lines = ["| failure mode | " + " | ".join(c.label for c in columns) + " |", "|---|" + "---|" * len(columns)]
    for mode in FAILURE_MODES:
        cells = []
        for col in columns:
            seen = found.get(col.label, {}).get(mode)
            if seen is None or not seen.episodes:
                cells.append("–")
                continue
            file, _, line = seen.example.rpartition(":")
            link = _link(Path(file), col.link_base)
            cells.append(f"{seen.episodes} ep. ({seen.count}); e.g. [{seen.example_task}]({link}) line {line}")
        lines.append(f"| {mode.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return lines


def user_fault_table(columns: list[Column]) -> list[str]:
    """Per domain and evaluation, the failed episodes a user-side fault explains (the service env's
    env_metrics `user_faults`, envs/service/user_faults.py); empty when no evaluation has them."""
    lines = []
    for col in columns:
        for domain, figures in sorted((col.summary.get("env_metrics") or {}).items()):
            faults = figures.get("user_faults") if isinstance(figures, dict) else None
            if not faults:
                continue
            seen = ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in faults["by_fault"].items() if n) or "–"
            lines.append(f"| {domain} | {col.label} | {faults['failed']} | {faults['attributed']} "
                         f"({100 * faults['share']:.0f}%) | {seen} |")
    if not lines:
        return []
    return ["## Failures attributed to the user simulator", "",
            "Failed episodes showing a user-side fault (rules in docs/decisions.md; an episode may show several).", "",
            "| domain | evaluation | failed | user-side fault | faults |", "|---|---|---:|---:|---|", *lines, ""]


def evaluation_sections(columns: list[Column]) -> list[str]:
    """The sections every report has: the comparison, per category, stop reasons, failure modes (and the user
    side's faults where the env attributes them)."""
    summaries = {c.label: c.summary for c in columns}
    return [
        "## Evaluation", "", comparison_markdown(summaries), "",
        "## Per category (95% Wilson intervals)", "", *category_table(columns), "",
        "## Stop reasons", "", *stop_reason_table(columns), "",
        "## Failure modes", "",
        "Episodes showing each mode (total turns or actions in brackets), with the first such episode "
        "(`turnforge view` browses them).", "", *failure_table(columns), "", *user_fault_table(columns),
    ]  # fmt: skip


def _stage_tokens(run: RunFiles, stage: dict[str, Any]) -> str:
    """Tokens a stage trained on or generated, as its files record them; "–" when they do not."""
    result = stage["result"]
    if "tokens" in result:
        return f"{result['tokens']} trained"
    summary = result.get("summary") or (f"{stage['dir']}/summary.json" if stage["kind"] == "collect" else None)
    if summary and run.path(summary).exists():
        return f"{json.loads(run.path(summary).read_text(encoding='utf-8'))['tokens_generated']} generated"
    return "–"


def stage_sections(run: RunFiles) -> list[str]:
    """Each stage's status, wall time, tokens and result, then its settings as the resolved recipe holds them."""
    lines = ["## Stages", "", "| stage | kind | status | wall | tokens | result |", "|---|---|---|---:|---:|---|"]
    for stage in run.summary["stages"].values():
        text = stage_result_text(stage["kind"], stage["result"])
        lines.append(f"| `{stage['dir']}` | {stage['kind']} | {stage['status']} | {stage['wall_s']:.1f} s | "
                     f"{_stage_tokens(run, stage)} | {text} |")
    recipe = tomllib.loads(run.recipe_toml)
    lines += ["", "## Stage settings", "", "| stage | settings |", "|---|---|"]
    for stage_id, table in zip(run.summary["stages"], recipe.get("stages", []), strict=False):
        lines.append(f"| {stage_id} | " + ", ".join(f"`{k} = {json.dumps(v)}`" for k, v in table.items()) + " |")
    return [*lines, ""]


def curve_sections(run: RunFiles) -> list[str]:
    """The learning curves of every training stage (PNGs in plots/)."""
    images = []
    for stage_id, stage in run.summary["stages"].items():
        for curve in stage_curves(run.dir, stage_id, run.path(stage["dir"]), run.dir / PLOTS_DIR):
            images.append(f"![{stage_id} {curve.what}]({curve.png})")
    return ["## Training curves", "", *images, ""] if images else []


def write_report(run_dir: str | Path) -> Path:
    """RUN/report.md, RUN/report.html and RUN/plots/*.png from the run directory's files; returns report.md."""
    run = read_run(run_dir)
    summary = run.summary
    columns = [
        Column(name, s, run.eval_episodes().get(name), run.dir) for name, s in summary["eval"].items()
    ]
    lines = [f"# {summary['recipe']}", ""]
    if summary.get("description"):
        lines += [summary["description"], ""]
    lines += [f"Run directory `{run.dir}`; model `{summary['model']}`; the last invocation took {summary['wall_s']:.1f} s.", ""]
    if columns:
        lines += evaluation_sections(columns)
    lines += [*stage_sections(run), *curve_sections(run)]
    lines += ["## Recipe (resolved)", "", "```toml", run.recipe_toml.rstrip(), "```", ""]
    return _write_both(run.dir, "\n".join(lines), summary["recipe"])


RESULTS_BEGIN = "<!-- turnforge results: begin -->"
RESULTS_END = "<!-- turnforge results: end -->"


def results_table(run_dir: str | Path) -> str:
    """The run's evaluations as a README table: the model each evaluated (and what trained it), success with its
    95 % interval, mean progress, the training stage's wall time; then the machine and the end-to-end time.

    Every number is read from the run directory, so a README block made from it cannot drift from the run."""
    from turnforge.recipes import parse_recipe

    run = read_run(run_dir)
    recipe = parse_recipe(tomllib.loads(run.recipe_toml))
    stages = run.summary["stages"]
    lines = ["| model | success (95 % CI) | mean progress | training wall | eval wall |", "|---|---:|---:|---:|---:|"]
    for index, stage in enumerate(recipe.stages):
        done = stages.get(stage.id)
        if stage.kind != "eval" or done is None or "summary" not in done["result"]:
            continue
        summary = run.summary["eval"][run.path(done["result"]["summary"]).parent.name]
        source = recipe.model_source(index)
        if source is None:
            label, trained = f"untrained {run.summary['model']}", "–"
        else:
            trainer = stages[source]
            label = f"{source}: {stage_result_text(trainer['kind'], trainer['result'])}"
            trained = f"{trainer['wall_s']:.0f} s"
        n, low, high = summary["n_episodes"], *summary["success_ci"]
        lines.append(f"| {label} | **{100 * summary['success']:.1f} %** ({100 * low:.1f}–{100 * high:.1f}, n = {n}) | "
                     f"{100 * summary['mean_progress']:.0f} % | {trained} | {done['wall_s']:.0f} s |")
    total = sum(s["wall_s"] for s in stages.values()) + (run.summary.get("base_model_s") or 0)
    machine = run.summary.get("machine")
    where = (f"{machine['cpu']}, {machine['cores']} cores, torch {machine['torch']}" if machine else "machine not recorded")
    lines += ["", f"Recipe `{run.summary['recipe']}`, {total / 60:.1f} min end to end (stages + building the base "
              f"model), on {where}; finished {run.summary.get('finished', 'at an unrecorded time')}."]
    return "\n".join(lines)


def update_readme(readme: str | Path, run_dir: str | Path) -> Path:
    """Replace the block between RESULTS_BEGIN and RESULTS_END in `readme` by `results_table(run_dir)`."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    begin, end = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
    if begin < 0 or end < begin:
        raise ValueError(f"{readme} has no {RESULTS_BEGIN} ... {RESULTS_END} block to fill")
    block = f"{RESULTS_BEGIN}\n{results_table(run_dir)}\n"
    readme.write_text(text[:begin] + block + text[end:], encoding="utf-8")
    return readme


def write_comparison(run_dirs: list[str | Path], out_dir: str | Path) -> Path:
    """OUT/report.md + report.html: the evaluations of several folders side by side: a recipe run's (`RUN:EVAL`
    columns) and a `turnforge eval` folder's (`EVAL`), in any mix."""
    out = Path(out_dir)
    check_out_dir(out)
    check_owner(out, "compare")  # a run's own report.md is not replaced by a comparison
    folders = [Path(d) for d in run_dirs]
    names = [folder.resolve().name for folder in folders]
    if len(set(names)) < len(names):  # two folders named alike: tell them apart by their full paths
        names = [str(folder) for folder in folders]
    compared = [comparison_columns(folder, name, out) for folder, name in zip(folders, names, strict=True)]
    columns = [column for found, _ in compared for column in found]
    if not columns:
        raise ValueError(f"none of {', '.join(map(str, run_dirs))} has an evaluation to compare")
    lines = ["# " + " vs ".join(names), "", *(line for _, line in compared), ""]
    lines += evaluation_sections(columns)
    out.mkdir(parents=True, exist_ok=True)
    claim(out, "compare")
    return _write_both(out, "\n".join(lines), " vs ".join(names))


def comparison_columns(folder: Path, name: str, out: Path) -> tuple[list[Column], str]:
    """The evaluations that `folder` holds, as columns of a comparison written to `out`, and the line that says what
    it is: a `turnforge eval` folder's one evaluation (column NAME), or a recipe run's evaluations (NAME:EVAL)."""
    if owner_of(folder) == "eval":
        summary = read_eval(folder)
        episodes = folder / EPISODES_FILE
        line = f"- `{name}`: `turnforge eval` of `{summary['policy']}` on {summary['env']}, split {summary['split']}"
        return [Column(name, summary, episodes if episodes.is_file() else None, out)], line
    if owner_of(folder) is None:
        raise FileNotFoundError(f"{folder} is neither a `turnforge run` directory nor a `turnforge eval` folder; give "
                                "the --out of either")
    run = read_run(folder)
    columns = [Column(f"{name}:{ev}", s, run.eval_episodes().get(ev), out) for ev, s in run.summary["eval"].items()]
    return columns, f"- `{name}`: recipe {run.summary['recipe']}, model `{run.summary['model']}`"


def _write_both(out: Path, markdown: str, title: str) -> Path:
    (out / REPORT_FILE).write_text(markdown, encoding="utf-8")
    (out / REPORT_HTML).write_text(report_html(markdown, title, out), encoding="utf-8")
    return out / REPORT_FILE


_STYLE = """body{font-family:system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0}th,td{border:1px solid #ccc;padding:.25rem .5rem;font-size:.9rem}
th{background:#f3f3f3}pre{background:#f6f6f6;padding:.75rem;overflow:auto}img{max-width:48%;margin:.25rem}"""


def report_html(markdown: str, title: str, base: Path) -> str:
    """One self-contained HTML page: the Markdown rendered, every local PNG inlined as a data: URI."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)

    def inline(match: re.Match) -> str:
        png = base / html.unescape(match.group(1))
        if not png.is_file():
            return match.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"'

    body = re.sub(r'src="([^":]+\.png)"', inline, body)
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}</body></html>\n")
