"""Load a recipe: TOML -> overrides (`--model`, `--set`) -> typed tables -> cross-stage checks -> `Recipe`.

Every problem is collected and reported at once, each as `FILE:LINE: key.path: what is wrong`, before
anything runs. Stages are addressed by id (`stages.sft.learning_rate`, `stages.eval-base.tasks`), by a
unique name (`stages.base.tasks`) or by position from 0 (`stages.1.learning_rate`), in `--set` and in
error messages alike.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from turnforge.envs.base import get_env_spec
from turnforge.models.loading import LoraSpec
from turnforge.recipes.packaged import packaged_recipes
from turnforge.recipes.recipe import Recipe
from turnforge.recipes.schema import EnvConfig, ModelConfig
from turnforge.recipes.toml_text import Loc, key_line
from turnforge.scale import ScaleConfig
from turnforge.stages import stage_kind, stage_kinds
from turnforge.stages.config import PlaysEnv, RolloutStage, TrainStage, find_stage
from turnforge.train.settings import SettingsError

TOP_LEVEL_KEYS = ("name", "description", "model", "env", "scale", "stages")


class RecipeError(ValueError):
    """A recipe that cannot run; the message lists every problem with its file, line and key."""


def find_recipe(spec: str | Path) -> Path:
    """An existing file, else a packaged recipe by name: "quickstart", "quickstart.toml", "recipes/quickstart.toml"."""
    path = Path(spec)
    if path.is_file():
        return path
    packaged = packaged_recipes()
    if path.parent in (Path("."), Path("recipes")) and path.stem in packaged and path.suffix in ("", ".toml"):
        return packaged[path.stem]
    raise FileNotFoundError(
        f"no recipe {str(spec)!r}: not a file, nor a packaged recipe ({', '.join(packaged)})"
    )


def load_recipe(
    spec: str | Path, overrides: list[str] | tuple[str, ...] = (), model: str | None = None
) -> Recipe:
    """Read and validate a recipe file (or packaged recipe name), applying `--model` and `--set KEY=VALUE`.

    Raises RecipeError listing every problem; nothing else has happened when it does.
    """
    path = find_recipe(spec)
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: not valid TOML: {e}") from None
    return parse_recipe(raw, text=text, source=path, overrides=overrides, model=model)


def parse_recipe(
    raw: dict[str, Any],
    text: str = "",
    source: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    model: str | None = None,
) -> Recipe:
    """Validate an already-read recipe dict (see `load_recipe`)."""
    report = _Problems(text, source)
    for pair in overrides:
        _apply_override(raw, pair, report)
    if model is not None:
        model_table = raw.setdefault("model", {})
        if isinstance(model_table, dict):
            model_table["name"] = model
            report.set_by[("model", "name")] = f"--model {model}"
    report.raise_if_any()
    report.stage_ids = _unique_ids(raw.get("stages"))

    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            report.add((key,), f"unknown key; a recipe has {', '.join(TOP_LEVEL_KEYS)}")
    model_cfg = _validate(ModelConfig, raw.get("model", {}), ("model",), report)
    env_cfg = _validate(EnvConfig, raw.get("env", {}), ("env",), report)
    scale_cfg = _validate(ScaleConfig, raw.get("scale", {}), ("scale",), report)
    stages = _validate_stages(raw.get("stages", []), model_cfg, report)
    name = raw.get("name", source.stem if source else "recipe")
    description = raw.get("description", "")
    for key, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            report.add((key,), f"must be a string (got {value!r})")
    # Cross-table checks run on what is valid so far, so that one pass reports every problem.
    recipe = Recipe(name, description, model_cfg or ModelConfig(), env_cfg or EnvConfig(), stages, source,
                    scale_cfg or ScaleConfig())
    if env_cfg is not None:
        _check_env(recipe, report)
    _check_stages(recipe, report)
    report.raise_if_any()
    _inherit_windows(recipe)
    return recipe


def _validate(cls: type[BaseModel], data: Any, loc: Loc, report: _Problems) -> Any:
    if not isinstance(data, dict):
        report.add(loc, f"must be a table (got {data!r})")
        return None
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        report.add_validation(e, loc, cls)
        return None


def _validate_stages(raw_stages: Any, model_cfg: ModelConfig | None, report: _Problems) -> list[Any]:
    """The typed stages, None in the place of each invalid one (so positions match the file)."""
    if not isinstance(raw_stages, list) or not raw_stages:
        report.add(("stages",), "a recipe needs at least one [[stages]] table")
        return []
    stages = []
    for i, data in enumerate(raw_stages):
        loc: Loc = ("stages", i)
        kind = stage_kind(data.get("kind")) if isinstance(data, dict) else None
        if kind is None:
            unknown = data.get("kind") if isinstance(data, dict) else None
            report.add((*loc, "kind"), f"unknown stage kind {unknown!r}; kinds are {', '.join(stage_kinds())}")
            stages.append(None)
            continue
        cls = kind.config
        if "lora" in cls.model_fields and "lora" not in data and model_cfg is not None and model_cfg.lora:
            data = {**data, "lora": model_cfg.lora}
        stages.append(_validate(cls, data, loc, report))
        _check_train_length(data, loc, report)  # on the table as written: reported with its other bad values
    if model_cfg is not None and model_cfg.lora is not None:
        _validate_lora(model_cfg.lora, report)
    return stages


def _validate_lora(lora: dict[str, Any], report: _Problems) -> None:
    try:
        TypeAdapter(LoraSpec).validate_python(lora)
    except ValidationError as e:
        report.add_validation(e, ("model", "lora"), None)


def _check_env(recipe: Recipe, report: _Problems) -> None:
    try:
        spec = get_env_spec(recipe.env.name)
    except ValueError as e:
        report.add(("env", "name"), str(e))
        return
    if recipe.env.format is not None and "format" in recipe.env.options:
        report.add(("env", "format"), "set either env.format or env.options.format, not both")
    coerced = {}
    for key, value in recipe.env_options().items():
        loc = ("env", "format") if key == "format" and recipe.env.format else ("env", "options", key)
        try:
            coerced |= spec.coerce_options({key: value})  # one key at a time: each error at its own line
        except ValueError as e:
            report.add(loc, str(e))
    recipe.env.options = {k: v for k, v in coerced.items() if not (k == "format" and recipe.env.format)}
    for i, stage in enumerate(recipe.stages):
        if not isinstance(stage, PlaysEnv):
            continue
        stage_spec = spec
        if getattr(stage, "env", None):
            name, options = recipe.stage_env(stage)
            try:
                stage_spec = get_env_spec(name)
                stage_spec.coerce_options(options)
            except ValueError as e:
                report.add(("stages", i, "env"), str(e))
                continue
        if stage_spec.splits and stage.split not in stage_spec.splits:
            splits = ", ".join(stage_spec.splits)
            report.add(
                ("stages", i, "split"), f"env {stage_spec.name!r} has no split {stage.split!r}; splits are {splits}"
            )


def _check_stages(recipe: Recipe, report: _Problems) -> None:
    """Unique ids; `model` and `data` name earlier stages of the right kind (invalid stages are None here)."""
    seen: dict[str, int] = {}
    complete = None not in recipe.stages  # references into an invalid stage would only repeat its error
    for i, stage in enumerate(recipe.stages):
        if stage is None:
            continue
        if stage.id in seen:
            report.add(
                ("stages", i, "name"), f"stage id {stage.id!r} is already used by stages[{seen[stage.id]}]"
            )
        seen.setdefault(stage.id, i)
        earlier = [s for s in recipe.stages[:i] if s is not None]
        models = [s for s in earlier if isinstance(s, TrainStage)]
        ref = getattr(stage, "model", None)
        if complete and ref not in (None, "base", "latest") and find_stage(ref, models) is None:
            names = ", ".join(["base", "latest", *(s.id for s in models)])
            report.add(("stages", i, "model"), f"no earlier training stage is called {ref!r}; use one of {names}")
        if complete and hasattr(stage, "model_reads"):  # distill's teacher: an earlier training stage or a spec
            try:
                stage.model_reads(earlier)
            except ValueError as e:
                report.add(("stages", i, "teacher"), str(e))
        collects = [s for s in earlier if s.kind == "collect"]
        for j, data in enumerate(getattr(stage, "data", [])):
            if complete and find_stage(data, collects) is None and not _is_external_data(data, recipe.source):
                names = ", ".join(s.id for s in collects) or "none"
                report.add(
                    ("stages", i, "data", j),
                    f"{data!r} is no earlier collect stage ({names}), hf:DATASET or existing file",
                )


MIN_TRAIN_LENGTH = 128
"""The least `max_length` a recipe's training stage may have. Its examples are env episodes, which open with the
env's system prompt and task in the chat template: the shortest here (household, act_line) is 1,117 characters,
259 tokens of the tiny model and ~280 of Qwen3's. Below 128 not even half of it fits, so no example keeps an
assistant token and the stage fails minutes into the run (`build_dataset`); `--check` says so at once."""


def _check_train_length(table: dict[str, Any], loc: Loc, report: _Problems) -> None:
    """A stage's `max_length` (rft: `train.max_length`) of at least MIN_TRAIN_LENGTH; other types are pydantic's."""
    train = table.get("train")
    for key, length in ((("max_length",), table.get("max_length")),
                        (("train", "max_length"), train.get("max_length") if isinstance(train, dict) else None)):
        if isinstance(length, int) and not isinstance(length, bool) and length < MIN_TRAIN_LENGTH:
            report.add((*loc, *key), f"max_length={length}: expected at least {MIN_TRAIN_LENGTH} tokens (an "
                       "episode's first prompt alone is longer: every example would be cut before its first trained token)")


def _is_external_data(spec: str, source: Path | None) -> bool:
    if spec.startswith("hf:"):
        return True
    path = Path(spec)
    return path.exists() or (
        source is not None and not path.is_absolute() and (source.parent / path).exists()
    )


def _inherit_windows(recipe: Recipe) -> None:
    """hf rollouts without a window use the one their model was trained with (base: the first sft stage's)."""
    sft = {s.id: s for s in recipe.stages if isinstance(s, TrainStage)}
    first = next(iter(sft.values()), None)
    for i, stage in enumerate(recipe.stages):
        if isinstance(stage, RolloutStage) and stage.policy == "hf" and stage.window is None:
            source = recipe.model_source(i)
            trained = sft[source] if source is not None else first
            stage.window = getattr(trained, "window", None) if trained is not None else None


def _apply_override(raw: dict, pair: str, report: _Problems) -> None:
    """`stages.sft.learning_rate=1e-4`: the value is read as TOML (1e-4, true, [1, 2], "x"), else as a string."""
    key, sep, text = pair.partition("=")
    parts = [p.strip() for p in key.split(".")]
    if not sep or not all(parts):
        report.add_message(f"--set {pair!r} is not KEY.PATH=VALUE (e.g. --set stages.sft.learning_rate=1e-4)")
        return
    value = _read_value(text.strip())
    target: Any = raw
    loc: Loc = ()
    for depth, part in enumerate(parts[:-1]):
        if loc == ("stages",):
            index = _stage_index(raw.get("stages", []), part)
            if index is None:
                report.add_message(f"--set {pair}: no stage {part!r}; stages are {_stage_ids(raw)}")
                return
            target, loc = target[index], (*loc, index)
            continue
        if isinstance(target, list):  # an array of tables, e.g. stages.envtune.phases.0.steps
            nxt = target[int(part)] if part.isdigit() and int(part) < len(target) else None
        else:
            nxt = target.setdefault(part, {}) if isinstance(target, dict) else None
        if not isinstance(nxt, dict | list):
            report.add_message(f"--set {pair}: {'.'.join(parts[: depth + 1])} is not a table")
            return
        target, loc = nxt, (*loc, part)
    if not isinstance(target, dict):
        report.add_message(f"--set {pair}: {'.'.join(parts[:-1])} is not a table")
        return
    target[parts[-1]] = value
    report.set_by[(*loc, parts[-1])] = f"--set {pair}"


def _read_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word or path: Qwen/Qwen3-4B, cpu, ...


def _raw_id(stage: Any) -> str | None:
    if not isinstance(stage, dict):
        return None
    kind = stage.get("kind")
    name = stage.get("name", kind)
    return kind if name == kind else f"{kind}-{name}"


def _unique_ids(stages: Any) -> dict[int, str]:
    """Position -> id of the raw stages, when every id is known and unique (else errors say stages[i])."""
    if not isinstance(stages, list):
        return {}
    ids = [_raw_id(s) for s in stages]
    ok = all(isinstance(s, dict) and s.get("kind") in stage_kinds() for s in stages) and len(set(ids)) == len(
        ids
    )
    return dict(enumerate(ids)) if ok else {}


def _stage_ids(raw: dict) -> str:
    return ", ".join(str(_raw_id(s)) for s in raw.get("stages", []))


def _stage_index(stages: list, ref: str) -> int | None:
    ids = [_raw_id(s) for s in stages]
    names = [s.get("name", s.get("kind")) if isinstance(s, dict) else None for s in stages]
    if ref in ids:
        return ids.index(ref)
    if names.count(ref) == 1:
        return names.index(ref)
    if ref.isdigit() and int(ref) < len(stages):
        return int(ref)
    return None


def _nested(inner: Loc, outer: Loc) -> bool:
    return inner[: len(outer)] == outer


@dataclass
class _Problems:
    """Problems found so far, rendered as `FILE:LINE: key.path: message` lines."""

    text: str
    source: Path | None
    set_by: dict[Loc, str] = field(default_factory=dict)
    stage_ids: dict[int, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def add(self, loc: Loc, message: str) -> None:
        # The override that set this key, a table around it, or (for a table-wide error) a key inside it.
        override = next(
            (pair for key, pair in self.set_by.items() if _nested(loc, key) or _nested(key, loc)), None
        )
        if override is not None:
            where = override
        else:
            line = key_line(self.text, loc)
            where = f"{self.source or '<recipe>'}" + (f":{line}" if line else "")
        self.lines.append(f"{where}: {self._path(loc)}: {message}")

    def add_message(self, message: str) -> None:
        self.lines.append(message)

    def add_validation(self, error: ValidationError, prefix: Loc, cls: type[BaseModel] | None) -> None:
        for e in error.errors():
            loc = (*prefix, *e["loc"])
            if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
                allowed = f"; {prefix[-1] if isinstance(prefix[-1], str) else 'this stage'} accepts: "
                known = ", ".join(cls.model_fields) if cls is not None and len(e["loc"]) == 1 else ""
                self.add(loc, "unknown key" + (allowed + known if known else ""))
            elif e["type"] == "missing":
                self.add(loc, "required key is missing")
            elif isinstance(e.get("ctx", {}).get("error"), SettingsError):
                # A stage's settings checked together: each bad value at its own key (and its own --set).
                for key, message in e["ctx"]["error"].problems:
                    self.add((*loc, *(key if isinstance(key, tuple) else (key,))), message)
            else:
                message = e["msg"].removeprefix("Value error, ")
                shown = "" if isinstance(e["input"], dict) else f" (got {e['input']!r})"
                self.add(loc, message + shown)

    def _path(self, loc: Loc) -> str:
        """("stages", 1, "lr") -> "stages.sft.lr" when stage 1's id is known, else "stages[1].lr"."""
        out = ""
        for i, part in enumerate(loc):
            if isinstance(part, int):
                stage_id = self.stage_ids.get(part) if loc[:i] == ("stages",) else None
                out += f".{stage_id}" if stage_id else f"[{part}]"
            else:
                out += f".{part}" if out else part
        return out

    def raise_if_any(self) -> None:
        if self.lines:
            where = self.source or "recipe"
            raise RecipeError(f"{where} is not a valid recipe:\n  " + "\n  ".join(self.lines))
