"""turnforge's tool-call parsers vs transformers' `parse_response` (issue 63: the other reference the issue names).

The same 200 seeded replies per family as benchmarks/tool_call_parsers.py, read by turnforge's format and by
`tokenizer.parse_response(text + end-of-turn, prefix="")` (a finished reply; a cut-off one as it is) after TRL's `add_response_schema` set the family's response template (it
knows Qwen3 / Hermes, Llama 3, Qwen3.5 and GLM-4.5 among turnforge's families). A `parse_response` that raises is counted
apart. Runs in .venv (transformers 5.24, TRL 1.16); no vLLM needed:

    .venv/bin/python benchmarks/tool_call_parse_response.py
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import tool_call_parsers as shared  # noqa: E402  (the replies and turnforge's side of the other benchmark)
from turnforge.formats.chat_template import trl_chat_template  # noqa: E402

TEMPLATES = {"hermes": "qwen3_instruct_2507.jinja", "llama3": "llama3_2.jinja", "qwen3_xml": "qwen3_5_nothink.jinja",
             "glm4": "glm4moe.jinja"}
"""A TRL template of each family that `add_response_schema` knows."""
END = {"hermes": "<|im_end|>", "llama3": "<|eot_id|>", "qwen3_xml": "<|im_end|>", "glm4": ""}
"""The end-of-turn a finished reply ends with, which the response templates read up to (Llama 3's misreads a reply
without it: its JSON region runs to the end); GLM's turn ends with the next role's token, and a cut-off reply with
none."""


def their_calls(tokenizer, text: str) -> list | str | None:
    """parse_response's (name, arguments) list, None for no call, or "raises" when it raised."""
    try:
        calls = tokenizer.parse_response(text, prefix="").get("tool_calls") or []
    except Exception:  # any exception is the finding: the reply has no reading at all
        return "raises"
    out = []
    for call in calls:
        arguments = call["function"]["arguments"]
        out.append((call["function"]["name"], arguments if isinstance(arguments, dict) else json.loads(arguments)))
    return out or None


def main() -> None:
    from trl.chat_template_utils import add_response_schema

    print("| family | replies | disagree | parse_response raised | kinds that disagree |")
    print("|---|---:|---:|---:|---|")
    for name, template in TEMPLATES.items():
        family = shared.FAMILIES[name]
        rows = shared.replies(family, 200, 0)
        tokenizer = shared.minimal_tokenizer(family.special_tokens, [text for _, text in rows])
        tokenizer.chat_template = trl_chat_template(template)
        add_response_schema(tokenizer)
        fmt = shared.turnforge_format(family)
        disagree, raised = Counter(), 0
        for kind, text in rows:
            theirs = their_calls(tokenizer, text if kind == "cut_off" else text + END[name])
            raised += theirs == "raises"
            if shared.turnforge_reads(fmt.parse(text)) != theirs:
                disagree[kind] += 1
        kinds = ", ".join(f"{kind} {n}" for kind, n in disagree.items())
        print(f"| {name} | {len(rows)} | {sum(disagree.values())} | {raised} | {kinds} |")


if __name__ == "__main__":
    main()
