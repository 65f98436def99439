"""The `alfworld` env: the real ALFWorld engine (TextWorld + PDDL) behind the same Env protocol.

For users who have ALFWorld's official games (`--env alfworld --env-opt data_dir=...`) or games
exported by `turnforge household export`. It plays each game with TextWorld's `PddlEnv` wrapped by
ALFWorld's own `AlfredDemangler` and `AlfredInfos`, exactly as `AlfredTWEnv` does; the expert is
ALFWorld's PDDL planner (`policy_commands`). Needs `pip install 'turnforge[alfworld]'`.
"""

from __future__ import annotations

import json
from pathlib import Path

from turnforge.envs.household.engine import NOTHING
from turnforge.envs.household.env import (
    ACTION_TOOL,
    action_message,
    action_of,
    observation_message,
    system_text,
)
from turnforge.formats import get_format
from turnforge.formats.base import FormatError
from turnforge.types import Message, Score, StepResult, StopReason, Task

BANNER = "-= Welcome to TextWorld, ALFRED! =-"
# ALFWorld's split folders (alfworld/configs/base_config.yaml); `test` is the usual LLM-agent test set.
SPLIT_DIRS = {"train": "train", "valid_seen": "valid_seen", "valid_unseen": "valid_unseen", "test": "valid_unseen"}


def normalize_observation(text: str) -> str:
    """ALFWorld text as agents see it: without TextWorld's welcome banner, outer whitespace stripped."""
    text = text.strip()
    if text.startswith(BANNER):
        text = text[len(BANNER):].strip()
    return text


def _split_dir(data_dir: Path, split: str) -> Path:
    for candidate in (data_dir / "json_2.1.1" / SPLIT_DIRS[split], data_dir / SPLIT_DIRS[split]):
        if candidate.is_dir():
            return candidate
    return data_dir  # a flat folder of games, e.g. from `turnforge household export`


def load_tasks(split: str, data_dir: str = "", limit: int | None = None, **_options) -> list[Task]:
    """Games under `data_dir` (ALFWorld layout or a flat export), sorted by folder path."""
    if not data_dir:
        raise ValueError("env 'alfworld' needs --env-opt data_dir=PATH (ALFWorld games or a household export)")
    root = _split_dir(Path(data_dir).expanduser(), split)
    tasks = []
    for traj_path in sorted(root.rglob("traj_data.json")):
        game = traj_path.parent / "game.tw-pddl"
        if "movable" in str(traj_path.parent) or "Sliced" in str(traj_path.parent) or not game.exists():
            continue  # AlfredTWEnv skips these too
        traj = json.loads(traj_path.read_text())
        if not json.loads(game.read_text()).get("solvable", False):
            continue
        rel = traj_path.parent.relative_to(root)
        tasks.append(Task(id=str(rel), env="alfworld", split=split, category=traj["task_type"],
                          data={"gamefile": str(game)}))
    tasks = tasks[:limit]
    if not tasks:
        raise ValueError(f"no ALFWorld games (traj_data.json + game.tw-pddl) under {root}")
    return tasks


class AlfWorldEnv:
    """The real ALFWorld engine as an Env. The grammar is the game file's own."""

    name = "alfworld"

    def __init__(self, *, format: str, max_steps: int, planner: bool, hints: bool = False, **_options):
        # hints is no option of this family (the real engine has none); the others come resolved by `make_env`.
        try:
            import textworld  # noqa: F401
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos  # noqa: F401
        except ImportError as e:
            raise RuntimeError("env 'alfworld' needs the real ALFWorld package: pip install 'turnforge[alfworld]'") from e
        if hints:
            raise ValueError("env 'alfworld' has no hints; use env 'household' with hints=true")
        self.format = get_format(format)
        self.max_steps = max_steps
        self.planner = planner  # the PDDL planner replans every step: slow, only needed by the expert
        self._env = None

    def _start(self, gamefile: str):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=self.planner,
                                    extras=["gamefile"])
        env = textworld.start(gamefile, request_infos=infos, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos])
        return env

    def reset(self, task: Task) -> list[Message]:
        if self._env is not None:
            self._env.close()
        self._env = self._start(task.data["gamefile"])
        self.state = self._env.reset()
        self.steps, self.invalid, self.format_errors, self.won = 0, 0, 0, False
        grammar = "0.4" if "move {o} to {r}" in json.loads(Path(task.data["gamefile"]).read_text())["grammar"] else "0.3"
        system = system_text(grammar) + "\n\n" + self.format.system_prompt()  # tool schemas go through tools(): the chat template lists them
        return [Message("system", system), Message("user", normalize_observation(self.state.feedback))]

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def tools(self) -> list[dict] | None:
        return [ACTION_TOOL] if self.format.uses_tools else None

    def step(self, reply: Message | FormatError) -> StepResult:
        self.steps += 1
        call = None
        if isinstance(reply, FormatError):
            self.format_errors += 1
            text = NOTHING
        else:
            action, call = action_of(reply)
            self.state, _, _ = self._env.step(action)
            text = normalize_observation(self.state.feedback)
            self.invalid += text == NOTHING
        self.won = bool(self.state["won"])
        done = self.won or self.steps >= self.max_steps
        stop = StopReason.success if self.won else (StopReason.max_turns if done else None)
        msg = observation_message(self.format, text, call)
        return StepResult([msg], float(self.won), done, stop, {"progress": float(self.won), "won": self.won})

    def score(self) -> Score:
        return Score(self.won, float(self.won), float(self.won),
                     {"steps": self.steps, "invalid_actions": self.invalid, "tool_errors": self.invalid,
                      "format_errors": self.format_errors})

    def admissible_actions(self) -> list[str]:
        return list(self.state["admissible_commands"])

    def action_message(self, action: str) -> Message:
        return action_message(self.format, action)

    def expert_reply(self) -> Message:
        if not self.planner:
            raise ValueError("env 'alfworld' was built with planner=false; the expert needs planner=true")
        plan = self.state["policy_commands"] or ["look"]
        return self.action_message(plan[0])

