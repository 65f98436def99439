"""turnforge's tool-call parsers vs vLLM's, reply by reply, one model family at a time (issue 63's measure).

Per family, 200 replies in the format that family's model writes, drawn with a fixed seed from these kinds: one call,
nested arguments, unicode, empty arguments, quoted and escaped strings, several calls in one reply, text before and
after, and a reply cut off mid-call. Each is read by vLLM's parser for the family (`extract_tool_calls`, what
`vllm serve --tool-call-parser NAME` returns) and by turnforge's format (`parse_lenient`, what the envs read;
`parse_strict` too, whose refusals are counted apart). Agreement: the same (name, arguments) list, or both reading no
call. The script prints one row per family (replies, disagreements, share, the kinds that disagree) and an example of
each disagreeing kind.

    family      format              vLLM parser (--tool-call-parser)
    hermes      tool_call           Hermes2ProToolParser (hermes)
    llama3      tool_call:llama3    Llama3JsonToolParser (llama3_json)
    lfm2        tool_call:lfm2      Lfm2ToolParser (lfm2)
    glm4        tool_call:glm4      Glm4MoeModelToolParser (glm45)
    phi4_mini   tool_call:phi4_mini Phi4MiniJsonToolParser (phi4_mini_json)
    qwen3_xml   tool_call:qwen3_xml Qwen3EngineToolParser (qwen3_xml, qwen3_coder)
    gemma4      tool_call:gemma4    Gemma4EngineToolParser (gemma4)
    granite4    tool_call:granite4  Granite4ToolParser (granite4)

vLLM's parsers look their special tokens up in the tokenizer, so each family gets a minimal one: a small byte-level
BPE trained on the family's replies, with the family's special tokens added (`tokenizers`, wrapped in
`PreTrainedTokenizerFast`); `extract_tool_calls` reads text only, so the merges do not matter. Runs where vLLM is
installed (vLLM's CPU build: .venv-vllm):

    .venv-vllm/bin/python benchmarks/tool_call_parsers.py [--family llama3] --out /tmp/tool_call_parsers.json
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnforge.formats import get_format
from turnforge.formats.families import LFM2_TOKENS, LLAMA3_TOKENS, QWEN3_TOKENS
from turnforge.types import Message, ToolCall

WORDS = ["mug", "desk 1", "Zoë", "東京", "naïve café", 'say "hi"', "back\\slash", "tab\there", "", "emoji 🙂"]
NAMES = ["get_order", "search_kb", "transfer_funds", "act", "find_user_id_by_email"]
KINDS = ["one", "nested", "unicode", "empty", "quoted", "several", "text_around", "cut_off"]


def arguments(rng: random.Random, kind: str) -> dict:
    if kind == "empty":
        return {}
    if kind == "nested":
        return {"order": {"id": rng.randint(1, 999), "items": [{"sku": rng.choice(WORDS), "qty": rng.randint(1, 3)}]},
                "flags": [True, None, 1.5]}
    if kind == "unicode":
        return {"city": rng.choice(["東京", "Zoë", "naïve café", "emoji 🙂"]), "note": "Grüße"}
    if kind == "quoted":
        return {"text": rng.choice(['say "hi"', "back\\slash", "tab\there", "a\nb", "{not json}"])}
    return {"action": rng.choice(WORDS), "n": rng.randint(0, 9)}


TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"The {name} tool.", "parameters": {
        "type": "object", "properties": {
            "action": {"type": "string"}, "n": {"type": "integer"}, "order": {"type": "object"},
            "flags": {"type": "array"}, "city": {"type": "string"}, "note": {"type": "string"},
            "text": {"type": "string"}}}}}
    for name in NAMES
]
"""The tools every reply calls, with a JSON schema per argument the replies use (GLM-4's and Qwen3.5's parsers read
values by it)."""


@dataclass(frozen=True)
class Family:
    """How one family's replies are written and which parsers read them."""

    name: str
    format: str
    """turnforge's registered format for it."""
    vllm_parser: str
    """`module:Class` under vllm.tool_parsers."""
    special_tokens: tuple[str, ...]
    opening: str
    """The text a call starts with: a cut-off reply is cut at least 5 characters after it."""
    tag: str = ""
    """A token the model may write before its calls (Llama 3's `<|python_tag|>`): written before half the one-call
    replies."""
    needs_tools: bool = False
    """The parser reads the request's tools (a `ChatCompletionRequest` is passed)."""
    per_request: bool = False
    """vLLM's parser keeps state between replies (Granite 4's stays "inside a call" after a cut-off one and reads no
    call after it): each reply gets a fresh one, as `vllm serve` makes one per request."""


