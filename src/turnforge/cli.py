"""The `turnforge` command. Thin: it parses options and calls the library; the work lives elsewhere.

    turnforge quickstart --out runs/qs
    turnforge run recipes/quickstart.toml --out runs/qs --set stages.sft.learning_rate=5e-4
    turnforge envs
    turnforge eval --env household --policy expert --split test --tasks 200 --out runs/expert
    turnforge eval --env household --policy random --split test --tasks 200 --samples 4 --out runs/random
    turnforge eval --env household --policy replay:runs/expert/episodes.jsonl --out runs/replayed
    turnforge eval --env household --policy hf --model M --temperature 1.0 --top-p 0.95 --samples 8 --out runs/pass8
    turnforge serve --model runs/qs/stages/02-sft/model --port 8000
    turnforge eval --env household --policy openai:http://127.0.0.1:8000/v1 --concurrency 16 --out runs/via-http
    turnforge eval --env household --policy expert --ray auto --workers 4 --out runs/ray
    turnforge env serve --env household --split test --port 8001    # an OpenEnv server (GenericEnvClient drives it)
    turnforge eval --env openenv:http://127.0.0.1:8001 --policy random --out runs/remote
    accelerate launch --config_file configs/accelerate/ddp.yaml -m turnforge run alfworld_sft --out runs/alf
    turnforge report runs/qs                       # report.md + report.html + plots/ (also written by every run)
    turnforge report runs/a runs/b --compare --out runs/a-vs-b
    turnforge card runs/qs                         # README.md model card next to the final model
    turnforge view runs/qs --port 8080             # browse the episodes turn by turn
    turnforge data export runs/x/stages/04-dpo/pairs.jsonl --format trl-preference --out pairs/
    turnforge data import pairs/ --schema roundwise-dpo --out pairs.jsonl

Bad input ends with a one-line `error: ...` on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from turnforge.envs.code.cli import sandbox_app
from turnforge.envs.household.cli import household_app
from turnforge.formats.families import is_tiny
from turnforge.recipes.packaged import packaged_recipes
from turnforge.rundir import check_out_dir, check_out_parents, check_outside_runs
from turnforge.types import EVAL_TEMPERATURE, SamplingParams

try:  # typer >= 0.2x carries its own copy of click; older ones use click itself
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click import ClickException

# What this module imports at its top is what `turnforge --help`, `--version` and every `--help` pay for: the
# command line is parsed before torch, transformers, TRL, PEFT or datasets load (about 4 s), so each command
# imports the library it runs inside its own body (tests/test_first_contact.py checks `--help`'s imports).


class Commands(TyperGroup):
    """The `turnforge` group: click's own usage errors (a missing or unknown option, a bad value) end like the
    commands' refusals, with one `error: ...` line and exit code 2, instead of click's usage block and `Error:`."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except ClickException as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a bare `turnforge data`: its help (typer tells it by name too)
                e.show()
                sys.exit(e.exit_code)
            ctx = getattr(e, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"error: {e.format_message().rstrip('.')}{hint}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


# Help is plain text (rich_markup_mode=None): with rich markup, "turnforge[ray]" or "the recipe's [scale]" lost
# their brackets as style tags ("Needs turnforge.", "the recipe's )."), and no help string here uses markup.
app = typer.Typer(
    cls=Commands,
    help="Train and evaluate small LLM agents on multi-turn, tool-using environments.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(household_app, name="household")
app.add_typer(sandbox_app, name="sandbox")
data_app = typer.Typer(help="Hugging Face datasets from a run's files, and back into a recipe's data.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"turnforge {version('turnforge')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version, is_eager=True)
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show the libraries' warnings and logs.")] = False,
) -> None:
    """Train and evaluate small LLM agents on multi-turn, tool-using environments."""
    from turnforge.launch import quiet_other_processes, refused_launch

    if (refused := refused_launch()) is not None:
        if os.environ.get("RANK", "0") == "0":  # every process stops; the main one says why
            typer.echo(f"error: {refused}", err=True)
        raise typer.Exit(USAGE_ERROR)
    quiet_other_processes()
    if not verbose:
        quiet_libraries()


def quiet_libraries() -> None:
    """Hide the libraries' warnings, log chatter and progress bars (transformers' generation flags and deprecations,
    its "Loading weights" bars, datasets' "Map" bars, sqlglot, RuntimeWarnings with source paths); turnforge's own
    warnings and progress still show. `--verbose` keeps everything.

    Called before any of those libraries is imported (the commands import them), so the environment variables they
    read once at import take effect. vLLM's engine runs in spawned processes: they inherit the environment, and the
    warning filters through `sys.warnoptions`, which multiprocessing passes to them as `-W` options."""
    import logging
    import os
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"turnforge(\.|$)")  # checked before the first: ours stay visible
    # ...except a library's deprecation, which points at the turnforge line that called it (`generate(...)`): it is
    # news for whoever upgrades the library, not for the user of the run. turnforge raises none of these kinds.
    for deprecation in (FutureWarning, DeprecationWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=deprecation)
        if f"ignore::{deprecation.__name__}" not in sys.warnoptions:
            sys.warnoptions.append(f"ignore::{deprecation.__name__}")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers is first imported
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading and saving bars read it
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    # vLLM configures its logger from this as its engine starts, here and in the engine's processes: its INFO and
    # WARNING lines and engine-config dump (54 lines at a `--policy vllm` start); its loading bar: policies/vllm.py.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ warnings ("[W ... utils.cpp] NUMA binding")
    for name in ("sqlglot", "transformers", "datasets", "huggingface_hub", "accelerate", "peft", "trl", "httpx", "vllm"):
        logging.getLogger(name).setLevel(logging.ERROR)


USAGE_ERROR = 2  # the exit code click uses for bad usage; scripts can tell it from a crash (1)
BACKEND_ERROR = 1  # a model server failed mid-run (the episodes finished so far are kept)
INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


def _user_errors(command: Callable) -> Callable:
    """Turn the library's input errors into `error: ...` + exit 2, and a failing model server into
    `error: ...` + exit 1, instead of a traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:  # what was kept has been said where it is known (the eval runner)
            engines = sys.modules.get("turnforge.policies.engine")  # imported only where a model generated
            if engines is not None:
                engines.stop_engines()
            raise typer.Exit(INTERRUPTED) from None
        except Exception as e:
            refusal = user_error(e)
            if refusal is None:
                raise
            line, code = refusal
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(code) from None

    return wrapper


def user_error(error: Exception) -> tuple[str, int] | None:
    """(one line, exit code) for an error the user can act on: bad input (2) or a failing model server or env (1);
    None for anything else (a bug: its traceback). The classes are imported here, once an error has happened, so
    that no command pays for the libraries that define them before it runs."""
    from pydantic import ValidationError

    from turnforge.policies.base import BackendError, BackendNotInstalled
    from turnforge.rollouts_file import EnvErrors

    if isinstance(error, ValidationError):  # a typed settings object (the sampling group) refused values: one line
        return one_line(error), USAGE_ERROR
    if isinstance(error, ValueError | NotImplementedError | FileNotFoundError | BackendNotInstalled):
        return str(error), USAGE_ERROR
    if isinstance(error, BackendError | EnvErrors):
        return str(error), BACKEND_ERROR
    return None


def one_line(error: Any) -> str:
    """pydantic's report of a settings object (several lines) as one: `what: key: problem (got value); ...`."""
    problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg'].removeprefix('Value error, ')} (got {e['input']!r})"
                for e in error.errors()]
    return f"{error.title}: " + "; ".join(problems)


