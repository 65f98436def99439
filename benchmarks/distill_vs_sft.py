"""From one short-SFT student, three ways to spend the same wall time on this CPU: (a) more SFT on the expert
demonstrations, (b) on-policy distillation from the full-budget SFT teacher, (c) GRPO; then each, the teacher and
the student on the same unseen household test tasks, greedy (docs/distill.md).

One recipe, run by the pipeline in one process: `quickstart_distill`'s collect, teacher and student stages, the
three arms back to back, then the evaluations (so the arms compete for the CPU with the same neighbours as far
as a shared machine allows). Each arm trains with a constant learning rate until its wall budget is spent: a
`BudgetCallback` stops TRL's loop at the first step end past `--budget-s` and writes `budget.json` beside the
stage's model (wall seconds, this process's CPU seconds over the same span, steps). `--teacher-steps` and
`--student-steps` scale the two SFT stages down when the full budget (1,000 and 500 steps) does not fit.

    .venv/bin/python benchmarks/distill_vs_sft.py --out runs/distill-bench --budget-s 600
    .venv/bin/python benchmarks/distill_vs_sft.py --out /tmp/pilot --budget-s 240 --teacher-steps 200 \
        --student-steps 60 --eval-tasks 200                      # the pilot of docs/distill.md

Writes OUT/report.md (the pipeline's comparison table and the KL curve) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import turnforge.recipes
import turnforge.train.grpo
import turnforge.train.sft
from turnforge.pipeline import run_recipe
from turnforge.recipes import load_recipe
from turnforge.train.runtime import MetricsFileCallback

ARMS = ("sft-more", "distill", "grpo")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class BudgetCallback(MetricsFileCallback):
    """turnforge's metrics file, and a wall-time budget: training stops at the first step end past it."""

    budget_s: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.cpu = time.perf_counter(), cpu_seconds()

    def on_step_end(self, args, state, control, **kwargs):
        if self.is_arm(args) and time.perf_counter() - self.started >= self.budget_s:
            control.should_training_stop = True

    def is_arm(self, args) -> bool:
        """Whether this trainer is an arm's (stages/NN-<arm>/checkpoints), not the teacher's or the student's SFT."""
        return self.budget_s is not None and Path(args.output_dir).parent.name.split("-", 1)[-1] in ARMS

    def on_train_end(self, args, state, control, **kwargs):
        if not self.is_arm(args):
            return
        out = {"wall_s": round(time.perf_counter() - self.started, 1), "cpu_s": round(cpu_seconds() - self.cpu, 1),
               "steps": state.global_step}
        (self.path.parent / "budget.json").write_text(json.dumps(out))


def arms_recipe(args) -> list[str]:
    """`--set` overrides of quickstart_distill, then the arms and evaluations appended (by `extend_recipe`)."""
    return [f"stages.sft-teacher.max_steps={args.teacher_steps}", f"stages.sft-student.max_steps={args.student_steps}",
            f"stages.eval-teacher.tasks={args.eval_tasks}", f"stages.eval-student.tasks={args.eval_tasks}",
            *(f"stages.eval-{m}.max_turns={args.eval_max_turns}" for m in ("teacher", "student") if args.eval_max_turns),
            *(f"stages.distill.{kv}" for kv in args.distill_set)]


def extend_recipe(path: Path, args) -> Path:
    """quickstart_distill with the arms (each to a step count no budget reaches) and their evaluations."""
    text = (Path(turnforge.recipes.__file__).parent / "quickstart_distill.toml").read_text()
    text = text[: text.index("[[stages]]\nkind = \"distill\"")]
    many = 100000  # training stops on the wall budget, not on a step count
    text += f"""
[[stages]]
kind = "distill"
name = "distill"
model = "sft-student"
teacher = "sft-teacher"
steps = {many}
tasks_per_step = 8
num_generations = 2
learning_rate = {args.distill_lr}
temperature = 1.0
max_new_tokens = 48
max_completion_length = 2048
trl = {{ bf16 = true, lr_scheduler_type = "constant" }}

[[stages]]
kind = "sft"
name = "more"
model = "sft-student"
data = ["collect"]
max_steps = {many}
learning_rate = {args.sft_lr}
lr_scheduler = "constant"
batch_size = 8
max_length = 1024
logging_steps = 25
packing = "prefix"
trl = {{ bf16 = true }}

[[stages]]
kind = "grpo"
name = "grpo"
model = "sft-student"
steps = {many}
tasks_per_step = 4
num_generations = 8
learning_rate = {args.grpo_lr}
temperature = 1.0
top_p = 0.9
beta = 0.1
step_advantage_weight = 1.0
max_new_tokens = 48
max_completion_length = 2048
dynamic_sampling = true
trl = {{ bf16 = true, lr_scheduler_type = "constant" }}
[stages.rewards]
outcome = 1.0
progress = 0.5
loop = 0.5
"""
    turns = f"max_turns = {args.eval_max_turns}\n" if args.eval_max_turns else ""
    for arm in ("distill", "sft-more", "grpo"):
        text += f"""
[[stages]]
kind = "eval"
name = "{arm.replace('-', '_')}"
model = "{arm}"
split = "test"
tasks = {args.eval_tasks}
temperature = 0.0
max_new_tokens = 48
batch_size = 200
{turns}"""
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=600.0)
    parser.add_argument("--teacher-steps", type=int, default=1000)
    parser.add_argument("--student-steps", type=int, default=500)
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--eval-max-turns", type=int, default=None,
                        help="cap the evaluations' turns (the env's own limit, 30, when unset): cheaper, lower success")
    parser.add_argument("--distill-lr", type=float, default=1e-4)
    parser.add_argument("--distill-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a distill-arm setting, e.g. divergence=gkd (repeatable)")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--grpo-lr", type=float, default=1e-4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    BudgetCallback.budget_s = args.budget_s
    for module in (turnforge.train.sft, turnforge.train.grpo):  # distill trains through grpo's train_on_episodes
        module.MetricsFileCallback = BudgetCallback  # every trainer's callbacks = [MetricsFileCallback(path)]
    recipe = load_recipe(extend_recipe(args.out / "bench_recipe.toml", args), overrides=arms_recipe(args))
    summary = run_recipe(recipe, args.out)
    print(table(args.out, summary))


def table(out: Path, summary: dict) -> str:
    rows = ["| model | training | wall s | CPU s | steps | success (95 % interval) | progress |", "|---|---|---|---|---|---|---|"]
    for name, stage in (("teacher", "sft-teacher"), ("student", "sft-student"), ("sft_more", "sft-more"),
                        ("distill", "distill"), ("grpo", "grpo")):
        ev = summary["eval"].get(name)
        budget = next(out.glob(f"stages/*-{stage}/budget.json"), None)
        spent = json.loads(budget.read_text()) if budget else {}
        if ev is None:
            continue
        low, high = ev["success_ci"]
        rows.append(f"| {name} | {stage} | {spent.get('wall_s', '')} | {spent.get('cpu_s', '')} | {spent.get('steps', '')} "
                    f"| {100 * ev['success']:.1f} % ({100 * low:.1f}–{100 * high:.1f}) | {100 * ev['mean_progress']:.1f} % |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
