"""banking_knowledge retrieval and episode speed, side by side with rank_bm25 used directly, one run.

- index build: turnforge's `BM25Index` (tau2's tokenisation of the 698 documents, then `rank_bm25.BM25Okapi`) vs
  `BM25Okapi` built directly on the same token lists;
- search: per query, turnforge's `BM25Index.search` (top 10) and the whole `KB_search` observation text, vs
  `get_scores` + sort directly on the direct index; the queries are the titles of every shipped task's required
  documents, and both sides must return the same documents in the same order;
- env steps/s: every shipped task's gold episode in-process (expert agent, scripted user), reset to verdict, twice
  (the first pass also builds each task's gold DB, once per process).

    PYTHONPATH=src .venv/bin/python benchmarks/service_bm25.py --data-dir ../shared/data/tau2/banking_knowledge
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from rank_bm25 import BM25Okapi

from turnforge.envs.base import make_env
from turnforge.envs.service.banking import knowledge_base
from turnforge.envs.service.banking.knowledge import BM25Index, kb_search_text, tokens
from turnforge.envs.service.domain import load_domain


def best(fns: dict, repeats: int) -> dict[str, float]:
    """Each function's best time over `repeats` rounds, the functions interleaved within a round (a machine whose
    load changes during the run slows all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(ts) for name, ts in times.items()}


def direct_search(bm25: BM25Okapi, ids: list[str], query: str) -> list[str]:
    scores = bm25.get_scores(query.lower().split())
    return [ids[i] for i in sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:10]]


def episodes(data_dir: str) -> tuple[int, int, float]:
    """(episodes, env steps, seconds) of every shipped task's gold episode."""
    domain = load_domain("banking_knowledge", data_dir, "", "bm25")
    env = make_env("service", domain="banking_knowledge", data_dir=data_dir, retrieval="bm25")
    tasks = [domain.to_task(t, "test") for t in domain.tasks]
    steps, start = 0, time.perf_counter()
    for task in tasks:
        env.reset(task)
        while True:
            steps += 1
            if env.step(env.expert_reply()).done:
                break
        assert env.score().success, task.id
    return len(tasks), steps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    kb = knowledge_base(Path(args.data_dir))
    ids, corpus = list(kb.documents), [tokens(d.content) for d in kb.documents.values()]
    build = best({"turnforge": lambda: BM25Index(kb),
                  "rank_bm25 direct (tokenise + index)": lambda: BM25Okapi([tokens(d.content) for d in kb.documents.values()]),
                  "rank_bm25 index only": lambda: BM25Okapi(corpus)}, args.repeats)
    domain = load_domain("banking_knowledge", args.data_dir, "", "bm25")
    queries = [kb.documents[r].title for t in domain.tasks.values() for r in t.get("required_documents") or []
               if r in kb.documents]
    ours, direct = BM25Index(kb), BM25Okapi(corpus)
    assert all([d for d, _ in ours.search(q)] == direct_search(direct, ids, q) for q in queries)
    per = best({
        "turnforge BM25Index.search": lambda: [ours.search(q) for q in queries],
        "turnforge KB_search (search + tau2's text)": lambda: [kb_search_text(kb, q) for q in queries],
        "rank_bm25 direct (get_scores + sort)": lambda: [direct_search(direct, ids, q) for q in queries],
    }, args.repeats)
    print(f"{len(kb.documents)} documents, {sum(map(len, corpus)):,} tokens; {len(queries)} queries "
          f"(mean {statistics.mean(len(q.split()) for q in queries):.1f} words), same top 10 on both sides")
    print(f"index build, best of {args.repeats}: " + " | ".join(f"{k} {v * 1e3:.1f} ms" for k, v in build.items()))
    for name, seconds in per.items():
        print(f"search {name}: {seconds / len(queries) * 1e3:.2f} ms/query")
    for label in ("first pass (each task's gold DB built)", "second pass (gold DBs cached)"):
        n, steps, seconds = episodes(args.data_dir)
        print(f"gold episodes, {label}: {n} tasks, {steps} env steps in {seconds:.2f} s = {steps / seconds:,.0f} "
              f"steps/s ({seconds / n * 1e3:.1f} ms/episode, reset to verdict)")


if __name__ == "__main__":
    main()
