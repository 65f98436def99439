"""Model families: how a model's chat template writes turns, tool calls and reasoning, found from the template.

A family is what turnforge must know of a model beyond its tokenizer: the format its tool calls are written in (a
registered format: `tool_call` for Qwen3 / Hermes blocks, `tool_call:llama3` for Llama 3's JSON...), the tags of its
reasoning (`<think>` ... `</think>`), and, where its own template rewrites earlier turns (a thinking template drops
their reasoning), TRL's prefix-preserving training variant of it, which the token-exact renderer then uses instead
(every turn's reasoning stays in the context, as the model generated it: docs/families.md).

    detect_family(tokenizer.chat_template).name     # "llama3" for Llama-3.2-3B-Instruct's template
    get_family("qwen3_thinking").reasoning          # ("<think>", "</think>")

The family is read from the template itself (markers only that family's template writes), so a fine-tuned model keeps
its base model's family; a recipe names the family where the template reads as none or another (`[model] family`:
`named_template`). `tiny:FAMILY` builds an offline tiny model with the family's template and special
tokens (`turnforge.tiny_model`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

QWEN3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
"""Qwen3's added tokens in Qwen3's order (ids 151643-151668 there), and whether each is special."""

LLAMA3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|finetune_right_pad_id|>", True),
    ("<|start_header_id|>", True), ("<|end_header_id|>", True), ("<|eom_id|>", True), ("<|eot_id|>", True),
    ("<|python_tag|>", True),
)
"""Llama 3.2's added tokens that its template and tool calls use (meta-llama/Llama-3.2-3B-Instruct tokenizer.json)."""

LFM2_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|pad|>", True), ("<|startoftext|>", True), ("<|endoftext|>", True), ("<|im_start|>", True),
    ("<|im_end|>", True), ("<|tool_list_start|>", True), ("<|tool_list_end|>", True), ("<|tool_call_start|>", True),
    ("<|tool_call_end|>", True), ("<|tool_response_start|>", True), ("<|tool_response_end|>", True),
)
"""LFM2's added tokens that its template and tool calls use (LiquidAI/LFM2-1.2B tokenizer.json)."""

GEMMA3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<start_of_turn>", True),
    ("<end_of_turn>", True),
)
"""Gemma 3's added tokens that its template uses (google/gemma-3-4b-it tokenizer.json; its image tokens left out)."""

GLM4_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("[MASK]", True), ("[gMASK]", True), ("[sMASK]", True), ("<sop>", True), ("<eop>", True),
    ("<|system|>", True), ("<|user|>", True), ("<|assistant|>", True), ("<|observation|>", True),
    ("<think>", False), ("</think>", False), ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<arg_key>", False), ("</arg_key>", False), ("<arg_value>", False),
    ("</arg_value>", False), ("/nothink", False),
)
"""GLM-4.5's added tokens that its template and tool calls use, in its order (zai-org/GLM-4.5-Air tokenizer_config.json,
ids 151329-151360 there; its image, audio and code tokens left out)."""

GPTOSS_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|startoftext|>", True), ("<|endoftext|>", True), ("<|return|>", True), ("<|constrain|>", True),
    ("<|channel|>", True), ("<|start|>", True), ("<|end|>", True), ("<|message|>", True), ("<|call|>", True),
)
"""gpt-oss's added tokens that harmony uses, in o200k_harmony's order (ids 199998-200012 there; reserved ones left out)."""

GEMMA4_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<mask>", True), ("<|tool>", True),
    ("<tool|>", True), ("<|tool_call>", True), ("<tool_call|>", True), ("<|tool_response>", True),
    ("<tool_response|>", True), ('<|"|>', True), ("<|think|>", True), ("<|channel>", True), ("<channel|>", True),
    ("<|turn>", True), ("<turn|>", True),
)
"""Gemma 4's added tokens that its template and tool calls use, in its order (google/gemma-4-E2B-it: ids 0-4, 46-52,
98, 100, 101, 105, 106 there; its image, audio and video tokens left out). All special: vLLM's gemma4 parser decodes
with `skip_special_tokens=False` to see them; the flags were not read from the Hub's tokenizer.json here."""

DEEPSEEK_R1_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<｜end▁of▁sentence｜>", True), ("<｜User｜>", False), ("<｜Assistant｜>", False), ("<｜begin▁of▁sentence｜>", True),
    ("<|EOT|>", False), ("<think>", False), ("</think>", False), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True),
    ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
