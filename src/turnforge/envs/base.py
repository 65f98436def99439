"""The Env contract (design.md §3) and the registry behind `--env NAME`.

An env never sees tokens, only messages, and never crashes on bad input: an unparsable reply
(a `FormatError`, produced by the env's format) or an invalid action gets the environment's own
error observation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from turnforge.formats.base import Format, FormatError
from turnforge.formats.families import Family, accepts_format
from turnforge.types import Message, Score, StepResult, Task, Trajectory


@runtime_checkable
class Env(Protocol):
    """One episode at a time: `reset(task)`, then `step(reply)` until `done`, then `score()`."""

    name: str
    format: Format

    def reset(self, task: Task) -> list[Message]:
        """Start `task`; return the system and first user message(s)."""
        ...

    def tools(self) -> list[dict] | None:
        """JSON schemas of the tools, when the env is tool-based (else None)."""
        ...

    def step(self, reply: Message | FormatError) -> StepResult:
        """Apply one parsed assistant reply (or the format's parse error) and return the observation."""
        ...

    def score(self) -> Score:
        """The episode's outcome so far: success, reward, progress, details."""
        ...

    def close(self) -> None:
        """Release what the env holds (connections, processes, files); the rollout always calls it at the end."""
        ...

    # Optional: `blocks = True` on an env whose calls wait (a database, a sandbox, a slow service): the rollout
    # then runs its calls in worker threads, so that a wait stalls only its own episode. Envs with model roles
    # always run there. Others are called inline on the rollout's event loop.


@runtime_checkable
class UsesRoles(Protocol):
    """Envs that need other models during an episode (e.g. a `user` simulator, a `judge`).

    They declare the roles; the rollout gives them, before each `reset`, one `RoleClient` per role, bound to
    that episode. `client.generate(messages)` from `step` is batched with the other episodes' requests of the
    same role. An env never constructs a model itself.
    """

    roles: tuple[str, ...]

    def use_roles(self, clients: dict[str, Any]) -> None: ...


@runtime_checkable
class SupportsExpert(Protocol):
    """Envs whose scripted solver can act from the current state (the `expert` policy)."""

    def expert_reply(self) -> Message: ...


def expert_text(env: SupportsExpert, action: Message | None = None) -> str:
    """The expert's next reply as text in the env's format: its action (or `action`, a noisy expert's mistake),
    with the thought the env gives it (`expert_thought()`, e.g. the household goal restated) when the env has
    one. What the `expert` policy writes, and what a DPO pair's expert `chosen` reply is: one rendering, so that
    both teach the same format."""
    reply = action if action is not None else env.expert_reply()  # first: a thought may state what it decided
    thought = env.expert_thought() if hasattr(env, "expert_thought") else None
    return env.format.render(reply, thought=thought)


@runtime_checkable
class SupportsAdmissible(Protocol):
    """Envs that list the valid actions of the current state (the `random` policy uses them)."""

    def admissible_actions(self) -> list[str]: ...

    def action_message(self, action: str) -> Message:
        """The parsed reply that performs `action` in this env's format (text or tool call)."""
        ...


@runtime_checkable
class SupportsNearMisses(Protocol):
    """Envs that list actions which look valid now but fail (a wrong number, a wrong appliance): the slips a
    model makes, which a noisy expert (`ExpertPolicy(noise=...)`) makes too, so its demonstrations recover
    from them."""

    def near_miss_actions(self) -> list[str]: ...


MAX_GENERATED = 100_000
"""The most tasks a generated split (`generate=N`) may have: its tasks are built in memory (1-3 KB each; 100,000
SQL tasks took ~3 min on 2 busy cores), so a slip such as generate=1000000000 is refused instead of filling memory
for days."""


@dataclass
class EnvOption:
    """One `--env-opt KEY=VALUE` an env family accepts."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    at_least: float | None = None
    """Smallest value that makes sense (numbers); a smaller one is an error before anything runs."""
    at_most: float | None = None


@dataclass
class EnvSpec:
    """A registered env family: how to build it, load its tasks, and what it offers."""

    name: str
    description: str
    factory: Callable[..., Env]
    load_tasks: Callable[..., list[Task]]
    categories: tuple[str, ...]
    splits: tuple[str, ...]
    options: list[EnvOption] = field(default_factory=list)
    env_metrics: Callable[[list[Trajectory]], dict[str, float]] | None = None
    """The benchmark's own summary figures (e.g. DBBench's overall_cat_accuracy): summary.json "env_metrics"."""
    model_roles: Callable[[dict[str, Any], str], dict[str, tuple[Any, dict[str, Any]]]] | None = None
    """(Called through `roles`, with every option resolved.) Model roles the env's options ask for (e.g. `user=hf:PATH`): (options, agent policy spec) -> {role:
    (policy spec, or a ready scripted policy; sampling overrides)}. The eval runner builds the policies and
    passes them as `roles=` (rollouts_file.py `env_roles`); the env never builds a model."""
    role_options: tuple[str, ...] = ()
    """The options that name a model role (service: `user`, `judge`): a recipe's "base" there is its base model
    (stages/context.py), and an env made without them needs no role (GRPO's dataset prompts)."""
    split_size: Callable[[str, dict[str, Any]], int | None] | None = None
    """(split, options) -> how many tasks the split has, when known without building them (generated splits): a
    count beyond it is refused before any task is built. Without it (or None) the loaded tasks are counted."""
    vocabulary: Callable[[dict[str, Any]], list[str]] | None = None
    """(Called through `words`, with every option resolved.) Names the env's text can hold (e.g. household's "cabinet 7"), for its options: a tokenizer trained on the
    env's text (the tiny model's, `tiny_model.py`) gets each as one token, also those no sample of episodes shows."""
    corpus_options: tuple[str, ...] = ()
    """The options that choose which text the env has (a domain, a data file, a format the defaults would not
    sample): the tiny tokenizer built for a recipe takes these from the recipe, the others at their defaults."""

    def coerce_options(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Validate `--env-opt` values (strings from the CLI, TOML values from a recipe, typed values from code)."""
        known = {o.name: o for o in self.options}
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                raise ValueError(
                    f"env {self.name!r} has no option {key!r}; options are: {', '.join(sorted(known)) or 'none'}"
                )
            out[key] = _coerce(known[key], value, self.name)
        return out

    def defaults(self) -> dict[str, Any]:
        """Every option at its default: an env family states each default once, in its `EnvOption`."""
        return {option.name: option.default for option in self.options}

    def resolve(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The options an env (or its tasks) is made with: every default, `raw` (checked and typed) on top."""
        return self.defaults() | self.coerce_options(raw)

    def roles(self, raw: dict[str, Any], agent_spec: str = "") -> dict[str, tuple[Any, dict[str, Any]]]:
        """The model roles these options ask for (`model_roles` on the resolved options); {} for an env without."""
        return self.model_roles(self.resolve(raw), agent_spec) if self.model_roles is not None else {}

    def words(self, raw: dict[str, Any]) -> list[str]:
        """`vocabulary` of the resolved options; [] for an env without one."""
        return self.vocabulary(self.resolve(raw)) if self.vocabulary is not None else []


def _coerce(opt: EnvOption, value: Any, env: str) -> Any:
    where = f"env {env!r} option {opt.name!r}"
    if not isinstance(value, opt.type) or (isinstance(value, bool) and opt.type is not bool):
        # A value of another type is read as its text, as `--env-opt` reads it (TOML grammar = 0.4 -> "0.4").
        value = str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, str) and opt.type is not str:
        text = value.strip().lower()
        try:
            if opt.type is bool:
                if text not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                    raise ValueError
                value = text in {"1", "true", "yes", "on"}
            else:
                value = opt.type(value)
        except ValueError:
            raise ValueError(f"{where}: cannot read {value!r} as {opt.type.__name__}") from None
    chosen = accepts_format if opt.name == "format" else (lambda text, choices: text in choices)
    if opt.choices is not None and not chosen(str(value), opt.choices):
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(opt.choices)}")
    low, high = opt.at_least, opt.at_most
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"at least {low:g}" if high is None else f"at most {high:g}" if low is None else f"in {low:g}..{high:g}"
        raise ValueError(f"{where}: {value!r} is out of range; it must be {span}")
    return value