def _sampling(name: str) -> Any:
    """The option of the sampling field `name`: its help is the field's own (`SamplingParams`)."""
    return typer.Option(help=SamplingParams.model_fields[name].description)


SAMPLING = SamplingParams()
"""The sampling group's defaults; `turnforge eval`'s options start from them (its temperature: an eval stage's)."""


def parse_env_options(pairs: list[str]) -> dict[str, str]:
    """["hints=true", "grammar=0.4"] -> {"hints": "true", "grammar": "0.4"} (the env coerces the types)."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--env-opt {pair!r} is not KEY=VALUE (e.g. --env-opt hints=true)")
        options[key.strip()] = value.strip()
    return options


@app.command()
def envs() -> None:
    """List the environments with their splits, categories and options."""
    from rich.console import Console
    from rich.text import Text

    from turnforge.envs.base import list_envs

    console = Console()
    # Text, not markup: descriptions hold brackets such as "turnforge[alfworld]". Indented blocks, not a table: a
    # table squeezed into 80 columns (a pipe's width) cut words of its last column ("JSO" for "JSON)"); Text wraps
    # whole words at any width, so choices stay whole for a user to copy into --env-opt.
    for spec in list_envs():
        console.print(Text.assemble((spec.name, "bold"), f" — {spec.description}"))
        _indented(console, 2, Text(f"splits: {', '.join(spec.splits)}\ncategories: {', '.join(spec.categories)}"))
        _indented(console, 2, Text("options (--env-opt NAME=VALUE; default, then choices or range):"))
        for o in spec.options:
            allowed = f"   {_allowed(o)}" if _allowed(o) else ""
            _indented(console, 4, Text.assemble((f"{o.name}={o.default!r}", "bold"), (allowed, "cyan")))
            _indented(console, 8, Text(o.help))
        console.print()


def _indented(console: Any, spaces: int, text: Any) -> None:
    """`text` wrapped at the console's width with every line indented (no trailing padding)."""
    from rich.padding import Padding

    console.print(Padding(text, (0, 0, 0, spaces), expand=False))


