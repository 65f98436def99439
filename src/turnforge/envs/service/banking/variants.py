"""tau2's retrieval variants of banking_knowledge (`banking_knowledge/retrieval.py` RETRIEVAL_VARIANTS): which
retrieval tools the agent gets and how its policy is built from `prompts/`.

The offline ones are served: `bm25` (KB_search), `bm25_grep` (KB_search + grep), `grep_only` (grep), `full_kb`
(every document in the prompt), `golden_retrieval` (the task's `required_documents` in the prompt) and
`no_knowledge`. Those that need a model or a server are refused with one line saying which: the embedding
variants (OpenAI text-embedding-3-large or Qwen3-Embedding-8B over OpenRouter), the rerankers (an LLM judge per
document), `alltools` (BM25 + OpenAI embeddings + a shell) and the `terminal_use` shells (tau2 runs the agent's
shell commands in a sandbox over the exported documents; turnforge's code sandbox runs Python, not a shell).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from turnforge.envs.service.banking.knowledge import KnowledgeBase, full_kb_text

DEFAULT_VARIANT = "bm25"  # tau2's default, alltools, needs OpenAI embeddings


@dataclass(frozen=True)
class Variant:
    name: str
    template: str
    kb_search: bool = False
    grep: bool = False
    inline: str = ""
    """"full_kb": the whole KB in the prompt; "golden": the task's required documents."""


VARIANTS = {v.name: v for v in (
    Variant("bm25", "classic_rag_bm25_no_grep.md", kb_search=True),
    Variant("bm25_grep", "classic_rag_bm25.md", kb_search=True, grep=True),
    Variant("grep_only", "grep_only.md", grep=True),
    Variant("full_kb", "full_kb.md", inline="full_kb"),
    Variant("golden_retrieval", "required_docs.md", inline="golden"),
    Variant("no_knowledge", "no_knowledge.md"),
)}

_EMBEDDERS = {"openai": "OpenAI's text-embedding-3-large (api.openai.com)",
              "qwen": "Qwen3-Embedding-8B (through OpenRouter)"}
_RERANKER = "and an LLM reranker scoring each retrieved document (tau2's pointwise_llm_reranker)"
REFUSED = {
    **{f"{e}_embeddings{g}": f"needs the embedding model {m}" for e, m in _EMBEDDERS.items() for g in ("", "_grep")},
    **{f"{e}_embeddings_reranker{g}": f"needs the embedding model {m} {_RERANKER}" for e, m in _EMBEDDERS.items()
       for g in ("", "_grep")},
    **{f"bm25_reranker{g}": f"needs {_RERANKER[4:]}" for g in ("", "_grep")},
    "alltools": f"needs the embedding model {_EMBEDDERS['openai']} and a shell sandbox",
    "AllTools": f"needs the embedding model {_EMBEDDERS['openai']} and a shell sandbox",
    "alltools-qwen": f"needs the embedding model {_EMBEDDERS['qwen']} and a shell sandbox",
    "terminal_use": "needs a shell sandbox over the exported documents (tau2's SandboxManager), and turnforge's "
                    "code sandbox runs Python, not shell commands",
    "terminal_use_write": "needs a writable shell sandbox over the exported documents (tau2's SandboxManager)",
}


def resolve(name: str) -> Variant:
    """The variant `name`, or a one-line refusal naming what it needs."""
    if name in VARIANTS:
        return VARIANTS[name]
    if name in REFUSED:
        raise ValueError(f"banking_knowledge retrieval={name!r} is a tau2 variant that turnforge does not run: it "
                         f"{REFUSED[name]}; use an offline one: {', '.join(VARIANTS)}")
    raise ValueError(f"unknown banking_knowledge retrieval variant {name!r}; use one of {', '.join(VARIANTS)}")


_COMPONENT = re.compile(r"\{\{component:(\w+)\}\}")


def policy_template(prompts: Path, variant: Variant, kb: KnowledgeBase) -> str:
    """tau2's `load_prompt_template`: `{{component:NAME}}` replaced by `components/NAME.md`; for full_kb,
    `{{full_knowledge_base}}` by every document."""
    path = prompts / variant.template
    if not path.is_file():
        raise ValueError(f"service domain 'banking_knowledge': {path} does not exist (tau2's prompts/ folder)")
    text = _COMPONENT.sub(lambda m: (prompts / "components" / f"{m.group(1)}.md").read_text(encoding="utf-8"),
                          path.read_text(encoding="utf-8"))
    if variant.inline == "full_kb":
        text = text.replace("{{full_knowledge_base}}", full_kb_text(kb))
    return text


def golden_policy(template: str, kb: KnowledgeBase, task: dict) -> str:
    """tau2's `golden_prompt`: the task's required documents (by title or id; unknown ones skipped) inlined."""
    docs = [d for d in map(kb.by_title_or_id, task.get("required_documents") or []) if d is not None]
    text = "\n\n---\n\n".join(f"## {d.title}\n\n{d.content}" for d in docs) if docs else "(No documents provided)"
    return template.replace("{{required_documents}}", text)
