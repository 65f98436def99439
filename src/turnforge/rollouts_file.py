"""Resumable rollouts into one out dir: run a policy on the first N tasks of a split, K samples each, and summarise.

`turnforge eval`, a recipe's eval and collect stages and RFT's sampling all play their episodes through `run_eval`
(RFT reads them back with `read_episodes`), so they share its files, its resume and its refusal of a foreign run.

An out dir holds `run.json` (the run's identity), `episodes.jsonl` (one Trajectory per line, appended
and fsynced as each episode finishes) and `summary.json` (with the sampling settings, and a server
policy's token `usage`). Re-running the same command resumes: finished
(task_id, sample) episodes are skipped, a line cut short by a kill is dropped with a warning, and the
summary covers every episode of the selected tasks. A different run is refused, never mixed in.

    turnforge eval --env household --policy expert --split test --tasks 200 --out runs/expert
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import warnings
from collections.abc import Collection
from pathlib import Path
from typing import Any

from turnforge.envs.base import get_env_spec, load_tasks, make_env, plays_tool_call, with_family_format
from turnforge.eval.metrics import summarize, tool_call_quality
from turnforge.formats import get_format
from turnforge.formats.families import is_tiny, model_family
from turnforge.launch import on_main_process
from turnforge.policies import MODEL_BACKENDS, PolicySpec, make_policy
from turnforge.policies.base import BackendError, Policy, SamplingParams, require_backend
from turnforge.policies.roles import env_roles
from turnforge.policies.scripted import ReplayPolicy
from turnforge.rollout import RolloutLimits, run_episodes
from turnforge.rundir import (
    EPISODES_FILE,
    MODELS_DIR,
    RUN_FILE,
    SUMMARY_FILE,
    check_out_dir,
    check_owner,
    locked,
)
from turnforge.scale import ScaleConfig
from turnforge.types import StopReason, Task, Trajectory, read_trajectories

# Policy options that do not change results, left out of a run's identity (a resume may change them).
_NOT_IN_IDENTITY = frozenset({"batch_size", "device", "concurrency", "api_key_env", "request_timeout", "max_retries"})

WALL_FILE = ".wall_s"  # seconds the run has taken so far, across resumes


@on_main_process  # under `accelerate launch` one process evaluates and the others get its summary
def run_eval(
    env: str,
    env_options: dict[str, Any],
    policy_spec: str,
    split: str,
    n_tasks: int | None,
    samples: int,
    seed: int,
    out_dir: str | Path,
    model: str | None = None,
    limits: RolloutLimits | None = None,
    params: SamplingParams | None = None,
    policy_options: dict[str, Any] | None = None,
    max_env_errors: float = 0.0,
    scale: ScaleConfig | None = None,
    task_ids: Collection[str] | None = None,
) -> dict:
    """Evaluate `policy_spec` on env `env`; writes run.json, episodes.jsonl, summary.json; returns the summary.

    An env error is not a score: when more than `max_env_errors` (a share of the episodes; default none) ended
    in one, `EnvErrors` is raised after everything is written, naming the first cause; the same command then
    redoes those episodes (and only those).

    `n_tasks=None` takes the whole split (for a replay: the tasks its file holds); `task_ids`, when given, keeps
    only those of the selected tasks (rft's sampling of the tasks its greedy play failed). `params` are the sampling
    settings of model policies (default: `SamplingParams(seed=seed)`); `policy_options` go to the model
    backend (hf: device, dtype, window, batch_size, adapter). Raises ValueError (bad input, or an out dir
    holding another run) before any episode runs.

    With `scale.ray` the episodes run on Ray workers (`turnforge.scale.ray_rollout`) that build the policy and
    the env themselves; they come back to the same writer, so the files and their resume are the same.
    """
    if samples < 1 or (n_tasks is not None and n_tasks < 1):
        raise ValueError(f"--samples and --tasks must be at least 1 (got samples={samples}, tasks={n_tasks})")
    out = Path(out_dir)
    check_out_dir(out)
    check_owner(out, "eval")  # a recipe run's folder is refused before a model loads
    limits = limits or RolloutLimits()
    params = params or SamplingParams(seed=seed)
    policy_options = policy_options or {}
    options = get_env_spec(env).coerce_options(env_options)
    on_ray = scale is not None and scale.uses_ray
    kind = PolicySpec.parse(policy_spec).kind
    if samples > 1 and params.temperature == 0 and kind in MODEL_BACKENDS:
        warnings.warn(
            f"--samples {samples} at temperature 0 (greedy) runs {samples} identical episodes per task; "
            "pass --temperature > 0 to sample different ones",
            UserWarning,
            stacklevel=2,
        )
    identity = {
        "env": env,
        "env_options": options,
        "split": split,
        "policy": policy_spec,
        "model": model,
        "samples": samples,
        "seed": seed,
        "n_tasks": n_tasks,
        **({"task_ids": sorted(task_ids)} if task_ids is not None else {}),
        # Only the limits that change results; batch size and env workers do not.
        "limits": {k: getattr(limits, k) for k in ("max_turns", "max_format_errors", "max_total_tokens")},
        "sampling": params.model_dump(),
        "policy_options": {k: v for k, v in policy_options.items() if k not in _NOT_IN_IDENTITY},
    }
    check_same_run(out, identity)  # bad input and a foreign out dir fail before a model loads and the tasks are built
    if not on_ray:  # a missing vLLM is said before the tiny model is built (Ray's workers have their own packages)
        require_backend(kind)
    if model is not None and is_tiny(model) and kind in MODEL_BACKENDS:  # as in a recipe: built offline, once
        # Imported here: the builder imports tokenizers and plays the expert, which other evals do without.
        from turnforge.tiny_model import resolve_model

        with locked(out, "eval"):
            model = resolve_model(model, out / MODELS_DIR, [(env, options)])  # its tokenizer from this env
    # On Ray the workers hold the model replicas; this process loads none.
    policy = None if on_ray and kind in MODEL_BACKENDS else make_policy(
        policy_spec, model=model, seed=seed, **policy_options)
    if policy is not None and policy.renderer is not None:  # tool calls in the model's own format (a no-op when given)
        options = with_family_format(env, options, policy.renderer.family)
    elif policy is None and model is not None and plays_tool_call(env, options):  # Ray's workers load the model
        options = with_family_format(env, options, model_family(model))
    roles = {} if on_ray else env_roles(env, options, params, seed, policy_spec, policy_options)
    tasks = _select_tasks(env, split, options, n_tasks, policy)
    if task_ids is not None:
        wanted_ids = set(task_ids)
        tasks = [t for t in tasks if t.id in wanted_ids]
    with locked(out, "eval"):  # one process per out dir: two evals would write every episode twice
        (out / RUN_FILE).write_text(json.dumps(identity, indent=2) + "\n", encoding="utf-8")
        episodes_path = out / EPISODES_FILE
        previous = read_episodes(episodes_path)

        wanted = {(t.id, s) for t in tasks for s in range(samples)}
        done_before = sum(t.key in wanted and t.stop_reason is not StopReason.env_error for t in previous)
        if done_before:
            print(f"resuming {out}: {done_before} of {len(wanted)} episodes already done", file=sys.stderr)
        wall_file, started = out / WALL_FILE, time.perf_counter()
        wall_before = _read_wall(wall_file)
        finished = []
        with episodes_path.open("a", encoding="utf-8") as sink:

            def on_finish(traj: Trajectory) -> None:
                append_episode(sink, traj)
                finished.append(traj.key)
                # The run's time across resumes, kept up to its last finished episode (a kill loses no more).
                wall_file.write_text(f"{wall_before + time.perf_counter() - started:.3f}\n", encoding="utf-8")

            skip = frozenset(t.key for t in previous if t.stop_reason is not StopReason.env_error)
            try:
                if on_ray:
                    from turnforge.scale.ray_rollout import EpisodeJob, run_episodes_on_ray  # imports ray

                    job = EpisodeJob(env, options, policy_spec, model, policy_options, params, limits, seed)
                    new = run_episodes_on_ray(job, tasks, samples, scale, on_finish=on_finish, skip=skip)
                else:
                    new = run_episodes(
                        policy,
                        functools.partial(make_env, env, **options),
                        tasks,
                        samples,
                        limits,
                        params=params,
                        on_finish=on_finish,
                        skip=skip,
                        seed=seed,
                        renderer=policy.renderer,
                        roles=roles,
                    )
            except BackendError as e:  # what finished is on disk: say so, and how to go on
                done = len(previous) + len(finished)
                raise BackendError(
                    f"{e} [{done} finished episodes are kept in {episodes_path}; the same command resumes]", e.status
                ) from e
            except KeyboardInterrupt:
                print(f"interrupted: {done_before + len(finished)} of {len(wanted)} episodes are kept in "
                      f"{episodes_path}; the same command resumes", file=sys.stderr)
                raise
        episodes = _episodes_of(tasks, samples, previous + new)
        summary = summarize(
            episodes,
            env=env,
            env_options=get_env_spec(env).resolve(options),  # run.json holds only the options given
            split=split,
            policy=policy_spec,
            samples_per_task=samples,
            wall_s=wall_before + time.perf_counter() - started,  # the run's, across resumes
            sampling=params.model_dump(),
            wall_s_invocation=time.perf_counter() - started,
        )
        wall_file.write_text(f"{summary['wall_s']:.3f}\n", encoding="utf-8")
        env_metrics = get_env_spec(env).env_metrics
        if env_metrics is not None:
            summary["env_metrics"] = env_metrics(episodes)
        fmt_name = str(summary["env_options"].get("format", ""))
        if fmt_name.startswith("tool_call"):  # the calls' quality as written (issue 63: per family)
            family = policy.renderer.family if policy is not None and policy.renderer is not None else None
            summary["tool_calls"] = tool_call_quality(episodes, get_format(fmt_name), family)
        usage = getattr(policy, "usage", None)
        if usage is not None:  # a server policy's token usage, this invocation's (as wall_s)
            summary["usage"] = usage.to_dict()
        (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    check_env_errors(episodes, max_env_errors, out)
    return summary


def _read_wall(path: Path) -> float:
    try:
        return float(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0.0


class EnvErrors(RuntimeError):
    """Too many episodes ended in env errors for their results to be scores (the run's files are written)."""


def check_env_errors(episodes: list[Trajectory], max_share: float, out: Path) -> None:
    """Raise `EnvErrors` when more than `max_share` of `episodes` ended in an env error."""
    failed = [t for t in episodes if t.stop_reason is StopReason.env_error]
    if not failed or len(failed) <= max_share * len(episodes):
        return
    error = str(failed[0].score.details.get("error") or "").strip().splitlines()
    cause = error[-1] if error else "no traceback recorded"
    raise EnvErrors(
        f"{len(failed)} of {len(episodes)} episodes ended in an env error, so {out} holds no valid score; the first "
        f"({failed[0].task_id} sample {failed[0].sample}): {cause}. Fix the cause and run the same command again: "
        "only those episodes are redone (or allow a share with --max-env-errors)"
    )


def _select_tasks(
    env: str, split: str, options: dict[str, Any], n_tasks: int | None, policy: Policy | None
) -> list[Task]:
    """The first `n_tasks` of the split (stable order); without `n_tasks`, all, or a replay's own tasks."""
    tasks = load_tasks(env, split, limit=n_tasks, **options)
    if isinstance(policy, ReplayPolicy) and not {t.id for t in tasks} & policy.task_ids:
        raise ValueError(
            f"{policy.path} holds replies for none of the {len(tasks)} selected tasks of env {env!r} split {split!r} "
            f"(it has e.g. {sorted(policy.task_ids)[0]!r}); pass the run's --split, --tasks and --env-opt"
        )
    if isinstance(policy, ReplayPolicy) and n_tasks is None:
        # A replay plays the tasks its file holds, so that it reproduces that run as it was.
        tasks = [t for t in tasks if t.id in policy.task_ids]
    return tasks


def check_same_run(out: Path, identity: dict[str, Any]) -> None:
    """Refuse an out dir that holds another run (its run.json differs), so that runs never mix."""
    run_file = out / RUN_FILE
    if not run_file.exists():
        if (out / EPISODES_FILE).exists():
            raise ValueError(f"{out} holds {EPISODES_FILE} but no {RUN_FILE}; use another --out")
        return
    before = json.loads(run_file.read_text(encoding="utf-8"))
    if isinstance(before.get("sampling"), dict):  # a run.json from before a sampling field existed held its default
        before["sampling"] = SamplingParams().model_dump() | before["sampling"]
    now = json.loads(json.dumps(identity))  # compare in JSON types (tuples -> lists)
    if before != now:
        diffs = [
            f"{key}: {before.get(key)!r} there, {now.get(key)!r} now"
            for key in sorted(set(before) | set(now))
            if before.get(key) != now.get(key)
        ]
        raise ValueError(
            f"{out} holds a different run ({'; '.join(diffs)}); use another --out, or delete {out} to start over"
        )


def read_episodes(path: Path) -> list[Trajectory]:
    """The finished episodes of a (possibly killed) run (`read_trajectories`, the one reader).

    A last line without its newline is what a kill leaves: it is kept if it parses, else dropped with a
    warning, and the file is rewritten so that appends start on a fresh line. Any other bad line is an error.
    """
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    *lines, tail = text.split("\n")  # a complete file ends with "\n", so tail == ""
    if tail:
        try:
            Trajectory.from_json(tail)
            lines.append(tail)
        except (ValueError, KeyError, TypeError):
            warnings.warn(
                f"{path}:{len(lines) + 1}: dropped an unfinished last line (the run was killed mid-write); "
                "that episode runs again",
                RuntimeWarning,
                stacklevel=2,
            )
        _rewrite(path, lines)
    return read_trajectories(path)


def append_episode(sink, traj: Trajectory) -> None:
    """One JSON line per finished episode, on disk before the next one starts (a kill loses nothing)."""
    sink.write(traj.to_json() + "\n")
    sink.flush()
    os.fsync(sink.fileno())


def _rewrite(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines if line.strip()), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a kill now leaves the old file or the new one, never half of each


def _episodes_of(tasks: list[Task], samples: int, episodes: list[Trajectory]) -> list[Trajectory]:
    """The episodes of the selected tasks, one per (task_id, sample), in task then sample order."""
    by_key = {}
    for traj in episodes:  # a later line of one key is a redone env-error episode: it replaces the earlier
        by_key[traj.key] = traj
    return [by_key[(t.id, s)] for t in tasks for s in range(samples) if (t.id, s) in by_key]
