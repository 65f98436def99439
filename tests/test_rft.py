"""RFT selection: successes kept, deduplicated, shortest first, capped per task; yield per category."""


from turnforge.data.rft import replies_key, select_rft
from turnforge.types import Message, Score, StopReason, Trajectory, Turn


def _ep(task, replies, success, progress=0.0, category="a", sample=0):
    messages = [Message("user", "go")]
    for r in replies:
        messages += [Message("assistant", r), Message("user", "ok")]
    return Trajectory(
        task_id=task, env="e", category=category, messages=messages, turns=[Turn(text=r) for r in replies],
        score=Score(success, float(success), progress), stop_reason=StopReason.success if success else StopReason.failure,
        sample=sample, tokens_generated=sum(len(r) for r in replies),
    )


def test_keeps_successes_dedupes_and_prefers_short_ones():
    eps = [
        _ep("t1", ["a", "b", "c"], True, sample=0),
        _ep("t1", ["a", "b"], True, sample=1),
        _ep("t1", ["a",  " b"], True, sample=2),  # the same replies as sample 1, whitespace aside
        _ep("t1", ["x"], False, sample=3),
        _ep("t2", ["y"], False, progress=0.9, category="b"),
    ]
    kept, report = select_rft(eps, keep="success", max_per_task=1)
    assert [(t.task_id, t.sample) for t in kept] == [("t1", 1)]
    kept, report = select_rft(eps, keep="success", max_per_task=5)
    assert [(t.task_id, t.sample) for t in kept] == [("t1", 1), ("t1", 0)]
    # 5 sampled, 3 succeeded, 2 kept: yield 2/5 = 0.4; category b (t2) sampled 1, kept 0
    assert (report["sampled"], report["succeeded"], report["kept"], report["yield"]) == (5, 3, 2, 0.4)
    assert report["by_category"]["a"]["yield"] == 0.5 and report["by_category"]["b"]["kept"] == 0
    assert report["tasks"] == 2 and report["tasks_kept"] == 1


def test_skip_solved_keeps_only_tasks_the_model_does_not_always_solve():
    eps = [
        _ep("solved", ["a"], True, sample=0), _ep("solved", ["b"], True, sample=1),
        _ep("mixed", ["c", "d"], True, sample=0), _ep("mixed", ["x"], False, sample=1),
        _ep("single", ["e"], True),  # one sample says nothing about reliability: kept
    ]
    kept, report = select_rft(eps, keep="success", max_per_task=2, skip_solved=True)
    assert [(t.task_id, t.sample) for t in kept] == [("mixed", 0), ("single", 0)]
    assert (report["succeeded"], report["kept"], report["tasks_kept"]) == (4, 2, 2)
    kept, _ = select_rft(eps, keep="success", max_per_task=2)
    assert [t.task_id for t in kept] == ["solved", "solved", "mixed", "single"]


def test_best_keeps_one_failed_episode_above_the_progress_bar():
    eps = [_ep("t2", ["y"], False, progress=0.9), _ep("t2", ["z"], False, progress=0.4, sample=1),
           _ep("t3", ["w"], False, progress=0.2)]
    kept, _ = select_rft(eps, keep="best", min_progress=0.5)
    assert [(t.task_id, t.sample) for t in kept] == [("t2", 0)]


def test_replies_key_ignores_whitespace_only():
    assert replies_key(_ep("t", ["go  to a"], True)) == replies_key(_ep("t", [" go to a "], True))
    assert replies_key(_ep("t", ["go to a"], True)) != replies_key(_ep("t", ["go to b"], True))
