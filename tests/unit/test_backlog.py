"""The order claimed jobs leave the pool's backlog for the workers
(`pgpool.host.backlog.Backlog`): by priority, then in turns across (queue, kind) pairs,
then first in first out."""

from __future__ import annotations

import pytest

from pgpool.host.attempt import Job
from pgpool.host.backlog import Backlog


def job(id_: int, kind: str = "flood", priority: int = 0, queue: str = "default") -> Job:
    return Job(id_, kind, queue, 1, 0, 3, b"{}", None, priority=priority)


def taken(backlog: Backlog) -> list[int]:
    ids = []
    while backlog:
        ahead = backlog.peek()
        got = backlog.popleft()
        assert ahead is got
        ids.append(got.id)
    return ids


def test_a_job_claimed_behind_a_flood_of_another_kind_goes_next() -> None:
    backlog = Backlog()
    backlog.add(job(i) for i in range(1, 5))
    backlog.add([job(100, "urgent"), job(101, "urgent")])
    assert len(backlog) == 6
    # The flood's first job went in first; then each kind in turn.
    assert taken(backlog) == [1, 100, 2, 101, 3, 4]
    assert len(backlog) == 0


def test_higher_priorities_go_first_whatever_was_claimed_before() -> None:
    backlog = Backlog()
    backlog.add([job(1), job(2)])
    backlog.add([job(10, "other", priority=5), job(3)])
    backlog.add([job(20, priority=-1)])
    assert taken(backlog) == [10, 1, 2, 3, 20]


def test_the_same_kind_in_two_queues_takes_turns() -> None:
    backlog = Backlog()
    backlog.add([job(1), job(2), job(3, queue="q2"), job(4, queue="q2")])
    assert taken(backlog) == [1, 3, 2, 4]


def test_jobs_put_first_go_before_all_in_their_order() -> None:
    # A limit's slot holders, and a dead worker's unstarted jobs (the newest put first).
    backlog = Backlog()
    backlog.add([job(1, priority=9), job(2)])
    backlog.add_first([job(5), job(6)])
    backlog.add_first([job(7)])
    assert taken(backlog) == [7, 5, 6, 1, 2]


def test_keep_drops_jobs_and_keeps_the_order_and_count() -> None:
    backlog = Backlog()
    backlog.add([job(1), job(2), job(3, "urgent"), job(4, priority=2)])
    backlog.add_first([job(5)])
    backlog.keep(lambda j: j.id not in (2, 4, 5))
    assert len(backlog) == 2
    assert taken(backlog) == [1, 3]


def test_take_all_empties_it() -> None:
    backlog = Backlog()
    backlog.add([job(1), job(2, "urgent", priority=3)])
    backlog.add_first([job(3)])
    assert sorted(j.id for j in backlog.take_all()) == [1, 2, 3]
    assert len(backlog) == 0
    with pytest.raises(IndexError):
        backlog.popleft()
    with pytest.raises(IndexError):
        backlog.peek()


def test_it_says_which_kinds_have_a_job_waiting() -> None:
    backlog = Backlog()
    assert backlog.kinds() == frozenset()
    backlog.add([job(1), job(2, "urgent", priority=3)])
    backlog.add_first([job(3, "held")])
    assert backlog.kinds() == {"flood", "urgent", "held"}
    assert taken(backlog) == [3, 2, 1]
    assert backlog.kinds() == frozenset()