def _tokens(pairs: tuple[tuple[str, bool], ...]) -> tuple[str, ...]:
    return tuple(text for text, _ in pairs)


GLM4_TOKENS = ("<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
               "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<think>", "</think>",
               "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>",
               "<arg_value>", "</arg_value>")
"""GLM-4.5's added tokens that its template and tool calls use (zai-org/GLM-4.5-Air tokenizer_config.json)."""

PHI4_MINI_TOKENS = ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|/tool|>",
                    "<|tool_call|>", "<|/tool_call|>", "<|tool_response|>", "<|tag|>")
"""Phi-4-mini's added tokens around tools (microsoft/Phi-4-mini-instruct tokenizer.json; its calls are plain text)."""

GEMMA4_TOKENS = ("<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
                 "<|tool_response>", "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|image|>", "<|audio|>")
"""Gemma 4's added tokens that its chat template writes (trl/chat_templates/gemma4_v5.jinja)."""

GRANITE4_TOKENS = ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>", "<tool_call>",
                   "</tool_call>", "<tool_response>", "</tool_response>")
"""Granite 4.0's role tokens and the tags around its tool calls (its chat template)."""

FAMILIES = {
    family.name: family
    for family in (
        Family("hermes", "tool_call", "hermes_tool_parser:Hermes2ProToolParser", _tokens(QWEN3_TOKENS), "<tool_call>"),
        Family("llama3", "tool_call:llama3", "llama_tool_parser:Llama3JsonToolParser", _tokens(LLAMA3_TOKENS), "",
               tag="<|python_tag|>"),
        Family("lfm2", "tool_call:lfm2", "lfm2_tool_parser:Lfm2ToolParser", _tokens(LFM2_TOKENS), "<|tool_call_start|>"),
        Family("glm4", "tool_call:glm4", "glm47_moe_tool_parser:Glm47MoeModelToolParser", GLM4_TOKENS, "<tool_call>",
               needs_tools=True),
        Family("phi4_mini", "tool_call:phi4_mini", "phi4mini_tool_parser:Phi4MiniJsonToolParser", PHI4_MINI_TOKENS,
               "functools["),
        Family("qwen3_xml", "tool_call:qwen3_xml", "qwen3_engine_tool_parser:Qwen3EngineToolParser",
               _tokens(QWEN3_TOKENS), "<tool_call>", needs_tools=True),
        Family("gemma4", "tool_call:gemma4", "gemma4_engine_tool_parser:Gemma4EngineToolParser", GEMMA4_TOKENS,
               "<|tool_call>", needs_tools=True),
        Family("granite4", "tool_call:granite4", "granite4_tool_parser:Granite4ToolParser", GRANITE4_TOKENS,
               "<tool_call>", per_request=True),
    )
}


def write_calls(family: Family, calls: list[tuple[str, dict]]) -> str:
    """The calls as the family's model writes them: its format's render (held equal to its chat template in tests)."""
    return get_format(family.format).render(Message("assistant", "", tool_calls=[ToolCall(n, a) for n, a in calls]))


def reply(rng: random.Random, family: Family, kind: str) -> str:
    name = rng.choice(NAMES)
    if kind == "several":
        return write_calls(family, [(rng.choice(NAMES), arguments(rng, "one")) for _ in range(rng.randint(2, 3))])
    if kind == "text_around":
        return f"Let me check that.\n{write_calls(family, [(name, arguments(rng, 'one'))])}\nDone."
    if kind == "cut_off":
        full = write_calls(family, [(name, arguments(rng, "nested"))])
        return full[: rng.randint(len(family.opening) + 5, len(full) - 1)]
    text = write_calls(family, [(name, arguments(rng, kind))])
    if kind == "one" and family.tag and rng.random() < 0.5:
        text = family.tag + text
    return text


def replies(family: Family, count: int, seed: int) -> list[tuple[str, str]]:
    """(kind, text) of `count` replies, the kinds in turn."""
    rng = random.Random(seed)
    return [(KINDS[i % len(KINDS)], reply(rng, family, KINDS[i % len(KINDS)])) for i in range(count)]


