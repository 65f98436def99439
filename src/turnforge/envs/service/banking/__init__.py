"""The banking_knowledge domain (tau2-bench / τ³-bench `domains/banking_knowledge/`): a bank's customer service
whose policies live in a knowledge base of 698 documents that the agent must search.

    turnforge eval --env service --env-opt domain=banking_knowledge \
        --env-opt data_dir=../shared/data/tau2/banking_knowledge --env-opt retrieval=bm25 --policy expert \
        --out runs/banking-gold

The agent's listed tools look up users, log verifications and unlock / call the discoverable tools the knowledge
base names (tools.py, card_tools.py, ...); the retrieval variant (`retrieval=`, variants.py) adds KB_search and / or
grep, or puts documents in the policy. The user has tools of their own over the same DB (user_tools.py); a task's
`user_tools` lists which. Graded as tau2 grades it: DB hash (agent and user share one DB) or ACTION.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from turnforge.envs.service.banking.db import TransactionalDB
from turnforge.envs.service.banking.knowledge import KnowledgeBase
from turnforge.envs.service.banking.tools import KnowledgeTools, variant_toolkit
from turnforge.envs.service.banking.user_tools import KnowledgeUserTools
from turnforge.envs.service.banking.variants import DEFAULT_VARIANT, golden_policy, policy_template, resolve
from turnforge.envs.service.domain import DomainKind, UserSide

NAME = "banking_knowledge"
USER = UserSide(TransactionalDB, KnowledgeUserTools, db_file="", sync=None)  # the user works on the agent's DB
_KBS: dict[str, KnowledgeBase] = {}
_KB_LOCK = threading.Lock()


def knowledge_base(folder: Path) -> KnowledgeBase:
    """The documents of `folder/documents`, loaded once per process (its BM25 index likewise, on first search)."""
    key = str(folder.resolve())
    with _KB_LOCK:
        if key not in _KBS:
            _KBS[key] = KnowledgeBase.load(folder / "documents")
        return _KBS[key]


def with_retrieval(folder: Path, retrieval: str) -> DomainKind:
    """The domain as the retrieval variant `retrieval` serves it: its toolkit and its policy (per task for
    golden_retrieval)."""
    variant = resolve(retrieval or DEFAULT_VARIANT)
    if variant.kb_search and importlib.util.find_spec("rank_bm25") is None:
        raise ValueError(f"banking_knowledge retrieval={variant.name!r} searches with rank_bm25 (as tau2): "
                         "pip install 'turnforge[service]'")
    kb = knowledge_base(folder)
    template = policy_template(folder / "prompts", variant, kb)
    task_policy = (lambda task: golden_policy(template, kb, task)) if variant.inline == "golden" else None
    return DomainKind(NAME, TransactionalDB, variant_toolkit(kb, variant.kb_search, variant.grep),
                      compose_policy=lambda _folder: template, user=USER, task_policy=task_policy)


BANKING = DomainKind(NAME, TransactionalDB, KnowledgeTools, user=USER, retrieval=with_retrieval)