def _allowed(option) -> str:
    """What an env option accepts: its choices, or its range (`>= 1`, `0..1`)."""
    if option.choices:
        return " | ".join(option.choices)
    low, high = option.at_least, option.at_most
    if low is not None and high is not None:
        return f"{low:g}..{high:g}"
    return f">= {low:g}" if low is not None else f"<= {high:g}" if high is not None else ""


RayOption = Annotated[
    str | None,
    typer.Option(help="Run the episodes on Ray workers: auto (a local instance, or the one in RAY_ADDRESS) or an "
                 "address such as ray://head:10001. Needs turnforge[ray]."),
]
WorkersOption = Annotated[int, typer.Option(help="Ray workers (--ray): each builds the env and a policy replica.")]


@app.command("eval")
@_user_errors
def eval_command(
    env: Annotated[str, typer.Option(help="Environment name (see `turnforge envs`).")],
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")],
    env_opt: Annotated[list[str] | None, typer.Option(help="Env option KEY=VALUE; repeatable.")] = None,
    policy: Annotated[
        str, typer.Option(help="expert | random | replay:FILE | hf | vllm | openai:URL.")
    ] = "expert",
    model: Annotated[str | None, typer.Option(
        help="Model id or path, for the model backends; tiny (or tiny:FAMILY): the offline tiny model.")] = None,
    split: Annotated[str, typer.Option(help="Task split.")] = "test",
    tasks: Annotated[int | None, typer.Option(help="First N tasks of the split (default: all).")] = None,
    samples: Annotated[int, typer.Option(help="Episodes per task (for pass@k / pass^k).")] = 1,
    seed: Annotated[int, _sampling("seed")] = SAMPLING.seed,
    max_turns: Annotated[
        int | None, typer.Option(help="Turn limit per episode (default: the env's).")
    ] = None,
    limit_open: Annotated[int, typer.Option(help="Episodes open at once (the generate batch).")] = 64,
    temperature: Annotated[float, _sampling("temperature")] = EVAL_TEMPERATURE,
    top_p: Annotated[float, _sampling("top_p")] = SAMPLING.top_p,
    top_k: Annotated[int, _sampling("top_k")] = SAMPLING.top_k,
    max_new_tokens: Annotated[int, _sampling("max_new_tokens")] = SAMPLING.max_new_tokens,
    stop: Annotated[list[str] | None, _sampling("stop")] = None,
    concurrency: Annotated[
        int, typer.Option(help="Requests in flight at once, for server policies (openai:URL).")
    ] = 8,
    request_timeout: Annotated[float, typer.Option(help="Seconds a server request may take (openai:URL).")] = 120.0,
    max_retries: Annotated[
        int, typer.Option(help="Retries of a failed server request (429, 5xx, timeouts, no connection).")
    ] = 5,
    api_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the server's API key (default OPENAI_API_KEY).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="openai:URL: the served model's folder or Hub id; prompts are rendered here and "
                                 "sent as token ids (/v1/completions, e.g. vllm serve), so episodes are token-exact, "
                                 "as in process. Without it the server re-tokenizes earlier replies.")
    ] = None,
    max_env_errors: Annotated[
        float, typer.Option(help="Share of episodes that may end in an env error before the command fails.")
    ] = 0.0,
    ray: RayOption = None,
    workers: WorkersOption = 1,
    worker_cpus: Annotated[float, typer.Option(help="CPUs Ray reserves per worker (--ray).")] = 1.0,
    worker_gpus: Annotated[float, typer.Option(help="GPUs Ray reserves per worker: 1 for an hf/vllm replica each (--ray).")] = 0.0,
) -> None:
    """Evaluate a policy; writes OUT/episodes.jsonl and OUT/summary.json and prints the table."""
    from turnforge.eval.table import print_summary
    from turnforge.policies import PolicySpec
    from turnforge.rollout import RolloutLimits
    from turnforge.rollouts_file import run_eval
    from turnforge.scale import ScaleConfig

    check_outside_runs(out)
    if limit_open < 1:  # said here, in the flag's own name
        raise ValueError(f"--limit-open must be at least 1 (episodes open at once), got {limit_open}")
    if not 0.0 <= max_env_errors <= 1.0:
        raise ValueError(f"--max-env-errors is a share of the episodes, in 0..1; got {max_env_errors}")
    if ray is None and workers > 1:
        raise ValueError(f"--workers {workers} needs --ray (auto or an address); without it episodes run in this process")
    kind = PolicySpec.parse(policy).kind
    policy_options: dict[str, Any] = {}
    if kind == "openai":
        policy_options = {"concurrency": concurrency, "api_key_env": api_key_env,
                          "request_timeout": request_timeout, "max_retries": max_retries}
        if tokenizer is not None:  # only when given: run.json of an eval without it stays as it was
            policy_options["tokenizer"] = tokenizer
    elif api_key_env is not None or tokenizer is not None:
        flag = "--api-key-env" if api_key_env is not None else "--tokenizer"
        raise ValueError(f"{flag} is for server policies (openai:URL), not {policy!r}")
    summary = run_eval(
        env=env,
        env_options=parse_env_options(env_opt or []),
        policy_spec=policy,
        split=split,
        n_tasks=tasks,
        samples=samples,
        seed=seed,
        out_dir=out,
        model=model,
        limits=RolloutLimits(max_turns=max_turns, max_open=limit_open),
        params=SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=max_new_tokens,
                              stop=list(stop or []), seed=seed),
        policy_options=policy_options,
        max_env_errors=max_env_errors,
        scale=ScaleConfig(ray=ray, workers=workers, worker_cpus=worker_cpus, worker_gpus=worker_gpus),
    )
    print_summary(summary)
    typer.echo(f"wrote {out / 'summary.json'} and {out / 'episodes.jsonl'}")


SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe value: KEY.PATH=VALUE, e.g. stages.sft.epochs=2."),
]
ModelOption = Annotated[str | None, typer.Option(
    help="Base model (model.name): tiny (or tiny:FAMILY, docs/families.md), a path or a hub id.")]


@app.command("run")
@_user_errors
def run_command(
    recipe: Annotated[str, typer.Argument(
        help="Recipe file, or a packaged recipe's name: " + ", ".join(packaged_recipes()) + ".")],
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")],
    model: ModelOption = None,
    set_: SetOption = None,
    restart_from: Annotated[
        str | None, typer.Option(help="Redo this stage (id, name or number) and every later one.")
    ] = None,
    check: Annotated[bool, typer.Option(help="Validate the recipe, print it resolved, run nothing.")] = False,
    ray: RayOption = None,
    workers: Annotated[int | None, typer.Option(help="Ray workers (--ray; default: the recipe's [scale]).")] = None,
) -> None:
    """Run a recipe's stages in OUT (resumable); prints the evaluations side by side."""
    from turnforge.pipeline import check_task_counts, plan_stages, print_comparison, run_recipe
    from turnforge.recipes import load_recipe

    # --ray and --workers are the recipe's [scale] table, set like any --set (its errors name them).
    check_out_dir(out)  # --check too: a run that passed it must not then fail on its --out
    check_outside_runs(out)
    scale = [f"scale.ray={ray}"] * (ray is not None) + [f"scale.workers={workers}"] * (workers is not None)
    loaded = load_recipe(recipe, overrides=[*(set_ or []), *scale], model=model)
    if check:
        check_task_counts(loaded, plan_stages(loaded, out))  # as the run would, before its first stage
        typer.echo(loaded.to_toml(), nl=False)
        return
    summary = run_recipe(loaded, out, restart_from=restart_from)
    print_comparison(summary)
    typer.echo(f"wrote {out / 'summary.json'}, {out / 'report.md'} and {out / 'report.html'}")


