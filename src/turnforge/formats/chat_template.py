"""Chat rendering, token-exact: the ids a model sees in a multi-turn episode (design.md §5).

An episode's ids are the rendered first prompt, then per turn the exact generated ids and the
*observation delta*: the text the chat template writes after the generated reply, up to and including
the next assistant header. For Qwen3 after a tool observation:

    <|im_end|>\\n<|im_start|>user\\n<tool_response>\\nYou open the fridge 1.\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n

without its leading `<|im_end|>` when the generation already ended with it (the usual case; a
generation cut by length gets the end-of-turn token from the delta). A family may end a reply with one of several
tokens (`Family.turn_ends`): GLM-4.5 writes none after a reply, the next role's token ends it (`<|observation|>`
before tool results, `<|user|>` before a user message); the reply's end is the first of them written after it.
The delta is found by rendering the conversation before and after the observation and checking that one is a
prefix of the other; it is tokenized on its own, from the reply's end token on (dropped afterwards where the model
generated it), which is safe because a byte-level BPE never merges across an added token. The rollout's ids then equal
`apply_chat_template(final messages, tools=..., add_generation_prompt=True)` whenever the generated ids
are the canonical tokenization of their text (tests/test_token_exact.py), and they are the ids the model
actually saw in every case.

This needs a *prefix-preserving* template: appending messages never changes how earlier ones render,
and an assistant reply renders verbatim followed by the end-of-turn token. Qwen3-4B-Instruct-2507's
template is; Qwen3's thinking template is not (it drops the reasoning of turns before the last user
message). The renderer reads the model's family from its template (`formats/families.py`); where the
family's own template is not prefix-preserving and TRL ships a training variant that is (Qwen3 thinking:
`qwen3_training.jinja`, every turn's reasoning kept), the renderer renders with that variant: the ids of an
episode are then the ids the model generated, reasoning included, and its prompts keep earlier turns'
reasoning (docs/families.md). Any other such template is refused at construction (`check_prefix_preserving`)
instead of drifting.

With a window (`window_messages`: the system prompt, the first observation and the last N turns, as many
ALFWorld agents keep), each turn's prompt is rendered afresh from the windowed messages, so every turn is
its own token-exact (prompt, completion) pair.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache, lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from turnforge.formats.families import Family, detect_family
from turnforge.types import Message, ToolCall

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ChatMessage = Message | dict[str, Any]
"""A message as turnforge holds it or as a dataset stores it (OpenAI / HF chat shape)."""


def role_of(message: ChatMessage) -> str:
    """The role of a Message or of a chat dict."""
    return message.role if isinstance(message, Message) else message["role"]


def _as_dict(message: ChatMessage) -> dict[str, Any]:
    return message.to_dict() if isinstance(message, Message) else message


def window_messages(messages: Sequence[ChatMessage], window: int | None) -> list[ChatMessage]:
    """The system prompt + first observation(s) + the last `window` assistant turns with their observations.

    The head is everything before the first assistant message; a turn is an assistant message and the
    messages after it up to the next one. `window=None` keeps everything.

    >>> msgs = [Message("system", "s"), Message("user", "task")]
    >>> msgs += [Message("assistant", "a1"), Message("user", "o1"), Message("assistant", "a2"), Message("user", "o2")]
    >>> [m.content for m in window_messages(msgs, 1)]
    ['s', 'task', 'a2', 'o2']
    """
    if window is None:
        return list(messages)
    if window < 1:
        raise ValueError(f"window must be at least 1 assistant turn (or None for the whole history), got {window}")
    starts = [i for i, m in enumerate(messages) if role_of(m) == "assistant"]
    if len(starts) <= window:
        return list(messages)
    return list(messages[: starts[0]]) + list(messages[starts[-window] :])


def render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[ChatMessage], tools: list[dict] | None,
           generation_prompt: bool, template: str | None = None, date_string: str | None = None,
           family: Family | None = None) -> str:
    """The chat template's text for `messages` (Message objects or dicts), as `apply_chat_template` writes it (with
    `template` instead of the tokenizer's own when given; `date_string`: the day a template that writes today's date
    writes, Llama 3's `date_string` or SmolLM3's clock, instead of the clock's (`template_on_day`); `family`: the
    messages as its template is given them, `template_messages`). The tools go in the variable the template's family
    reads them from (`tool_arguments`)."""
    owner = family or detect_family(template or tokenizer.chat_template)
    day = {"chat_template": template_on_day(template or tokenizer.chat_template, date_string),
           "date_string": date_string} if date_string else {"chat_template": template}
    return tokenizer.apply_chat_template(template_messages(messages, family), **tool_arguments(owner, tools),
                                         add_generation_prompt=generation_prompt, tokenize=False, **day)


def tool_arguments(family: Family | None, tools: list[dict] | None) -> dict[str, Any]:
    """The template variables that give a template of `family` the tools: `tools`, or the variable its templates read
    them from (`Family.tools_argument`: SmolLM3's `xml_tools`), that one only when there are tools (a template that
    asks whether it is defined would write an empty tool section).

    >>> tool_arguments(None, [{"type": "function"}])
    {'tools': [{'type': 'function'}]}
    """
    name = family.tools_argument if family is not None else "tools"
    return {"tools": tools} if name == "tools" else {name: tools} if tools else {}


_CLOCK_CALL = re.compile(r"""strftime_now\(\s*(["'])(.*?)\1\s*\)""")


@lru_cache(maxsize=32)
def template_on_day(template: str, date_string: str) -> str:
    """`template` with the clock it reads (`strftime_now(FORMAT)`: SmolLM3's "Today Date") stopped on the day of
    `date_string` ("02 Dec 2026"): a macro of that name, defined first, shadows transformers' global and writes the day in
    each format the template asks for. (A render variable would shadow it too, but `apply_chat_template` turns a
    callable it is given into a string.) A template that reads no clock is returned as it is."""
    formats = {match.group(2) for match in _CLOCK_CALL.finditer(template)}
    if not formats:
        return template
    day = time.strptime(date_string, "%d %b %Y")
    written = json.dumps({fmt: time.strftime(fmt, day) for fmt in sorted(formats)})
    # The newline after the macro is the one transformers' `trim_blocks` removes, so the template's own start stays.
    return f"{{% macro strftime_now(format) %}}{{{{ {written}[format] }}}}{{% endmacro %}}\n" + template


def template_messages(messages: Sequence[ChatMessage], family: Family | None = None) -> list[dict[str, Any]]:
    """The messages as chat dicts, as the family's template is given them.

    Gemma 4's templates (`Family.calls_in_turn`) write a tool result only after the structured `tool_calls` it answers
    and drop any other tool message. A raw reply holding calls is given as its calls, read by the family's tool format
    as the env reads them, and the text after them (where the template writes a reply's text); a tool message that
    answers no call (the env's answer to a reply it could not read) is given as a user message, so the model sees it.
    DeepSeek-R1-distill's (`Family.verbatim_replies`) are given each reply after the `<think>\n` its prompt wrote.
    """
    dicts = [_as_dict(m) for m in messages]
    if family is not None and family.verbatim_replies:
        return family.opened_replies(dicts)
    if family is None or not family.calls_in_turn:
        return dicts
    from turnforge.formats import get_format

    fmt = get_format(family.tool_format)
    out: list[dict[str, Any]] = []
    for m in dicts:
        if m["role"] == "assistant" and not m.get("tool_calls") and isinstance(m.get("content"), str):
            parsed = fmt.parse(m["content"])
            if isinstance(parsed, Message) and parsed.tool_calls:
                m = {**m, "content": parsed.content, "tool_calls": [c.to_dict() for c in parsed.tool_calls]}
        elif m["role"] == "tool" and not (out and (out[-1].get("tool_calls") or out[-1]["role"] == "tool")):
            m = {"role": "user", "content": m.get("content") or ""}
        out.append(m)
    return out


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of `text` with no BOS/EOS added, exactly as `apply_chat_template(tokenize=True)` tokenizes it."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@runtime_checkable
class ChatRenderer(Protocol):
    """Turns messages into the exact ids a model sees (a model policy's `renderer`, passed to `run_episodes`).

    `turnforge.formats.chat_template.ChatTemplateRenderer` implements it over a Hugging Face chat template.
    """

    window: int | None
    """None: one growing id sequence per episode. N: each prompt is `window_messages(messages, N)` rendered anew."""

    family: Family | None
    """The model's family (`formats/families.py`): the env reads its replies without their reasoning."""

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Ids of a whole prompt, ending with the header of the assistant turn to generate."""
        ...

    def observation_ids(
        self,
        messages: list[Message],
        new_messages: list[Message],
        tools: list[dict] | None,
        generated_ids: list[int],
        finish_reason: str | None,
    ) -> list[int]:
        """Ids appended after `generated_ids`: end-of-turn if the generation lacks it, `new_messages` and the
        next assistant header. `messages` is the conversation up to and including the raw assistant message
        just generated."""
        ...


class ChatTemplateRenderer:
    """The rollout's `ChatRenderer` over a Hugging Face tokenizer's own chat template.

    `window`: None renders the whole history (one growing id sequence per episode); N keeps the system
    prompt, the first observation and the last N turns, re-rendered at every turn. `family`: the model's family
    (`formats/families.py`), read from its template; `template`: the template it renders with (None: the
    tokenizer's own; else TRL's training variant where the own one is not prefix-preserving).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, window: int | None = None, memo: bool = False):
        if window is not None and window < 1:
            raise ValueError(f"window must be at least 1 assistant turn (or None for the whole history), got {window}")
        family = detect_family(tokenizer.chat_template)
        self.template = prefix_preserving_template(tokenizer, family)
        self.family = reading_family(tokenizer, family, self.template)
        self.date_string = time.strftime("%d %b %Y")
        """The day Llama 3's template writes as today's, fixed when the renderer is made: an episode that crosses
        midnight would otherwise stop being prefix-preserving mid-way (a template without a date ignores it)."""
        self.tokenizer = tokenizer
        self.window = window
        self.turn_ends = turn_ends(tokenizer, self.family)
        """The tokens that can end a reply (`Family.turn_ends`; most families: the tokenizer's eos)."""
        self.turn_end_ids: dict[str, int] = dict(zip(self.turn_ends, tokenizer.convert_tokens_to_ids(list(self.turn_ends)),
                                                     strict=True))
        # memo: the last few renders, for one thread rendering one conversation turn by turn (SFT data): each turn's
        # observation renders the conversation its completion rendered just before, and its end the next turn's.
        self._memo: OrderedDict[tuple, tuple[tuple, str]] | None = OrderedDict() if memo else None

    def _render(self, messages: Sequence[ChatMessage], tools: list[dict] | None) -> str:
        """`render(..., generation_prompt=True)`, from the memo when these very message objects were rendered lately
        (the memo holds them, so their ids cannot be reused while they are its keys)."""
        if self._memo is None:
            return render(self.tokenizer, messages, tools, True, self.template, self.date_string, self.family)
        held = (tuple(messages), tools)
        key = (tuple(map(id, messages)), id(tools))
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key][1]
        text = render(self.tokenizer, messages, tools, True, self.template, self.date_string, self.family)
        self._memo[key] = (held, text)
        if len(self._memo) > 4:
            self._memo.popitem(last=False)
        return text

    def prompt_ids(self, messages: Sequence[ChatMessage], tools: list[dict] | None) -> list[int]:
        """Ids of the whole of `messages`, ending with the header of the assistant turn to generate."""
        if tools:
            check_renders_tools(self.tokenizer, self.template)
        return encode(self.tokenizer, self._render(messages, tools))

    def observation_ids(
        self,
        messages: Sequence[ChatMessage],
        new_messages: Sequence[ChatMessage],
        tools: list[dict] | None,
        generated_ids: Sequence[int],
        finish_reason: str | None,
    ) -> list[int]:
        """Ids appended after `generated_ids`: end-of-turn if missing, `new_messages`, the next assistant header.

        `messages` ends with the assistant message just generated. Whether the end-of-turn token is already
        there is read from the ids themselves (a stop string or `max_new_tokens` leaves it out, whatever
        `finish_reason` says).
        """
        _, _, delta = self._split_last_turn(messages, new_messages, tools)
        end = self._end_of(delta)
        ids = encode(self.tokenizer, delta)
        # The template's end is dropped when the model stopped on that very token: after tokenizing, so that the text
        # after it is tokenized as in the whole conversation (Phi-3's <|end|> swallows the newline after it). A model
        # that stopped on another of the family's ends (GLM: <|user|> where a tool result follows, which the template
        # opens with <|observation|>) keeps the id it sampled, which is what it saw, and the delta follows whole.
        if end is not None and generated_ids and generated_ids[-1] == self.turn_end_ids[end]:
            ids = ids[1:]
        return ids

    def completion_ids(self, messages: Sequence[ChatMessage], tools: list[dict] | None,
                       following: Sequence[ChatMessage] = ()) -> list[int]:
        """Canonical ids of the last (assistant) message as a model writes it: its rendered text + the end token the
        template writes after it before `following` (the messages after it in the conversation).

        For a raw reply that is the content; for a message with structured `tool_calls` it is the template's
        rendering of the calls (e.g. Qwen3's `<tool_call>` blocks). The text is the reply's rendering as the last
        message, where a rollout generates it: GLM's template empties a reply's reasoning once a user message follows,
        a rollout's ids keep it. A reply nothing follows ends in the family's first end (GLM: `<|user|>`, what its
        template writes before the next user turn; one stop token of its generation_config).
        """
        _, completion, _ = self._split_last_turn(messages, [], tools)
        delta = self._split_last_turn(messages, following, tools)[2] if following and len(self.turn_ends) > 1 else ""
        end = self._end_of(delta) or self.turn_ends[0]
        return encode(self.tokenizer, completion) + [self.turn_end_ids[end]]

    def _end_of(self, delta: str) -> str | None:
        """The end token a delta starts with (None: the template wrote none, as GLM's before a generation prompt)."""
        return next((end for end in self.turn_ends if delta.startswith(end)), None)

    def _split_last_turn(
        self, messages: Sequence[ChatMessage], new_messages: Sequence[ChatMessage], tools: list[dict] | None
    ) -> tuple[str, str, str]:
        """(prompt text, completion text, delta text from the reply's end on) around the last assistant message."""
        if not messages or role_of(messages[-1]) != "assistant":
            raise ValueError("the conversation must end with the assistant message whose observation is rendered")
        head = self._render(messages[:-1], tools)
        after = self._render([*messages, *new_messages], tools)
        if not after.startswith(head):
            raise ValueError(
                f"{template_name(self.tokenizer, self.template)} is not prefix-preserving on this conversation: rendering it "
                f"with message {len(messages) - 1} (assistant) and the observation after it changes the text "
                f"before them ({_first_difference(head, after)}); token-exact rollouts cannot use it"
            )
        rest = after[len(head) :]
        content = _as_dict(messages[-1]).get("content") or ""
        # The reply itself could contain an end token's text; a verbatim reply is located by its content.
        after_content = len(content) if rest.startswith(content) else 0
        ends = [at for end in self.turn_ends if (at := rest.find(end, after_content)) >= 0]
        if ends:
            return head, rest[: min(ends)], rest[min(ends) :]
        if new_messages:
            raise ValueError(
                f"{template_name(self.tokenizer, self.template)} wrote none of {', '.join(self.turn_ends)} after the "
                f"assistant message {len(messages) - 1}; token-exact rollouts need one"
            )
        # GLM: nothing ends a reply that nothing follows; the generation prompt comes right after it.
        reply = render(self.tokenizer, messages, tools, False, self.template, self.date_string, self.family)
        return head, rest[: len(reply) - len(head)], rest[len(reply) - len(head) :]


