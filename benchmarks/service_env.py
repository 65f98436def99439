"""Per-episode DB cost of the service env on tau2's airline DB (7 MB): copy-on-access vs the naive way, one run.

Workload: every airline task's gold actions as one episode (reset -> the gold calls -> score), and a fixed mix
of tool calls. Two ways, same calls:

  naive   per episode: a deep copy of the parsed DB for the agent and another for the gold actions, then tau2's
          whole-DB hash of each (sha256 of json.dumps(model_dump(), sort_keys=True)) to compare them
  cow     turnforge: an EpisodeDB over the shared parsed DB (records copied on first keyed access), the
          task's gold DB computed once per process and cached, and the comparison over touched records only

    PYTHONPATH=src .venv/bin/python benchmarks/service_env.py --data-dir ../shared/data/tau2/airline --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from turnforge.envs.service.domain import load_domain
from turnforge.envs.service.episode_db import EpisodeDB, canonical_json


class _PlainDB:
    """The naive per-episode DB: a deep copy of the parsed pydantic DB, used by the same toolkit."""

    def __init__(self, model):
        self.model = model.model_copy(deep=True)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def tau2_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model).encode()).hexdigest()


def _episodes(domain):
    return [(task_id, [(a["name"], a["arguments"]) for a in t["evaluation_criteria"]["actions"]])
            for task_id, t in domain.tasks.items()]


def run_naive(domain, episodes) -> float:
    start = time.perf_counter()
    for _, calls in episodes:
        db, gold = _PlainDB(domain.shared.model), _PlainDB(domain.shared.model)
        tools, gold_tools = domain.kind.toolkit(db), domain.kind.toolkit(gold)
        for name, args in calls:
            tools.call(name, json.loads(json.dumps(args)))
        for name, args in calls:
            gold_tools.call(name, json.loads(json.dumps(args)))
        assert db.tau2_hash() == gold.tau2_hash()
    return time.perf_counter() - start


def run_cow(domain, episodes) -> float:
    start = time.perf_counter()
    for task_id, calls in episodes:
        db = EpisodeDB(domain.shared)
        tools = domain.toolkit(db)
        for name, args in calls:
            tools.call(name, json.loads(json.dumps(args)))
        assert db.same_state(domain.gold(task_id).db)
    return time.perf_counter() - start


def time_calls(domain, db_factory, n: int) -> float:
    """Seconds per tool call over a mix of reads and writes, each on a fresh episode DB of 10 calls."""
    mix = [("get_user_details", {"user_id": "emma_kim_9957"}), ("get_reservation_details", {"reservation_id": "EHGLP3"}),
           ("search_direct_flight", {"origin": "JFK", "destination": "MIA", "date": "2024-05-20"}),
           ("get_flight_status", {"flight_number": "HAT014", "date": "2024-05-15"}),
           ("update_reservation_baggages", {"reservation_id": "EHGLP3", "total_baggages": 1, "nonfree_baggages": 0,
                                            "payment_id": "credit_card_5832574"})] * 2
    dbs = [db_factory() for _ in range(n // len(mix))]
    start = time.perf_counter()
    for db in dbs:
        tools = domain.kind.toolkit(db)
        for name, args in mix:
            tools.call(name, dict(args))
    return (time.perf_counter() - start) / (len(dbs) * len(mix))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data/tau2/airline")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    t0 = time.perf_counter()
    domain = load_domain("airline", args.data_dir)
    load_s = time.perf_counter() - t0
    episodes = _episodes(domain)
    for task_id, _ in episodes:  # the gold DBs are built once per process, before any episode
        domain.gold(task_id)
    naive = min(run_naive(domain, episodes) for _ in range(args.repeats)) / len(episodes)
    cow = min(run_cow(domain, episodes) for _ in range(args.repeats)) / len(episodes)
    call_naive = time_calls(domain, lambda: _PlainDB(domain.shared.model), 20)
    call_cow = time_calls(domain, lambda: EpisodeDB(domain.shared), 200)
    print(f"airline DB parsed once in {load_s:.2f} s; {len(episodes)} episodes (gold actions), best of {args.repeats}")
    print("| way | reset + gold calls + score, ms/episode | per tool call on a ready DB, ms |")
    print("|---|---:|---:|")
    print(f"| naive (deep copies + whole-DB hashes) | {naive * 1e3:.1f} | {call_naive * 1e3:.2f} |")
    print(f"| turnforge copy-on-access + record comparison | {cow * 1e3:.2f} | {call_cow * 1e3:.3f} |")
    print(f"| **ratio** | **{naive / cow:.0f}x** | **{call_naive / call_cow:.0f}x** |")


if __name__ == "__main__":
    main()
