"""The Hugging Face model card of a run's final model, written from the run directory (README.md next to the model).

    turnforge card runs/qs --out runs/qs/stages/07-grpo/model/README.md
    (written by every `turnforge run` into the final model's folder)

The YAML front matter and the `model-index` block are built by huggingface_hub's `ModelCardData` / `EvalResult`
(never hand-written YAML); the model-index holds every evaluation of the final model with its summary.json
values. The Markdown then gives the training pipeline (each stage's settings from config.toml, its result from
done.json), the data (sources, sizes, DPO pair reasons with counts), all evaluations side by side, a real
exchange from the run's episodes, usage (transformers, + peft for an adapter) and what was not evaluated.
Every number is read from a run file; what the run does not record is not written.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from turnforge.formats.families import is_tiny
from turnforge.report import comparison_markdown, stage_result_text
from turnforge.rundir import RunFiles, read_run
from turnforge.types import trajectory_records

CARD_FILE = "README.md"
EXAMPLE_CHARS = 1200  # a system prompt can run to pages (BFCL's function docs): the card shows its start


def final_model_evals(run: RunFiles, final_stage: str) -> dict[str, dict[str, Any]]:
    """The evaluations (name -> summary.json) whose model is the final one, as the resolved recipe says."""
    from turnforge.recipes import load_recipe

    recipe = load_recipe(run.dir / "config.toml")
    names = {
        s.name for i, s in enumerate(recipe.stages) if s.kind == "eval" and recipe.model_source(i) == final_stage
    }
    return {name: summary for name, summary in run.summary["eval"].items() if name in names}


def eval_results(evals: dict[str, dict[str, Any]]) -> list:
    """One `EvalResult` per metric of each evaluation: success, pass@k / pass^k (k > 1), mean reward, mean progress."""
    from huggingface_hub import EvalResult

    results = []
    for name, s in evals.items():
        metrics = [("success_rate", f"success ({name})", s["success"])]
        metrics += [(f"pass@{k}", f"pass@{k} ({name})", v) for k, v in s["pass@k"].items() if k != "1"]
        metrics += [(f"pass^{k}", f"pass^{k} ({name})", v) for k, v in s["pass^k"].items() if k != "1"]
        metrics += [("mean_reward", f"mean reward ({name})", s["mean_reward"]),
                    ("mean_progress", f"mean progress ({name})", s["mean_progress"])]
        for metric_type, metric_name, value in metrics:
            results.append(EvalResult(
                task_type="text-generation", task_name=f"multi-turn agent ({s['env']})",
                dataset_type=f"turnforge/{s['env']}", dataset_name=f"turnforge {s['env']}", dataset_split=s["split"],
                metric_type=metric_type, metric_name=metric_name, metric_value=value,
            ))
    return results


def _hub_datasets(recipe: dict[str, Any]) -> list[str]:
    return sorted({d[3:].partition(":")[0] for s in recipe.get("stages", []) for d in s.get("data", []) if d.startswith("hf:")})


def _is_hub_id(name: str) -> bool:
    return "/" in name and not Path(name).exists()


def card_data(run: RunFiles, final: tuple[str, Path, bool], evals: dict[str, dict[str, Any]]):
    """The front matter: base model, library, tags, datasets, license, pipeline tag and the model-index."""
    from huggingface_hub import ModelCardData

    recipe = tomllib.loads(run.recipe_toml)
    stage_id, _, adapter = final
    envs = sorted({s["env"] for s in run.summary["eval"].values()} | {recipe["env"]["name"]})
    kinds = list(dict.fromkeys(stage["kind"] for stage in run.summary["stages"].values() if stage["kind"] not in ("collect", "eval")))
    base = run.summary["model"]
    return ModelCardData(
        model_name=f"{run.summary['recipe']}-{stage_id}",
        base_model=base if _is_hub_id(base) else None,
        library_name="peft" if adapter else "transformers",
        tags=["turnforge", "agent", "multi-turn", *envs, *kinds],
        datasets=_hub_datasets(recipe) or None,
        # turnforge builds the tiny model itself (Apache-2.0, as turnforge); a hub model keeps its own licence
        license="apache-2.0" if is_tiny(base) else "other",
        pipeline_tag="text-generation",
        eval_results=eval_results(evals) or None,
    )


def pipeline_section(run: RunFiles) -> list[str]:
    """Each stage in order with its settings (config.toml) and its result (done.json)."""
    recipe = tomllib.loads(run.recipe_toml)
    lines = ["## Training pipeline", "", f"Recipe `{run.summary['recipe']}`, base model `{run.summary['model']}`.", ""]
    for (stage_id, stage), table in zip(run.summary["stages"].items(), recipe.get("stages", []), strict=False):
        settings = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in table.items() if k not in ("kind", "name"))
        lines.append(f"1. **{stage_id}** ({stage['kind']}, {stage['wall_s']:.1f} s): "
                     f"{stage_result_text(stage['kind'], stage['result'])}. Settings: {settings}")
    return [*lines, ""]


def data_section(run: RunFiles) -> list[str]:
    """Where the training data came from and how much of it there was, DPO pairs by reason."""
    recipe = tomllib.loads(run.recipe_toml)
    lines = ["## Data", ""]
    for (stage_id, stage), table in zip(run.summary["stages"].items(), recipe.get("stages", []), strict=False):
        result = stage["result"]
        if stage["kind"] == "collect":
            env = (table.get("env") or {}).get("name", recipe["env"]["name"])
            lines.append(f"- `{stage_id}`: {result['episodes']} episodes of policy `{table.get('policy')}` on "
                         f"{env} / {table.get('split')} (success {100 * result['success']:.1f}%)")
        elif "examples" in result:
            sources = ", ".join(f"`{d}`" for d in table.get("data", [])) or "its sources"
            tokens = f" ({result['tokens']} tokens)" if "tokens" in result else ""
            lines.append(f"- `{stage_id}` trained on {result['examples']} examples{tokens} from {sources}")
        if "pairs_by_reason" in result:
            reasons = ", ".join(f"{r} {n}" for r, n in sorted(result["pairs_by_reason"].items(), key=lambda x: -x[1]))
            lines.append(f"- `{stage_id}` DPO pairs by reason: {reasons} (`{result.get('pairs_file', '')}`)")
    return [*lines, ""]


def example_section(run: RunFiles, evals: dict[str, dict[str, Any]]) -> list[str]:
    """The prompt / action format: the first exchange of a real episode of the run (its messages, shortened)."""
    files = run.eval_episodes()
    order = [n for n in evals if n in files] + [n for n in files if n not in evals]
    if not order:
        return []
    where, traj = next(trajectory_records(files[order[0]]), (None, None))
    if traj is None:
        return []
    first_reply = traj.reply_indices()[0] if traj.turns else len(traj.messages) - 1
    shown = traj.messages[: first_reply + 2]
    lines = ["## Prompt and action format", "", f"The first exchange of a real episode (`{where}`, task `{traj.task_id}`):", ""]
    for message in shown:
        text = message.content if len(message.content) <= EXAMPLE_CHARS else message.content[:EXAMPLE_CHARS] + " …"
        calls = "".join(f"\n[tool call] {c.name}({json.dumps(c.arguments)})" for c in message.tool_calls or [])
        lines += [f"**{message.role}**", "", "```text", (text + calls).replace("```", "'''"), "```", ""]
    if traj.tools:
        lines += [f"Tools offered: {', '.join(t.get('function', t).get('name', '?') for t in traj.tools)}.", ""]
    return lines


def usage_section(model_dir: Path, adapter: bool, base: str, env: str) -> list[str]:
    if adapter:
        code = (f"from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"base = AutoModelForCausalLM.from_pretrained({base!r})\n"
                f"model = PeftModel.from_pretrained(base, {str(model_dir)!r})\n"
                f"tokenizer = AutoTokenizer.from_pretrained({str(model_dir)!r})")
    else:
        code = (f"from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"model = AutoModelForCausalLM.from_pretrained({str(model_dir)!r})\n"
                f"tokenizer = AutoTokenizer.from_pretrained({str(model_dir)!r})")
    code += ("\nmessages = [...]  # system + user messages in the format above\n"
             "ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\")\n"
             "print(tokenizer.decode(model.generate(ids, max_new_tokens=256)[0][ids.shape[1]:]))")
    return ["## Usage", "", "A LoRA adapter on the base model (transformers + peft):" if adapter else
            "A full (merged) model (transformers):", "", "```python", code, "```", "",
            f"Or evaluate it: `turnforge eval --env {env} --policy hf --model {model_dir}`.", ""]


def limitations_section(run: RunFiles, evals: dict[str, dict[str, Any]]) -> list[str]:
    """What the run did not evaluate: the env splits never played by the final model, sampling, other envs."""
    from turnforge.envs.base import get_env_spec

    lines = ["## Limitations", ""]
    if not evals:
        lines.append("- The final model was not evaluated in this run: the card holds no results for it.")
    for env in sorted({s["env"] for s in evals.values()}):
        played = {s["split"] for s in evals.values() if s["env"] == env}
        tasks = ", ".join(f"{s['n_tasks']} {s['split']} tasks x {s['samples_per_task']}" for s in evals.values() if s["env"] == env)
        lines.append(f"- {env}: evaluated on {tasks}; splits not evaluated: "
                     f"{', '.join(sorted(set(get_env_spec(env).splits) - played)) or 'none'}.")
    temps = {(s.get("sampling") or {}).get("temperature") for s in evals.values()}
    if temps == {0.0}:
        lines.append("- Greedy decoding only: behaviour under sampling was not measured.")
    lines += ["- No other environment, no safety or general-capability evaluation, no human review of the replies.", ""]
    return lines


def write_card(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """The model card of the run's final model, at `out` (default: README.md in the final model's folder)."""
    from huggingface_hub import ModelCard

    run = read_run(run_dir)
    final = run.final_model()
    if final is None:
        raise ValueError(f"{run.dir}: no training stage saved a model, so there is no model to describe")
    stage_id, model_dir, adapter = final
    evals = final_model_evals(run, stage_id)
    data = card_data(run, final, evals)
    title = f"# {run.summary['recipe']}: the `{stage_id}` model"
    body = [title, "", run.summary.get("description") or "", "",
            f"Trained with turnforge from `{run.summary['model']}`; "
            f"model folder `{model_dir}` ({'LoRA adapter' if adapter else 'full weights'}).", ""]
    body += pipeline_section(run) + data_section(run)
    if run.summary["eval"]:
        final_names = ", ".join(f"`{n}`" for n in evals) or "none"
        body += ["## Evaluation", "", f"Evaluations of the final model: {final_names}; the others are earlier models of "
                 "the same run, for comparison. Success with its 95% Wilson interval.", "",
                 comparison_markdown(run.summary["eval"]), ""]
    body += example_section(run, evals) + usage_section(model_dir, adapter, run.summary["model"], tomllib.loads(run.recipe_toml)["env"]["name"])
    body += limitations_section(run, evals)
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))
    path = Path(out) if out is not None else model_dir / CARD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    card.save(path)
    return path


def write_final_card(run_dir: str | Path) -> Path | None:
    """The card next to the final model, when the run trained one (None for a run without training)."""
    run = read_run(run_dir)
    return write_card(run_dir) if run.final_model() is not None else None