# ---- the start-up check ---------------------------------------------------------------------------------

_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Perform one command.",
        "parameters": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]},
    },
}
_CALL = '<tool_call>\n{"name": "act", "arguments": {"action": "look"}}\n</tool_call>'
# Two conversations every supported template must render prefix-preservingly: text actions, and tool calls
# with tool observations (two in a row at the end, which Qwen groups in one user turn).
_PROBES: list[tuple[list[dict[str, Any]], list[dict] | None]] = [
    (
        [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Your task is to: look."},
            {"role": "assistant", "content": "ACTION: look"},
            {"role": "user", "content": "You see a desk 1."},
            {"role": "assistant", "content": "Thought: go.\nACTION: go to desk 1"},
            {"role": "user", "content": "Nothing happens."},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Your task is to: look."},
            {"role": "assistant", "content": _CALL},
            {"role": "tool", "content": "You see a desk 1.", "name": "act"},
            {"role": "assistant", "content": "I look again.\n" + _CALL},
            {"role": "tool", "content": "You see a desk 1.", "name": "act"},
            {"role": "tool", "content": "Nothing happens.", "name": "act"},
        ],
        [_TOOL],
    ),
]
_CHECKED: set[tuple[str, str, str]] = set()
_ADVICE = (
    "Use a template that writes each reply verbatim and never rewrites earlier turns, e.g. for "
    "Qwen3-4B-Instruct-2507: tokenizer.chat_template = trl_chat_template('qwen3_instruct_2507.jinja')."
)