def minimal_tokenizer(special_tokens: tuple[str, ...], texts: list[str]) -> Any:
    """A byte-level BPE trained on `texts` with `special_tokens` added: all a vLLM tool parser asks of a tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def vllm_parser(family: Family, texts: list[str]) -> Any:
    import importlib

    module, cls = family.vllm_parser.split(":")
    parser_cls = getattr(importlib.import_module(f"vllm.tool_parsers.{module}"), cls)
    return parser_cls(minimal_tokenizer(family.special_tokens, texts))


def vllm_reader(family: Family, texts: list[str]) -> Any:
    """`text -> vllm_reads(...)` for the family: one parser for all replies, or a fresh one per reply (`per_request`)."""
    parser, request = vllm_parser(family, texts), vllm_request(family)
    if not family.per_request:
        return lambda text: vllm_reads(parser, text, request)
    return lambda text: vllm_reads(type(parser)(parser.model_tokenizer), text, request)


def vllm_request(family: Family) -> Any:
    if not family.needs_tools:
        return None
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)


def vllm_reads(parser: Any, text: str, request: Any) -> list | str | None:
    try:
        info = parser.extract_tool_calls(text, request)
    except Exception as e:  # noqa: BLE001 - a parser that raises reads nothing; recorded
        return f"raised {type(e).__name__}"
    if not info.tools_called or not info.tool_calls:  # phi4_mini's says "called" with no calls when its JSON fails
        return None
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


def turnforge_reads(parsed: Any) -> list | None:
    calls = getattr(parsed, "tool_calls", None)
    return None if not calls else [(c.name, c.arguments) for c in calls]


def turnforge_format(family: Family) -> Any:
    """The family's format; one that reads values by the tools' schemas (tool_call:glm4, :qwen3_xml) is given them."""
    fmt = get_format(family.format)
    return type(fmt)(tools=TOOLS) if family.needs_tools else fmt


def compare(family: Family, count: int = 200, seed: int = 0) -> list[dict]:
    """One row per reply: its kind and text, what each parser read, whether they agree, turnforge's fixes."""
    drawn = replies(family, count, seed)
    read = vllm_reader(family, [text for _, text in drawn])
    fmt = turnforge_format(family)
    rows = []
    for kind, text in drawn:
        theirs = read(text)
        lenient = fmt.parse_lenient(text)
        ours = turnforge_reads(lenient.result)
        rows.append({"kind": kind, "text": text, "vllm": theirs, "turnforge": ours, "agree": theirs == ours,
                     "fixes": lenient.fixes, "strict_refused": not hasattr(fmt.parse_strict(text), "tool_calls")})
    return rows


def summary(rows: list[dict]) -> dict:
    by_kind = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        by_kind[kind] = {"replies": len(mine), "disagree": sum(not r["agree"] for r in mine),
                         "strict_refused": sum(r["strict_refused"] for r in mine)}
    disagree = sum(not r["agree"] for r in rows)
    return {"replies": len(rows), "disagree": disagree, "share": disagree / len(rows), "by_kind": by_kind}


def main() -> None:
    parser_args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_args.add_argument("--family", choices=sorted(FAMILIES), default=None, help="one family (default: all)")
    parser_args.add_argument("--replies", type=int, default=200)
    parser_args.add_argument("--seed", type=int, default=0)
    parser_args.add_argument("--out", type=Path, default=None)
    args = parser_args.parse_args()
    logging.getLogger("vllm").setLevel(logging.CRITICAL)  # its parsers log a traceback for each reply they cannot read

    results = {}
    print(f"{'family':10s} {'replies':>7s} {'disagree':>8s} {'share':>6s}  kinds that disagree")
    for name in [args.family] if args.family else list(FAMILIES):
        rows = compare(FAMILIES[name], args.replies, args.seed)
        results[name] = {**summary(rows), "rows": rows}
        counts = results[name]
        kinds = {k: c["disagree"] for k, c in counts["by_kind"].items() if c["disagree"]}
        print(f"{name:10s} {counts['replies']:7d} {counts['disagree']:8d} {counts['share']:6.1%}  {kinds or '-'}")
        for kind in kinds:
            example = next(r for r in rows if r["kind"] == kind and not r["agree"])
            print(f"    e.g. {kind}: {example['text'][:90]!r}\n      vllm {example['vllm']!r}\n"
                  f"      turnforge {example['turnforge']!r}")
    if args.out is not None:
        args.out.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
