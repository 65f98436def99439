"""Scripted policies (no model): expert, random and replay.

They read `Prompt.env` / `Prompt.task` and write every reply through the env's format
(`env.format.render(...)`), so a scripted episode has exactly the shape of a model's: its transcript
holds format text that `env.format.parse` reads back.

    turnforge eval --env household --policy random --split test --tasks 200 --samples 4 --out runs/random
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from pathlib import Path

from turnforge.envs.base import Env, SupportsAdmissible, SupportsExpert, SupportsNearMisses, expert_text
from turnforge.policies.base import Generation, Prompt, SamplingParams
from turnforge.types import Message, ToolCall, Trajectory, json_records


def _env_of(prompt: Prompt, policy: str) -> Env:
    if prompt.env is None:
        raise ValueError(
            f"the {policy} policy steps a live env, but the prompt of task {prompt.task.id!r} has none"
        )
    return prompt.env


def _ask_env(prompt: Prompt, policy: str, reply: Callable[[], Generation]) -> Generation:
    """`reply()`, or — when the env's own solver or action list fails — a warning and a give-up.

    A failing env method ends that episode (gave_up) instead of the whole batch; the warning names it.
    """
    try:
        return reply()
    except Exception as e:
        warnings.warn(
            f"{policy} policy: the env failed on task {prompt.task.id!r} sample {prompt.sample} turn {prompt.turn} "
            f"({type(e).__name__}: {e}); that episode gives up",
            RuntimeWarning,
            stacklevel=2,
        )
        return Generation(text="", finish_reason="exhausted")


class ExpertPolicy:
    """The env's own scripted solver (`env.expert_reply()`), rendered in the env's format.

    `noise` > 0 perturbs the demonstrations the way DART does (Laskey et al. 2017, "DART: Noise Injection for
    Robust Imitation Learning"): at each turn, with that probability, the reply is a mistake instead of the
    expert's action, one of three kinds drawn alike: the previous reply again (the loop a model falls into), a
    uniform pick among the env's admissible actions (a detour), or one of its near misses where the env lists
    them (`near_miss_actions`: a wrong number or appliance, answered "Nothing happens."; without them, the two
    other kinds). The expert then goes on from the state the mistake left, so
    the episode shows a recovery. The mistaken replies are marked `learn=False` (`Turn.learn`): SFT trains on
    the recoveries and never on the mistakes. The draw comes from an RNG seeded by (seed, task, sample, turn),
    so an episode does not depend on batching or on a resume; a turn's draw is taken before the expert is asked,
    so a stateful expert is asked only for the replies it writes.
    """

    name = "expert"
    renderer = None  # replies are text in the env's format

    def __init__(self, noise: float = 0.0, seed: int = 0):
        if not 0.0 <= noise < 1.0:
            raise ValueError(f"expert noise is a probability per turn in [0, 1), got {noise}")
        self.noise = noise
        self.seed = seed

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return [self._reply(p) for p in prompts]

    def _reply(self, prompt: Prompt) -> Generation:
        env = _env_of(prompt, self.name)
        if not isinstance(env, SupportsExpert):
            raise ValueError(
                f"env {getattr(env, 'name', type(env).__name__)!r} has no expert (no expert_reply()); "
                "use --policy random or replay:FILE"
            )
        mistake = self._mistake(env, prompt) if self.noise else None
        if mistake is not None:
            return Generation(text=mistake, learn=False)
        return _ask_env(prompt, self.name, lambda: Generation(text=expert_text(env)))

    def _mistake(self, env: Env, prompt: Prompt) -> str | None:
        """The perturbed reply of this turn, or None when the expert writes it (see the class docstring)."""
        if not isinstance(env, SupportsAdmissible):
            raise ValueError(
                f"expert noise needs an env that lists admissible actions; {getattr(env, 'name', type(env).__name__)!r} "
                "does not (set noise = 0)"
            )
        rng = random.Random(f"{self.seed}/{prompt.task.id}/{prompt.sample}/{prompt.turn}/noise")
        if rng.random() >= self.noise:
            return None
        kinds = ["repeat"] if prompt.turn > 0 else []  # after the first turn the last assistant message is its reply
        kinds += ["detour"] + (["slip"] if isinstance(env, SupportsNearMisses) else [])
        kind = rng.choice(kinds)
        if kind == "repeat":
            return next(m.content for m in reversed(prompt.messages) if m.role == "assistant")
        actions = env.near_miss_actions() if kind == "slip" else env.admissible_actions()
        if not actions:
            return None
        return expert_text(env, env.action_message(rng.choice(actions)))


class RandomPolicy:
    """Uniform over the env's admissible actions: a floor to compare models against.

    The choice at each turn comes from an RNG seeded by (seed, task_id, sample, turn), so an episode
    does not depend on batching, on the other episodes, or on a resume.
    """

    name = "random"
    renderer = None  # replies are text in the env's format

    def __init__(self, seed: int = 0):
        self.seed = seed

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return [self._reply(p) for p in prompts]

    def _reply(self, prompt: Prompt) -> Generation:
        env = _env_of(prompt, self.name)
        if not isinstance(env, SupportsAdmissible):
            raise ValueError(
                f"env {getattr(env, 'name', type(env).__name__)!r} cannot list admissible actions; "
                "the random policy needs them — use --policy expert or replay:FILE"
            )
        return _ask_env(prompt, self.name, lambda: self._pick(env, prompt))

    def _pick(self, env: SupportsAdmissible, prompt: Prompt) -> Generation:
        actions = env.admissible_actions()
        if not actions:
            return Generation(text="", finish_reason="exhausted")
        # A string seed is hashed with SHA-512 by `random`, so it is stable across processes.
        rng = random.Random(f"{self.seed}/{prompt.task.id}/{prompt.sample}/{prompt.turn}")
        return Generation(text=prompt.env.format.render(env.action_message(rng.choice(actions))))


class ReplayPolicy:
    """Replays saved replies: turn i of episode (task_id, sample) gets the i-th saved reply.

    The JSONL file holds either trajectories (e.g. a run's episodes.jsonl: their assistant messages'
    `content`, in order) or `{"task_id": ..., "replies": [...], "sample": 0}` lines (`sample` optional).
    An assistant message with `tool_calls` (saved function-calling outputs, e.g. BFCL's: one message per
    step, a message without calls ends the user turn) is replayed as its calls, written in the env's format.
    An episode whose replies ran out, or that has none, gets `finish_reason="exhausted"` (-> gave_up).
    """

    renderer = None  # replies are text in the env's format

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"replay:{path}"
        self.replies = load_replies(self.path)
        self.task_ids = frozenset(task_id for task_id, _ in self.replies)

    def generate(self, prompts: list[Prompt], params: SamplingParams) -> list[Generation]:
        return [self._reply(p) for p in prompts]

    def _reply(self, prompt: Prompt) -> Generation:
        replies = self.replies.get((prompt.task.id, prompt.sample), [])
        if prompt.turn >= len(replies):
            return Generation(text="", finish_reason="exhausted")
        reply = replies[prompt.turn]
        if isinstance(reply, Message):  # saved tool calls: written in the env's own format
            return Generation(text=_env_of(prompt, "replay").format.render(reply))
        return Generation(text=reply)


def load_replies(path: Path) -> dict[tuple[str, int], list[str | Message]]:
    """(task_id, sample) -> replies, from a JSONL of trajectories or of `{task_id, replies}` lines."""
    if not path.is_file():
        raise ValueError(f"replay file {path} does not exist; give --policy replay:FILE with a JSONL file")
    replies: dict[tuple[str, int], list[str | Message]] = {}
    seen_at: dict[tuple[str, int], str] = {}
    for where, record in json_records(path, _EXPECTED):
        key, texts = _replay_record(record, where)
        if key in seen_at:
            raise ValueError(
                f"{where}: task {key[0]!r} sample {key[1]} already has replies ({seen_at[key]}); "
                "give each (task_id, sample) one line"
            )
        replies[key], seen_at[key] = texts, where
    if not replies:
        raise ValueError(f"replay file {path} holds no replies (an empty file?); {_EXPECTED}")
    return replies


def _assistant_reply(message: dict) -> str | Message:
    """The text of a saved assistant message, or the message itself when it carries tool calls."""
    if message.get("tool_calls"):
        # Arguments that are not JSON are replayed as written: the env judges them as it judges a model's (issue 46).
        calls = [_saved_call(c, n) for n, c in enumerate(message["tool_calls"], 1)]
        return Message("assistant", text_content(message.get("content")), tool_calls=calls)
    return text_content(message.get("content"))


def _saved_call(call: dict, n: int) -> ToolCall:
    if not isinstance(call, dict) or not isinstance(call.get("function", call).get("name"), str):
        raise ValueError(f"tool call {n} has no function name")
    parsed = ToolCall.from_saved(call)
    if not isinstance(parsed.arguments, dict | str):
        raise ValueError(f"tool call {n}'s arguments are neither an object nor a string")
    return parsed


def text_content(content) -> str:
    """A message's text: a string, None (empty), or an OpenAI content-part list (its text parts, joined).

    >>> text_content([{"type": "text", "text": "ACTION: "}, {"type": "text", "text": "look"}])
    'ACTION: look'
    """
    if content is None or isinstance(content, str):
        return content or ""
    parts = isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)
    if parts and all(isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ValueError(f"a message content must be a string or a list of text parts, got {type(content).__name__}")


def _policy_replies(record: dict) -> list[dict]:
    """The assistant messages the policy wrote: for a trajectory, `Trajectory.reply_indices()` (an env's prompt
    may hold assistant turns of its own, e.g. DBBench's few-shot "Ok."); a bare `messages` record has no turns
    to tell them apart, so its assistant messages after the first user message (all of them when it has none,
    e.g. BFCL's saved outputs): one before it is the env's own opening (tau2's greeting, which the service env
    sends itself), since in every env here the user speaks before the policy."""
    if "turns" in record:
        traj = Trajectory.from_dict(record)
        return [traj.messages[i].to_dict() for i in traj.reply_indices()]
    messages = record["messages"]
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), 0)
    return [m for m in messages[first_user:] if m["role"] == "assistant"]


def _replayed(message: dict, n: int, task_id: str, where: str) -> str | Message:
    try:
        return _assistant_reply(message)
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        raise ValueError(f"{where}: task {task_id!r} reply {n} cannot be replayed ({e}); a reply is a message with "
                         "content a string or text parts, and tool calls each with a name and arguments") from None


_EXPECTED = 'a trajectory (with "messages") or {"task_id": ..., "replies": [...]} a line'


def _replay_record(record: dict, where: str) -> tuple[tuple[str, int], list[str | Message]]:
    expected = f"expected {_EXPECTED}"
    if not isinstance(record.get("task_id"), str):
        raise ValueError(f"{where}: no string task_id; {expected}")
    sample = record.get("sample", 0)
    if not isinstance(sample, int):
        raise ValueError(f"{where}: sample must be an integer, got {sample!r}")
    if "replies" in record:
        texts = record["replies"]
    elif "messages" in record:
        try:
            replies = _policy_replies(record)
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise ValueError(f"{where}: messages must be a list of {{role, content}} objects ({e!r})") from None
        return (record["task_id"], sample), [_replayed(m, n, record["task_id"], where) for n, m in enumerate(replies, 1)]
    else:
        raise ValueError(f"{where}: {expected}")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{where}: replies must be a list of strings")
    return (record["task_id"], sample), texts