def turn_ends(tokenizer: PreTrainedTokenizerBase, family: Family | None) -> tuple[str, ...]:
    """The tokens that can end a reply: the family's where it names them (`Family.turn_ends`), else the tokenizer's eos."""
    return family.turn_ends if family is not None and family.turn_ends else (tokenizer.eos_token,)


def reading_family(tokenizer: PreTrainedTokenizerBase, family: Family | None, template: str | None) -> Family | None:
    """`family` with where `template`'s generation prompt leaves the reasoning (`Family.prompt_reasoning`)."""
    if family is None or family.reasoning is None:
        return family
    return family.with_prompt_reasoning(render(tokenizer, [{"role": "user", "content": "x"}], None, True, template))


def prefix_preserving_template(tokenizer: PreTrainedTokenizerBase, family: Family | None) -> str | None:
    """The template token-exact rollouts render with: None (the tokenizer's own) when it passes
    `check_prefix_preserving`, else TRL's training variant of it when that one passes: `X_training.jinja` where the
    template is TRL's `X.jinja` (Qwen3.5 think and no-think differ), else the family's; else the own template's error
    is raised."""
    try:
        check_prefix_preserving(tokenizer, family)
        return None
    except ValueError:
        own = trl_template_names().get(tokenizer.chat_template or "", "")
        variant = own.removesuffix(".jinja") + "_training.jinja"
        if family is None or (variant not in trl_template_names().values() and family.training_template is None):
            raise
    training = trl_chat_template(variant if variant in trl_template_names().values() else family.training_template)
    check_prefix_preserving(tokenizer, family, training)
    return training