"""DeepSeek-R1-Distill-Qwen's added tokens in its order, ids 151643-151664 (deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
tokenizer_config.json; the 7B's is taken to be the same, Qwen2.5's vocabulary with its first seven added tokens
replaced). `<｜User｜>` and `<｜Assistant｜>` are not special there."""

GRANITE4_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|pad|>", True), ("<|end_of_text|>", True), ("<|start_of_role|>", True), ("<|end_of_role|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<tools>", True), ("</tools>", True),
)
"""Granite 4.0's added tokens that its template and tool calls use, in its order (ids 100256-100283 of the Granite 4.0 H
tokenizer.json; its FIM, plugin, `<think>`, `<schema>` and `<documents>` tokens left out). `<tools>` and `</tools>` are
special there, the call and response tags not; it has no `<|tool_call|>` (Granite 3's), nor a bos its template writes."""

PHI3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|assistant|>", True), ("<|system|>", True), ("<|end|>", True), ("<|user|>", True),
)
"""Phi-3.5-mini's added tokens that its template uses, in its order (microsoft/Phi-3.5-mini-instruct: ids 32000, 32001,
32006, 32007, 32010; its `<|placeholderN|>` tokens left out), all special; all but `<|endoftext|>` swallow the
whitespace after them (`Family.rstrip_tokens`)."""

SMOLLM3_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<think>", False), ("</think>", False),
    ("<|finetune_right_pad_id|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<tool_call>", False),
    ("</tool_call>", False),
)
"""SmolLM3's added tokens that its template and tool calls use, in its order: Llama 3.2's vocabulary with reserved
tokens renamed (ids 128000-128004, 128011, 128012, 128015, 128016; `<tool_response>` tags and the rest left out). The
eos is `<|im_end|>`; pad `<|finetune_right_pad_id|>` (transformers' SmolLM3Config: pad_token_id 128004). Its template
writes no bos. Ids and special flags were read from third-party copies, not from the Hub's tokenizer.json."""