@app.command()
@_user_errors
def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory; re-running with the same --out resumes.")] = Path(
        "runs/quickstart"
    ),
    model: ModelOption = None,
    set_: SetOption = None,
    ray: RayOption = None,
    workers: Annotated[int | None, typer.Option(help="Ray workers (--ray).")] = None,
) -> None:
    """Tiny model on CPU in minutes: expert data -> SFT -> evaluation before/after (`run quickstart`)."""
    run_command("quickstart", out=out, model=model, set_=set_, restart_from=None, check=False, ray=ray, workers=workers)


@app.command()
@_user_errors
def serve(
    model: Annotated[str, typer.Option(help="Model folder or hub id, served under --name; tiny: the offline tiny "
                                       "model, built for --env at start (as `eval --model tiny` builds it).")],
    name: Annotated[str | None, typer.Option(help="The model's name in requests (default: --model as given).")] = None,
    adapter: Annotated[
        list[str] | None, typer.Option(help="A LoRA adapter served as model NAME: NAME=PATH; repeatable.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed).")] = 8000,
    max_batch: Annotated[int, typer.Option(help="Prompts per batched generate call at most.")] = 64,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")] = "auto",
    env: Annotated[str | None, typer.Option(help="With --model tiny: the env whose text its tokenizer is trained "
                                            "on (default household).")] = None,
    env_opt: Annotated[list[str] | None, typer.Option(help="With --model tiny: an option of --env, KEY=VALUE.")] = None,
) -> None:
    """OpenAI-compatible server over the hf backend: /v1/models, /v1/chat/completions (batched, tool calls), and
    /v1/completions for scoring given tokens (prompt_logprobs)."""
    import contextlib
    import tempfile

    try:
        from turnforge.policies.serve import ServedModel
        from turnforge.policies.serve import serve as run_server
    except ImportError as e:
        raise ValueError(f"turnforge serve needs FastAPI and uvicorn ({e}): pip install 'turnforge[serve]'") from None

    if max_batch < 1:
        raise ValueError(f"--max-batch must be at least 1, got {max_batch}")
    if not is_tiny(model) and (env is not None or env_opt):
        raise ValueError("--env and --env-opt choose the text of --model tiny's tokenizer; a model folder or hub id "
                         "has its own tokenizer")
    adapters = parse_adapters(adapter or [])
    with contextlib.ExitStack() as stack:
        path = model
        if is_tiny(model):  # a name, not a Hub id: built offline, as `eval --model tiny` builds it
            from turnforge.envs.base import get_env_spec
            from turnforge.tiny_model import resolve_model

            env = env or "household"
            options = get_env_spec(env).coerce_options(parse_env_options(env_opt or []))
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="turnforge-serve-")))
            typer.echo(f"building the tiny model for env {env!r} (offline, a few seconds)", err=True)
            path = resolve_model(model, folder, [(env, options)])  # the same model as `eval --env ENV --model tiny`
        served = ServedModel(path, name=name or model, adapters=adapters, device=device, dtype=dtype)
        run_server(served, host=host, port=port, max_batch=max_batch,
                   on_ready=lambda url: typer.echo(f"serving {', '.join(served.names)} at {url} (Ctrl-C stops)"))