def check_prefix_preserving(tokenizer: PreTrainedTokenizerBase, family: Family | None = None,
                            template: str | None = None) -> None:
    """Raise a clear ValueError, naming the template, unless it supports token-exact rollouts.

    Checked on probe conversations (text actions; tool calls and tool observations where the template
    renders tools), each reply written as the model's `family` writes it (its reasoning block first): each
    assistant reply renders as `prompt + reply`, followed by one of the family's end tokens (`turn_ends`; GLM's
    template writes nothing after a conversation's last reply), and rendering more messages after it never changes
    the text before. The end tokens must be added tokens, so the observation delta, which starts at one, can be
    tokenized on its own. `template`: check this one instead of the tokenizer's own.
    """
    name = template_name(tokenizer, template)
    if not (template or tokenizer.chat_template):
        raise ValueError(f"{name}: the tokenizer has no chat template; name the model's family in the recipe "
                         f"([model] family = \"qwen3\"...: it gives the family's template) or set tokenizer.chat_template")
    ends = turn_ends(tokenizer, family)
    for end in ends:
        if end is None or end not in tokenizer.get_added_vocab():
            raise ValueError(
                f"{name}: the end-of-turn token {end!r} (tokenizer.eos_token, or the model family's) must be an "
                "added/special token so token-exact rollouts can tokenize each observation on its own; set eos_token "
                "to the token the template writes after an assistant reply (e.g. <|im_end|>)"
            )
    key = (template or tokenizer.chat_template, ends, family.name if family else "")
    if key in _CHECKED:
        return
    family = reading_family(tokenizer, family, template)
    for messages, tools in _PROBES:
        if family is not None:
            # GLM's templates drop a turn's reasoning once a user message follows: its text probe replies without
            reasoning = "I act." if tools or family.keeps_reasoning_before_user else ""
            messages = [{**m, "content": family.probe_reply(m["content"], reasoning)} if m["role"] == "assistant"
                        else m for m in messages]
            if family.calls_in_turn and tools:  # Gemma 4: the probe's calls in its own format, no text before them
                messages = [{**m, "content": _family_call(family)} if _CALL in m["content"] else m for m in messages]
        try:
            render(tokenizer, messages, tools, True, template, family=family)
        except Exception as e:
            if tools is None:
                raise ValueError(f"{name} fails on a plain system/user/assistant conversation: {e}") from e
            continue  # a template without tool messages: tool envs will fail on it, text envs are fine
        _check_probe(tokenizer, messages, tools, name, template, ends, family)
    _CHECKED.add(key)


