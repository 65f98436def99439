"""Round-wise DPO pairs: one pair per decision point where a reply went wrong, mined from rollouts.

A pair is (history, chosen next assistant turn, rejected next assistant turn, reason), the schema of the seed
ALFWorld DPO dataset (kuririrn/alfworld_roundwise_dpo_v1: `messages`, `chosen`, `rejected`, `reason`). Mining
replays each trajectory in a fresh env (the env is deterministic given the task and the replies) and judges
every assistant reply; a reply with a defect becomes `rejected`, and `chosen` is, at the same state:
  - for `verbose`: the same action written concisely (the Iron Guard seed's "concise thought + valid action"
    against "verbose, chatty");
  - else, with a teacher model, the teacher's reply at the same history;
  - else a successful sibling episode's reply at an identical history (on-policy text), when one exists;
  - else the env's expert (`expert_reply()` after replaying the history).
A chosen reply is itself stepped and judged; one with any defect is not used (the next source is tried).

Reasons (`REASONS`, most specific first) and how each is judged: `judging.py`.

    judging.py   REASONS, judge_reply: one reply stepped in the env and its defects listed
    mining.py    mine_dpo_pairs: replay trajectories, pick a chosen reply for every defective one
    files.py     Pair, save_pairs / load_pairs: the seed schema and TRL's, as JSONL, parquet, folders, hf:NAME
"""

from __future__ import annotations

from turnforge.data.dpo_pairs.files import (
    PAIR_KEYS,
    Pair,
    load_pairs,
    pair_from_record,
    pairs_dataset,
    save_pairs,
)
from turnforge.data.dpo_pairs.judging import (
    REASONS,
    Judged,
    MiningSettings,
    claims_success,
    is_loop,
    judge_reply,
)
from turnforge.data.dpo_pairs.mining import (
    MiningCounts,
    Teacher,
    mine_dpo_pairs,
    policy_teacher,
    reason_counts,
    replay_trajectory,
)

__all__ = [
    "PAIR_KEYS",
    "REASONS",
    "Judged",
    "MiningCounts",
    "MiningSettings",
    "Pair",
    "Teacher",
    "claims_success",
    "is_loop",
    "judge_reply",
    "load_pairs",
    "mine_dpo_pairs",
    "pair_from_record",
    "pairs_dataset",
    "policy_teacher",
    "reason_counts",
    "replay_trajectory",
    "save_pairs",
]