_REGISTRY: dict[str, EnvSpec] = {}


def register_env(spec: EnvSpec) -> EnvSpec:
    _REGISTRY[spec.name] = spec
    return spec


def _load_builtin() -> None:
    # Importing the packages registers them; kept lazy so `import turnforge` stays light.
    import turnforge.envs.bfcl  # noqa: F401
    import turnforge.envs.code  # noqa: F401
    import turnforge.envs.household  # noqa: F401
    import turnforge.envs.service  # noqa: F401
    import turnforge.envs.sql  # noqa: F401


def get_env_spec(name: str) -> EnvSpec:
    if name.startswith("openenv:"):  # a running OpenEnv server (envs/openenv_url.py), not a family
        return _openenv_spec(name)
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown env {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def _openenv_spec(name: str) -> EnvSpec:
    try:  # imported here: the openenv extra is optional, and only this prefix needs it
        from turnforge.envs.openenv_url import remote_env_spec
    except ImportError as e:
        raise ValueError(f"--env {name!r} needs the openenv package ({e}): pip install 'turnforge[openenv]'") from None
    return remote_env_spec(name)


def list_envs() -> list[EnvSpec]:
    _load_builtin()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def make_env(name: str, **options: Any) -> Env:
    """Build env `name` with validated options (e.g. `make_env("household", grammar="0.4", hints=True)`)."""
    spec = get_env_spec(name)
    return spec.factory(**spec.resolve(options))


def load_tasks(name: str, split: str, limit: int | None = None, **options: Any) -> list[Task]:
    """The first `limit` tasks (all when None) of env `name`'s `split`, in a stable order; a `limit` beyond the
    split is an error naming its size (a generated split's before any task is built)."""
    spec = _spec_with_split(name, split)
    if limit is not None and limit < 1:
        raise ValueError(f"the number of tasks must be at least 1, got {limit}")
    options = spec.resolve(options)
    known = _known_size(spec, split, options)
    if limit is not None and known is not None and limit > known:
        raise ValueError(_beyond_split(name, split, known, limit))
    tasks = spec.load_tasks(split, limit=limit, **options)[:limit]
    if limit is not None and len(tasks) < limit:
        raise ValueError(_beyond_split(name, split, len(tasks), limit))
    return tasks


def split_size(name: str, split: str, **options: Any) -> int:
    """How many tasks env `name`'s `split` has (built and counted only when the env cannot tell without)."""
    spec = _spec_with_split(name, split)
    known = _known_size(spec, split, spec.resolve(options))
    return known if known is not None else len(load_tasks(name, split, **options))


def _known_size(spec: EnvSpec, split: str, options: dict[str, Any]) -> int | None:
    """The split's size when the env knows it without building tasks (`EnvSpec.split_size`; `options` resolved)."""
    if spec.split_size is None:
        return None
    return spec.split_size(split, options)


def check_task_count(name: str, split: str, limit: int, **options: Any) -> None:
    """Refuse (ValueError) a count of tasks beyond the split, e.g. a recipe's, before anything runs."""
    size = split_size(name, split, **options)
    if limit > size:
        raise ValueError(_beyond_split(name, split, size, limit))


def _spec_with_split(name: str, split: str) -> EnvSpec:
    spec = get_env_spec(name)
    if spec.splits and split not in spec.splits:
        raise ValueError(f"env {name!r} has no split {split!r}; splits are: {', '.join(spec.splits)}")
    return spec


def _beyond_split(name: str, split: str, size: int, limit: int) -> str:
    # A loader never invents tasks past its split: generated splits would otherwise grow without end.
    return (f"env {name!r} split {split!r} has {size} tasks, and {limit} were asked for; ask for at most {size} "
            "(--tasks, or a stage's tasks), or leave the count unset for the whole split")


def tasks_of(trajectories: Iterable[Trajectory], name: str, **options: Any) -> dict[str, Task]:
    """The tasks that `trajectories` played, by id, from env `name`'s splits (each split loaded once), for
    replaying them (DPO mining, RFT's defect masks)."""
    trajectories = list(trajectories)
    wrong_env = {t.env for t in trajectories} - {name}
    if wrong_env:
        raise ValueError(f"replaying in env {name!r}, but some trajectories come from {sorted(wrong_env)}")
    tasks: dict[str, Task] = {}
    for split in sorted({t.split for t in trajectories}):
        tasks |= {task.id: task for task in load_tasks(name, split, **options)}
    return tasks


def plays_tool_call(env: str, options: dict[str, Any]) -> bool:
    """Whether `env` with `options` plays the plain `tool_call` format (given, or the env's default): the one that means
    the model's own (`with_family_format`)."""
    default = next((o.default for o in get_env_spec(env).options if o.name == "format"), None)
    return options.get("format", default) == "tool_call"


def with_family_format(env: str, options: dict[str, Any], family: Family | None) -> dict[str, Any]:
    """`options` with a `tool_call` format (given, or the env's default) written in the model `family`'s own tool-call
    format ("tool_call:llama3"...): the expert then demonstrates in it and replies are read in it. Unchanged for a
    text format, an unknown family, or a family whose template renders no tools (its renderer refuses tool envs)."""
    if family is None or family.tool_format in (None, "tool_call") or not plays_tool_call(env, options):
        return options
    return {**options, "format": family.tool_format}