def _family_call(family: Family) -> str:
    """The probes' call (`act` with `action` "look") as the family's tool format writes it."""
    from turnforge.formats import get_format

    return get_format(family.tool_format).render(Message("assistant", "", tool_calls=[ToolCall("act", {"action": "look"})]))


def _check_probe(tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None,
                 name: str, template: str | None, ends: tuple[str, ...], family: Family | None = None) -> None:
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for n, i in enumerate(starts):
        head = render(tokenizer, messages[:i], tools, True, template, family=family)
        turn = head + messages[i]["content"]
        full = render(tokenizer, messages[: i + 1], tools, False, template, family=family)
        if not (full.startswith(turn) and (full == turn or full[len(turn) :].startswith(ends))):
            raise ValueError(
                f"{name} cannot be used for token-exact rollouts: it does not render an assistant reply "
                f"verbatim between the generation prompt and {' or '.join(map(repr, ends))} "
                f"({_first_difference(turn + ends[0], full)}). {_ADVICE}"
            )
        nxt = starts[n + 1] if n + 1 < len(starts) else len(messages)
        after = render(tokenizer, messages[:nxt], tools, True, template, family=family)
        if not (after.startswith(turn) and after[len(turn) :].startswith(ends)):
            raise ValueError(
                f"{name} is not prefix-preserving: appending the observation after assistant turn {n + 1} "
                f"changes how the conversation before it renders ({_first_difference(turn + ends[0], after)}), so the ids "
                f"of a rollout would drift from the template. {_ADVICE}"
            )