env_app = typer.Typer(help="Environments on the field's interfaces: serve one as an OpenEnv server.", no_args_is_help=True)
app.add_typer(env_app, name="env")


@env_app.command("serve")
@_user_errors
def env_serve(
    env: Annotated[str, typer.Option(help="Environment name (see `turnforge envs`).")],
    env_opt: Annotated[list[str] | None, typer.Option(help="Env option KEY=VALUE; repeatable.")] = None,
    split: Annotated[str, typer.Option(help="The split whose tasks reset() deals (task_id / index pick one).")] = "test",
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed).")] = 8000,
    max_sessions: Annotated[int, typer.Option(help="Concurrent WebSocket sessions (one env each) at most.")] = 64,
) -> None:
    """Serve an env as an OpenEnv environment (openenv's server: reset / step / state over WebSocket, Task API)."""
    try:
        from turnforge.integrations.openenv.server import serve as run_server
    except ImportError as e:
        raise ValueError(f"turnforge env serve needs the openenv package ({e}): pip install 'turnforge[openenv]'") from None
    run_server(env, parse_env_options(env_opt or []), split, host=host, port=port, max_sessions=max_sessions,
               on_ready=lambda url: typer.echo(f"serving env {env!r} split {split!r} at {url} (Ctrl-C stops); "
                                               f"use it as --env openenv:{url}"))


def parse_adapters(pairs: list[str]) -> dict[str, str]:
    """["dpo=runs/x/model"] -> {"dpo": "runs/x/model"}."""
    adapters = {}
    for pair in pairs:
        adapter_name, sep, path = pair.partition("=")
        if not sep or not adapter_name.strip() or not path.strip():
            raise ValueError(f"--adapter {pair!r} is not NAME=PATH (e.g. --adapter dpo=runs/ig/stages/04-dpo/model)")
        if adapter_name.strip() in adapters:
            raise ValueError(f"--adapter {adapter_name.strip()!r} is given twice")
        adapters[adapter_name.strip()] = path.strip()
    return adapters


