"""turnforge's tool-call parser vs vLLM's, reply by reply (issue 63's measure, first family: Qwen3 / Hermes).

200 replies in the Hermes `<tool_call>{json}</tool_call>` format that Qwen3-Instruct writes, drawn with a fixed seed from
these kinds: one call, nested arguments, unicode, empty arguments, quoted and escaped strings, several calls in one
reply, text before and after, and a reply cut off mid-call. Each is read by vLLM's `Hermes2ProToolParser`
(`extract_tool_calls`, what `vllm serve --tool-call-parser hermes` returns) and by turnforge's `ToolCallFormat`
(`parse_lenient`, what the envs read; `parse_strict` too, whose refusals are counted apart). Agreement: the same
(name, arguments) list, or both reading no call. The script prints the share that disagrees per kind and an
example of each.

Runs where vLLM is installed (vLLM's CPU build: .venv-vllm):

    .venv-vllm/bin/python benchmarks/tool_call_parsers.py --out /tmp/tool_call_parsers.json
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
from pathlib import Path

from turnforge.formats.tool_call import ToolCallFormat
from turnforge.tiny_model import build_tiny_model

WORDS = ["mug", "desk 1", "Zoë", "東京", "naïve café", 'say "hi"', "back\\slash", "tab\there", "", "emoji 🙂"]
NAMES = ["get_order", "search_kb", "transfer_funds", "act", "find_user_id_by_email"]


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


def call_text(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


KINDS = ["one", "nested", "unicode", "empty", "quoted", "several", "text_around", "cut_off"]


def reply(rng: random.Random, kind: str) -> str:
    name = rng.choice(NAMES)
    if kind == "several":
        return "\n".join(call_text(rng.choice(NAMES), arguments(rng, "one")) for _ in range(rng.randint(2, 3)))
    if kind == "text_around":
        return f"Let me check that.\n{call_text(name, arguments(rng, 'one'))}\nDone."
    if kind == "cut_off":
        full = call_text(name, arguments(rng, "nested"))
        return full[: rng.randint(len("<tool_call>") + 5, len(full) - 1)]
    return call_text(name, arguments(rng, kind))


def vllm_reads(parser, text: str) -> list | None:
    info = parser.extract_tool_calls(text, None)
    if not info.tools_called:
        return None
    return [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls]


def turnforge_reads(parsed) -> list | None:
    calls = getattr(parsed, "tool_calls", None)
    return None if not calls else [(c.name, c.arguments) for c in calls]


def main() -> None:
    parser_args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_args.add_argument("--replies", type=int, default=200)
    parser_args.add_argument("--seed", type=int, default=0)
    parser_args.add_argument("--out", type=Path, default=None)
    args = parser_args.parse_args()
    from transformers import AutoTokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    logging.getLogger("vllm").setLevel(logging.CRITICAL)  # its parser logs a traceback for each reply it cannot read

    with tempfile.TemporaryDirectory() as tmp:  # the tiny model's tokenizer: Qwen3's special tokens, <tool_call> too
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(Path(tmp) / "tiny"))
    parser = Hermes2ProToolParser(tokenizer)
    fmt = ToolCallFormat()
    rng = random.Random(args.seed)
    rows = []
    for i in range(args.replies):
        kind = KINDS[i % len(KINDS)]
        text = reply(rng, kind)
        try:
            theirs = vllm_reads(parser, text)
        except Exception as e:  # noqa: BLE001 - a parser that raises reads nothing; recorded
            theirs = f"raised {type(e).__name__}"
        lenient = fmt.parse_lenient(text)
        ours = turnforge_reads(lenient.result)
        strict_refused = not hasattr(fmt.parse_strict(text), "tool_calls")
        rows.append({"kind": kind, "text": text, "vllm": theirs, "turnforge": ours, "agree": theirs == ours,
                     "fixes": lenient.fixes, "strict_refused": strict_refused})
    by_kind = {}
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        by_kind[kind] = {"replies": len(mine), "disagree": sum(not r["agree"] for r in mine),
                         "strict_refused": sum(r["strict_refused"] for r in mine)}
    total = sum(not r["agree"] for r in rows)
    print(f"{len(rows)} replies, disagree {total} ({total / len(rows):.1%})")
    for kind, counts in by_kind.items():
        print(f"  {kind:12s} {counts}")
    for kind in KINDS:
        example = next((r for r in rows if r["kind"] == kind and not r["agree"]), None)
        if example is not None:
            print(f"  e.g. {kind}: {example['text'][:80]!r}\n    vllm {example['vllm']!r}\n    turnforge {example['turnforge']!r}")
    if args.out is not None:
        args.out.write_text(json.dumps({"by_kind": by_kind, "rows": rows}, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