def _first_difference(expected: str, got: str) -> str:
    at = next((k for k, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), min(len(expected), len(got)))
    return f"at character {at}: expected {expected[at : at + 40]!r}, got {got[at : at + 40]!r}"


@cache
def trl_template_names() -> dict[str, str]:
    """TRL's shipped chat templates (`trl/chat_templates/*.jinja`): text -> file name."""
    folder = resources.files("trl").joinpath("chat_templates")
    return {f.read_text(encoding="utf-8"): f.name for f in folder.iterdir() if f.name.endswith(".jinja")}


def trl_chat_template(name: str) -> str:
    """The text of TRL's `chat_templates/NAME` (e.g. "qwen3_instruct_2507.jinja"), read from the installed trl, or of
    turnforge's own `formats/templates/X` for NAME "turnforge/X": a family's template where TRL ships none."""
    package, folder, file = ("turnforge.formats", "templates", name.removeprefix(OWN_TEMPLATES)) \
        if name.startswith(OWN_TEMPLATES) else ("trl", "chat_templates", name)
    path = resources.files(package).joinpath(folder, file)
    if not path.is_file():
        raise ValueError(f"no chat template {name!r}; see {resources.files(package) / folder}")
    return path.read_text(encoding="utf-8")


OWN_TEMPLATES = "turnforge/"
"""The prefix of a family's `template` that is turnforge's (`formats/templates/`), not TRL's."""


def check_renders_tools(tokenizer: PreTrainedTokenizerBase, template: str | None = None) -> None:
    """Raise one clear ValueError when the chat template leaves `tools` out of the prompt: the model would never see
    the env's tools (a template without tool support renders the same text with them and without)."""
    key = template or tokenizer.chat_template
    if key in _RENDERS_TOOLS:
        return
    probe = [{"role": "user", "content": "task"}]
    if render(tokenizer, probe, [_TOOL], True, template) == render(tokenizer, probe, None, True, template):
        raise ValueError(f"{template_name(tokenizer, template)} does not render tools, so the model would never see "
                         "the env's tools: play the env in a text format instead (--env-opt format=react, or act_line "
                         "where the env has it; a recipe's [env] format), or use a model whose template supports tools")
    _RENDERS_TOOLS.add(key)


_RENDERS_TOOLS: set[str] = set()


def template_name(tokenizer: PreTrainedTokenizerBase, template: str | None = None) -> str:
    """'chat template trl/chat_templates/X.jinja' when it (`template`, else the tokenizer's) is one of TRL's, else
    the tokenizer's own."""
    known = trl_template_names().get(template or tokenizer.chat_template or "")
    if known is not None:
        return f"chat template trl/chat_templates/{known}"
    return f"the chat template of {tokenizer.name_or_path or type(tokenizer).__name__}"


def chat_renderer(tokenizer: PreTrainedTokenizerBase, window: int | None = None, memo: bool = False) -> ChatRenderer:
    """The renderer for the tokenizer's model family: harmony's own for gpt-oss, whose template renders replies only from
    structured fields (`formats/harmony.py`), else `ChatTemplateRenderer` (`memo`: see there)."""
    family = detect_family(tokenizer.chat_template)
    if family is not None and family.channels:
        from turnforge.formats.harmony import HarmonyRenderer

        return HarmonyRenderer(tokenizer, window)
    return ChatTemplateRenderer(tokenizer, window, memo)