@app.command()
@_user_errors
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (the --out of `turnforge run`; with --compare, "
                                               "also of `turnforge eval`).")],
    compare: Annotated[bool, typer.Option(help="Put the evaluations of runs and eval folders side by side in one "
                                          "report.")] = False,
    out: Annotated[Path | None, typer.Option(help="Folder of the --compare report (default: ./compare).")] = None,
    readme: Annotated[Path | None, typer.Option(help="Also fill this file's results block (between "
                                                "<!-- turnforge results: begin/end --> lines) from the run.")] = None,
) -> None:
    """Write report.md, a self-contained report.html and plots/ from a run directory (or compare runs)."""
    from turnforge.report import update_readme, write_comparison, write_report

    if out is not None:
        check_out_parents(out)
        check_outside_runs(out)
    if compare:
        path = write_comparison(runs, out or Path("compare"))
        typer.echo(f"wrote {path} and {path.with_suffix('.html')}")
        return
    if len(runs) != 1 or out is not None:
        raise ValueError("give one run directory (its report is written into it), or several with --compare [--out DIR]")
    path = write_report(runs[0])
    typer.echo(f"wrote {path}, {path.with_suffix('.html')} and {runs[0] / 'plots'}")
    if readme is not None:
        typer.echo(f"filled the results block of {update_readme(readme, runs[0])}")


@app.command()
@_user_errors
def card(
    run: Annotated[Path, typer.Argument(help="Run directory.")],
    out: Annotated[Path | None, typer.Option(help="Where to write it (default: README.md in the final model's folder).")] = None,
) -> None:
    """Write the Hugging Face model card (YAML front matter + model-index) of the run's final model."""
    from turnforge.card import write_card

    if out is not None:
        check_out_parents(out)
    typer.echo(f"wrote {write_card(run, out)}")


@app.command()
@_user_errors
def view(
    target: Annotated[Path, typer.Argument(help="A run directory, or one episodes.jsonl / trajectories.jsonl.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed).")] = 8080,
    tokenizer: Annotated[str | None, typer.Option(help="Tokenizer that decodes loss masks (default: the run's model).")] = None,
) -> None:
    """Browse every stage's episodes turn by turn in a local web page (filters, loss masks)."""
    import threading

    from turnforge.viewer.server import Viewer, make_server

    viewer = Viewer(target, tokenizer)
    try:
        server = make_server(viewer, host, port)
    except OSError as e:  # the port is taken (or the address is not this machine's)
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror}); give another --port (0 picks a free one)") from None
    threading.Thread(target=viewer.warm, daemon=True).start()
    count = sum(len(s.rows) for s in viewer.sources.values())
    typer.echo(f"{count} episodes in {len(viewer.sources)} files at http://{host}:{server.server_address[1]} (Ctrl-C stops)")
    try:
        server.serve_forever()
    finally:
        server.server_close()


SCHEMA_HELP = "trl-sft (trajectories: messages + tools) | trl-preference (prompt/chosen/rejected) | roundwise-dpo."


@data_app.command("export")
@_user_errors
def data_export(
    source: Annotated[str, typer.Argument(help="trajectories.jsonl / episodes.jsonl, pairs.jsonl, or a dataset.")],
    format: Annotated[str, typer.Option("--format", help=SCHEMA_HELP)],  # noqa: A002
    out: Annotated[Path, typer.Option(help="A folder (save_to_disk), a .parquet or a .jsonl file.")],
) -> None:
    """Export trajectories or DPO pairs as a Hugging Face dataset (ready for push_to_hub)."""
    from turnforge.data.hf_datasets import export_dataset

    check_out_parents(out)
    check_outside_runs(out)
    typer.echo(f"wrote {export_dataset(source, format, out)}")


@data_app.command("import")
@_user_errors
def data_import(
    source: Annotated[str, typer.Argument(help="A dataset folder, .parquet / .jsonl file, or hf:NAME[:SPLIT].")],
    schema: Annotated[str, typer.Option(help=SCHEMA_HELP)],
    out: Annotated[Path, typer.Option(help="The JSONL file to write (name it in a stage's `data`).")],
) -> None:
    """Import a dataset in one of the schemas as JSONL for a recipe's sft or dpo stage."""
    from turnforge.data.hf_datasets import import_dataset

    check_out_parents(out)
    check_outside_runs(out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the JSONL file to write, e.g. {out / 'data.jsonl'}")
    path, rows = import_dataset(source, schema, out)
    typer.echo(f"wrote {rows} records to {path}")
