"""AgentBench DBBench's summary figures: per-type accuracy, the SELECT bucket and `overall_cat_accuracy`.

AgentBench v0.2 reports `<type>_accuracy` for each SELECT-style type and for INSERT and UPDATE, a
`SELECT_accuracy` over every SELECT-style type together, and `overall_cat_accuracy` = the mean of the
SELECT, INSERT and UPDATE accuracies (so each bucket weighs a third, whatever its size). The plain
episode mean (`success` in summary.json) is reported beside it. Departure: a DELETE category (only in
generated tasks; DBBench has none) is its own bucket here, where AgentBench would count it under SELECT.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from turnforge.envs.sql.data import MUTATION_TYPES
from turnforge.types import Trajectory

SELECT = "SELECT"


def agentbench_accuracies(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """{"<type>_accuracy": ..., "SELECT_accuracy": ..., "overall_cat_accuracy": ...} over the episodes given.

    >>> from turnforge.types import Score, StopReason
    >>> def ep(cat, ok): return Trajectory("t", "dbbench", cat, [], [], Score(ok, float(ok), 0.0), StopReason.success)
    >>> acc = agentbench_accuracies([ep("counting", True), ep("other", False), ep("INSERT", True), ep("UPDATE", False)])
    >>> acc["SELECT_accuracy"], acc["overall_cat_accuracy"]
    (0.5, 0.5)
    """
    trajectories = list(trajectories)
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        outcomes[t.category].append(t.score.success)
        if t.category not in MUTATION_TYPES:
            outcomes[SELECT].append(t.score.success)
    accuracy = {f"{k}_accuracy": sum(v) / len(v) for k, v in sorted(outcomes.items())}
    buckets = [accuracy.get(f"{k}_accuracy", 0.0) for k in (SELECT, "INSERT", "UPDATE")]
    # AgentBench: a missing bucket counts 0 (it warns "does not exist" and returns 0).
    accuracy["overall_cat_accuracy"] = sum(buckets) / 3
    # Items whose table could not be set up (e.g. a row with too few values) still count, as in AgentBench.
    accuracy["setup_errors"] = sum(1 for t in trajectories if t.score.details.get("setup_error"))
    return accuracy