@dataclass(frozen=True)
class Family:
    """One model family's conventions (see the module docstring)."""

    name: str
    template: str
    """TRL's copy of the family's own chat template (`trl/chat_templates/NAME`), or turnforge's rendition of it
    ("turnforge/NAME": `formats/templates/NAME`) where TRL ships none: a `tiny:FAMILY` model's template."""
    markers: tuple[str, ...]
    """Text only this family's templates contain; all of them must be there."""
    tool_format: str | None
    """The registered format its tool calls are written in; None where its template renders no tools."""
    tokens: tuple[tuple[str, bool], ...]
    """Its added tokens (text, special), for a tiny tokenizer."""
    eos: str
    """The tokenizer's `eos_token`: for most families the end-of-turn its template writes after an assistant reply."""
    pad: str
    bos: str | None = None
    """The token its template starts with (`bos_token`), if any."""
    reasoning: tuple[str, str] | None = None
    """(open, close) tags around the reasoning a reply starts with; None: the family does not reason in text."""
    training_template: str | None = None
    """TRL's prefix-preserving variant, used by the token-exact renderer where the family's own template is not."""
    prompt_reasoning: bool | None = None
    """Where a template's generation prompt leaves the reasoning: True, opened (Qwen3.5 think writes `<think>\n`, the
    reply starts inside it); False, closed (a no-think prompt writes an empty block: the reply has none); None, not
    touched (the reply opens it itself, or not). Set by the renderer from the template it renders with
    (`with_prompt_reasoning`)."""
    turn_ends: tuple[str, ...] = ()
    """The tokens that can end a reply as the template writes it, each an added token (empty: the tokenizer's
    `eos_token`, written after every reply). The renderer takes the first of them written after a reply as its end.
    GLM-4.5 writes none: the next role's token ends it (`<|user|>`, `<|observation|>`, which its generation_config
    stops on); the first is the end SFT gives a reply that nothing follows."""
    rstrip_tokens: tuple[str, ...] = ()
    """Its added tokens that swallow the whitespace after them when text is encoded (`AddedToken.rstrip`; Phi-3.5's
    `<|end|>\\n<|user|>\\n` is two ids), as a tiny tokenizer adds them."""
    reasoning_layout: str = "{open}\n{reasoning}\n{close}\n\n"
    """A reply's reasoning block as the family's models write it before the rest (GLM: `\n<think>R</think>\n`)."""
    keeps_reasoning_before_user: bool = True
    """False where the family's templates (its own and TRL's training variant) drop a turn's reasoning once a user
    message follows (GLM-4.5): its start-up check's text probe replies without reasoning (docs/families.md)."""

    channels: bool = False
    """Replies are harmony channel messages (gpt-oss): the reasoning is the analysis channel (`formats/harmony.py`)."""
    calls_in_turn: bool = False
    """Its templates write a tool result only after the structured `tool_calls` it answers, in the same model turn
    (Gemma 4: `<|tool_call>...<tool_call|><|tool_response>...<tool_response|>`, the model going on with no new header):
    the renderer gives the template each reply's calls as `tool_calls` (`chat_template.template_messages`)."""
    verbatim_replies: bool = False
    """Its templates write a reply's content as given, and the reasoning's opening only in the generation prompt
    (DeepSeek-R1-distill: `<｜Assistant｜><think>\n`, not written again before the reply in history): the template is
    given each reply with that opening first (`opened_replies`), so a turn renders as the prompt + the reply."""
    tools_argument: str = "tools"
    """The template variable the renderer gives the tools in (`chat_template.tool_arguments`). SmolLM3's release
    template (2025-07) reads them only from `xml_tools`; its current revision reads `tools` too, `xml_tools` still."""

    def split_reasoning(self, text: str) -> tuple[str, str]:
        """(reasoning, the rest) of a reply, as vLLM's reasoning parsers split it: after a prompt that closed the
        reasoning there is none; otherwise the open tag is optional and, with no close tag, the whole reply is
        reasoning (cut off while thinking). A family without reasoning: ("", text). Harmony: `split_reply`."""
        if self.channels:
            from turnforge.formats.harmony import split_reply

            return split_reply(text)
        if self.reasoning is None or self.prompt_reasoning is False:
            return "", text
        start, end = self.reasoning
        before, opened, after = text.partition(start)
        body = after if opened else before
        if end not in body:
            return body, ""
        reasoning, _, rest = body.partition(end)
        return reasoning, rest

    def probe_reply(self, action: str, reasoning: str = "I act.") -> str:
        """A reply with `action` as this family's model writes it after its generation prompt (its reasoning block
        first, without what the prompt wrote of it: Qwen3.5's `<think>\n`), for the start-up check."""
        if self.reasoning is None or self.prompt_reasoning is False:
            return action
        start, end = self.reasoning
        block = self.reasoning_layout.format(open=start, reasoning=reasoning, close=end)
        return (block.partition(start)[2].lstrip("\n") if self.prompt_reasoning else block) + action

    def opened_replies(self, messages: list[dict]) -> list[dict]:
        """The messages as a `verbatim_replies` template is given them: each reply to a generation prompt that opened
        the reasoning (after a user message; DeepSeek-R1-distill's prompt after tool outputs opens nothing) with that
        opening first, a reply without a close tag (a demonstration) with an empty block as Qwen3.5's training
        template writes one, a reply already starting with the opening (a dataset's) as it is."""
        if not self.verbatim_replies or not self.prompt_reasoning:
            return messages
        start, end = self.reasoning
        opening = self.reasoning_layout.split("{reasoning}")[0].format(open=start)
        out = []
        for before, m in zip([None, *messages], messages, strict=False):
            content = m.get("content")
            if m["role"] == "assistant" and isinstance(content, str) and before is not None and before["role"] == "user" \
                    and not content.startswith(opening):
                empty = self.reasoning_layout.format(open=start, reasoning="", close=end)
                m = {**m, "content": (opening if end in content else empty) + content}
            out.append(m)
        return out

    def with_prompt_reasoning(self, generation_prompt: str) -> Family:
        """This family with `prompt_reasoning` read from the end of a rendered generation prompt."""
        if self.reasoning is None:
            return self
        start, end = self.reasoning
        tail = generation_prompt.rstrip()
        return replace(self, prompt_reasoning=True if tail.endswith(start) else False if tail.endswith(end) else None)


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            "qwen3", "qwen3_instruct_2507.jinja", ("<|im_start|>", "<tool_call>"), "tool_call", QWEN3_TOKENS,
            "<|im_end|>", "<|endoftext|>",
        ),
        Family(
            "qwen3_thinking", "qwen3.jinja", ("<|im_start|>", "<tool_call>", "<think>"), "tool_call", QWEN3_TOKENS,
            "<|im_end|>", "<|endoftext|>", reasoning=("<think>", "</think>"),
            training_template="qwen3_training.jinja",
        ),
        Family(
            "qwen3_5", "qwen3_5_think.jinja", ("<|im_start|>", "<tool_call>", "<function="), "tool_call:qwen3_xml",
            QWEN3_TOKENS, "<|im_end|>", "<|endoftext|>", reasoning=("<think>", "</think>"),
            training_template="qwen3_5_think_training.jinja",
        ),
        Family(
            "llama3", "llama3_2.jinja", ("<|start_header_id|>", "<|eot_id|>"), "tool_call:llama3", LLAMA3_TOKENS,
            "<|eot_id|>", "<|finetune_right_pad_id|>", bos="<|begin_of_text|>",
        ),
        Family(
            "gemma3", "gemma3.jinja", ("<start_of_turn>", "<end_of_turn>"), None, GEMMA3_TOKENS, "<end_of_turn>",
            "<pad>", bos="<bos>",
        ),
        Family(
            "gptoss", "gptoss.jinja", ("<|channel|>", "<|call|>"), "tool_call:harmony", GPTOSS_TOKENS, "<|return|>",
            "<|endoftext|>", reasoning=("<|channel|>analysis<|message|>", "<|end|>"), channels=True,
            turn_ends=("<|return|>", "<|call|>"),
        ),
        Family(
            "lfm2", "lfm2.jinja", ("<|im_start|>", "<|tool_list_start|>"), "tool_call:lfm2", LFM2_TOKENS,
            "<|im_end|>", "<|pad|>", bos="<|startoftext|>",
        ),
        Family(
            "glm4", "glm4moe.jinja", ("<|observation|>", "<arg_key>"), "tool_call:glm4", GLM4_TOKENS, "<|endoftext|>",
            "<|endoftext|>", reasoning=("<think>", "</think>"), turn_ends=("<|user|>", "<|observation|>"),
            reasoning_layout="\n{open}{reasoning}{close}\n", keeps_reasoning_before_user=False,
        ),
        Family(
            "gemma4", "gemma4_v5.jinja", ("<|turn>", "<|tool_call>"), "tool_call:gemma4", GEMMA4_TOKENS, "<eos>", "<pad>",
            bos="<bos>", turn_ends=("<turn|>", "<|tool_response>"), calls_in_turn=True,
        ),
        Family(
            "deepseek_r1", "deepseek_r1_distill.jinja", ("<｜Assistant｜><think>", "\\n<｜tool▁output▁begin｜>"), None,
            DEEPSEEK_R1_TOKENS, "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>",
            reasoning=("<think>", "</think>"), training_template="deepseek_r1_distill_training.jinja",
            verbatim_replies=True,
        ),
        # TRL ships no Granite template: turnforge's rendition renders like IBM's granite-4.0-micro / -h-micro / -h-tiny
        # template (system text + its <tools> section, a fallback system prompt without either, a run of tool results
        # as one user turn of <tool_response> blocks; no date) and leaves out its documents (RAG), `available_tools`
        # and content given as parts.
        Family(
            "granite4", "turnforge/granite4.jinja", ("<|start_of_role|>", "<tool_response>"), "tool_call:granite4",
            GRANITE4_TOKENS, "<|end_of_text|>", "<|pad|>",
        ),
        # Phi-3.5-mini's template (Phi-3's and Phi-4-mini's read the same) writes `<|end|>` after every message, the eos
        # (`<|endoftext|>`) only after a conversation rendered without a generation prompt, and no `tools=`; the models
        # stop on `<|end|>`.
        Family(
            "phi3", "phi3_5.jinja", ("<|assistant|>", "<|end|>"), None, PHI3_TOKENS, "<|endoftext|>", "<|endoftext|>",
            turn_ends=("<|end|>",), rstrip_tokens=("<|assistant|>", "<|system|>", "<|end|>", "<|user|>"),
        ),
        # TRL ships no SmolLM3 template: turnforge's rendition renders like HuggingFaceTB/SmolLM3-3B's (revision
        # a169fa4: a metadata system header with today's date and the reasoning mode, a default persona per mode, the
        # /think, /no_think and /system_override flags of a system message, tools from `tools` or `xml_tools`, replies
        # as their text, tool results as user turns, the system turn closed only after tools) and leaves out
        # `python_tools` and content given as parts. The no-think block it writes, `<think>\n\n</think>\n`, is the
        # reasoning layout.
        Family(
            "smollm3", "turnforge/smollm3.jinja", ("<|im_start|>", "Reasoning Mode: "), "tool_call", SMOLLM3_TOKENS,
            "<|im_end|>", "<|finetune_right_pad_id|>", reasoning=("<think>", "</think>"),
            reasoning_layout="{open}\n{reasoning}\n{close}\n", tools_argument="xml_tools",
        ),
    )
}
"""The families a model is read as (`tiny:NAME` builds one of each)."""

