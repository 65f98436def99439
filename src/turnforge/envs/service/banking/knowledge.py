"""The banking knowledge base and its offline retrieval (tau2-bench `banking_knowledge/data_model.py` KnowledgeBase,
`knowledge/` bm25_indexer, bm25_retriever, grep_retriever, `retrieval_mixins.py` result texts).

- BM25: `rank_bm25.BM25Okapi` (default k1, b, epsilon) over each document's content, tokenised as tau2 does
  (`text.lower().split()`), the query likewise; the top 10 by score, ties in document order.
- grep: the pattern as a Python regex (case-insensitive; an invalid regex is searched as literal text), each
  document scored by its number of matches, the top 10, ties in document order.

Departure: tau2 orders the documents as its directory listing gives them (`Path.glob`, filesystem order), which
decides ties and the order of the full-KB prompt; here they are in file-name order, the same on every machine. So
documents of equal score (BM25 or grep) may come in another order than tau2's on a given machine (38 of 91
KB_search calls compared in issue 60), and a tie at the last place kept may keep another document; the scores agree.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

TOP_K = 10  # tau2 PipelineSpec.top_k / GrepSpec.top_k


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    content: str


@dataclass
class KnowledgeBase:
    """The documents of `documents/`, by id, in file-name order; the BM25 index is built on first use."""

    documents: dict[str, Document]
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, folder: Path) -> KnowledgeBase:
        if not folder.is_dir():
            raise ValueError(f"service domain 'banking_knowledge': {folder} is not a folder (tau2's documents/, one "
                             "JSON file {id, title, content} per document)")
        documents = {}
        for path in sorted(folder.glob("*.json")):
            raw = json.loads(path.read_text(encoding="utf-8"))
            documents[raw["id"]] = Document(raw["id"], raw["title"], raw["content"])
        return cls(documents)

    @cached_property
    def bm25(self) -> BM25Index:
        return BM25Index(self)

    def by_title_or_id(self, ref: str) -> Document | None:
        """tau2's golden_prompt look-up: a title first, then an id."""
        return next((d for d in self.documents.values() if d.title == ref), None) or self.documents.get(ref)


def tokens(text: str) -> list[str]:
    """tau2's BM25 tokenisation (indexer and retriever alike)."""
    return text.lower().split()


class BM25Index:
    """tau2's bm25 pipeline: `BM25Okapi` over the tokenised contents (built once per process)."""

    def __init__(self, kb: KnowledgeBase):
        from rank_bm25 import BM25Okapi  # the `service` extra; only this domain's search needs it

        start = time.perf_counter()
        self.ids = list(kb.documents)
        self.bm25 = BM25Okapi([tokens(d.content) for d in kb.documents.values()])
        self.build_seconds = time.perf_counter() - start

    def search(self, query: str, top_k: int = TOP_K) -> list[tuple[str, float]]:
        """(document id, score), best first; an empty query finds nothing (tau2's BM25Retriever.retrieve)."""
        if not query or not query.strip():
            return []
        scores = self.bm25.get_scores(tokens(query))
        best = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[: min(top_k, len(self.ids))]
        return [(self.ids[i], float(scores[i])) for i in best]


def grep(kb: KnowledgeBase, pattern: str, top_k: int = TOP_K, case_sensitive: bool = False) -> list[tuple[str, float]]:
    """tau2's GrepRetriever: documents by number of regex matches in their content, most first."""
    if not pattern.strip():
        return []
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        compiled = re.compile(pattern, flags)
    except re.error:
        compiled = re.compile(re.escape(pattern), flags)
    results = []
    for doc_id, doc in kb.documents.items():
        matches = compiled.findall(doc.content)
        if matches:
            results.append((doc_id, float(len(matches))))
    results.sort(key=lambda r: r[1], reverse=True)
    return results[:top_k]


def format_results(kb: KnowledgeBase, results: list[tuple[str, float]]) -> str:
    """tau2's result listing: rank, title, id, score (4 places) and the whole content of each document."""
    lines = []
    for i, (doc_id, score) in enumerate(results, 1):
        doc = kb.documents.get(doc_id)
        title = (doc.title if doc else None) or "Untitled"
        lines.append(f"{i}. {title}\n   ID: {doc_id}\n   Score: {score:.4f}\n   Content: {doc.content if doc else ''}\n")
    return "\n".join(lines)


def kb_search_text(kb: KnowledgeBase, query: str) -> str:
    """tau2's KB_search answer: the listing (or "No relevant documents found.") and its timing line, in tau2's shape
    (`retrieval_mixins.py` `_format_kb_search_result`) with turnforge's search time; nothing else depends on it.

    tau2's pipeline times its post-processing stage, empty for bm25, and prints `reranking=` when that time is above
    0, which two reads of its nanosecond clock in practice always are: its bm25 line is `[Timing: retrieval=Nms, reranking=0ms, total=Nms]`
    (the total adds its input stage, empty too). Here there is no such stage: `reranking=0ms` as tau2 prints it."""
    start = time.perf_counter()
    results = kb.bm25.search(query)
    retrieval_ms = (time.perf_counter() - start) * 1000
    text = format_results(kb, results) if results else "No relevant documents found."
    return text + f"\n\n[Timing: retrieval={retrieval_ms:.0f}ms, reranking=0ms, total={retrieval_ms:.0f}ms]"


def grep_text(kb: KnowledgeBase, pattern: str) -> str:
    """tau2's grep answer."""
    results = grep(kb, pattern)
    return format_results(kb, results) if results else f"No matches found for pattern: {pattern}"


def full_kb_text(kb: KnowledgeBase) -> str:
    """tau2's `format_full_knowledge_base`: every document as Markdown, separated by rules."""
    return "\n\n---\n\n".join(f"## {d.title}\n\n{d.content}" for d in kb.documents.values())