_DETECT_ORDER = ("gptoss", "glm4", "smollm3", "qwen3_5", "qwen3_thinking", "qwen3", "llama3", "lfm2", "gemma4", "gemma3",
                "deepseek_r1", "granite4", "phi3")
"""The order templates are matched in, most specific first (qwen3_5's and qwen3_thinking's markers include qwen3's;
SmolLM3's template holds qwen3_thinking's)."""


def list_families() -> list[str]:
    return sorted(FAMILIES)


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; choose one of: {', '.join(list_families())}") from None


FAMILY_TAG = re.compile(r"\A\{# turnforge family: (\w+) #\}")
"""The Jinja comment (it renders nothing, and touches no whitespace around it) a template starts with when a recipe
named its family (`named_template`)."""


def named_template(template: str, family: Family) -> str:
    """`template` naming `family` at its start, which `detect_family` reads before any marker: a recipe's `[model]
    family`, kept by every tokenizer loaded from it and every model saved from those (`tiny_model.resolve_model`)."""
    return f"{{# turnforge family: {family.name} #}}" + FAMILY_TAG.sub("", template)


def detect_family(template: str | None) -> Family | None:
    """The family the template names (`named_template`), else the one whose markers it contains, else None (a
    template turnforge knows no family of: its tool calls are read as Qwen3 / Hermes blocks, the format most open
    models were tuned on)."""
    if not template:
        return None
    named = FAMILY_TAG.match(template)
    if named:
        return get_family(named.group(1))
    for name in _DETECT_ORDER:
        family = FAMILIES[name]
        if all(marker in template for marker in family.markers):
            return family
    return None


def is_tiny(model: str) -> bool:
    """Whether a model spec names an offline tiny model (`turnforge.tiny_model`): "tiny" or "tiny:FAMILY"."""
    return model == "tiny" or model.startswith("tiny:")


def model_family(model: str) -> Family | None:
    """The family of a model spec: "tiny" (Qwen3) / "tiny:FAMILY" by name (an unknown one is a one-line error), a
    local folder or Hub id from its tokenizer's chat template (`detect_family`)."""
    if is_tiny(model):
        return get_family(model.partition(":")[2] or "qwen3")
    from transformers import AutoTokenizer  # only for a real model: its tokenizer files, no weights

    return detect_family(AutoTokenizer.from_pretrained(model).chat_template)


def check_tool_format(family: Family | None, format_name: str) -> None:
    """Raise one clear ValueError when an env reads tool calls in another format than the model's family writes
    them: every call would be a format error (`with_family_format` picks the family's where a recipe or an eval
    says `tool_call`)."""
    if family is None or family.tool_format is None or not format_name.startswith("tool_call"):
        return
    if format_name != family.tool_format:
        raise ValueError(f"the model's chat template is {family.name}'s, which writes tool calls as {family.tool_format}, "
                         f"but the env reads {format_name}: set the env's format to {family.tool_format}")


def visible_reply(family: Family | None, text: str) -> str:
    """What of a reply an env reads: the reply without its reasoning (reasoning is recorded and trained, never sent)."""
    return text if family is None else family.split_reasoning(text)[1]


def accepts_format(name: str, choices: tuple[str, ...]) -> bool:
    """Whether an env offering `choices` plays format `name`: "tool_call" there means tool calls in any family's
    format ("tool_call:llama3"...), the env sees only the parsed calls."""
    return name in choices or ("tool_call" in choices and name.startswith("tool_call:"))


__all__ = ["FAMILIES", "Family", "accepts_format", "check_tool_format", "detect_family", "get_family", "is_tiny", "list_families",
           "model_family", "named_template", "visible_reply"]
