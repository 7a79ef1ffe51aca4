"""The replica watch's lines (ha/replicas.py), on a manual clock: one line when a
failover would stop writes, at start and on each change; writes refused for lack
of replicas said once when it begins, again every 10 s while it lasts, and once
when it ends. Its readings against real Redis servers are in tests/test_ha_sentinel.py."""

from __future__ import annotations

import logging

import pytest

from delaywheel.ha.replicas import REFUSED_LINE_EVERY_S, ReplicaWatch


async def _never() -> dict[str, int]:
    raise AssertionError("observe is driven by hand here")


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _watch(wanted: int, clock: Clock) -> ReplicaWatch:
    return ReplicaWatch(wanted, _never, lambda: 0, lambda: 0, clock=clock)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "delaywheel.cluster"]
    caplog.clear()
    return lines


def test_one_line_at_start_and_on_each_change_when_a_failover_would_stop_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "delaywheel.cluster")
    clock = Clock()
    watch = _watch(1, clock)
    watch.observe({"10.0.0.1:6379": 1}, 0, 0)
    (line,) = _lines(caplog)
    assert "Redis primary 10.0.0.1:6379 has 1 replica(s) connected and --replicas 1" in line
    assert "a failover of it would stop every write" in line and "at least 2 replicas" in line
    watch.observe({"10.0.0.1:6379": 1}, 0, 0)
    assert _lines(caplog) == []  # no change, no line
    watch.observe({"10.0.0.1:6379": 2}, 0, 0)
    assert _lines(caplog) == [
        "Redis primary 10.0.0.1:6379 has 2 replica(s) connected: a failover keeps writes"
        " (--replicas 1)"
    ]
    # A failover: the promoted replica, with none of its own.
    watch.observe({"10.0.0.2:6379": 0}, 0, 0)
    (line,) = _lines(caplog)
    assert "10.0.0.2:6379 has 0 replica(s) connected, fewer than --replicas 1" in line
    assert "every write to it is refused" in line
    assert watch.connected == {"10.0.0.2:6379": 0}


def test_a_clusters_primaries_at_risk_are_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "delaywheel.cluster")
    watch = _watch(1, Clock())
    watch.observe({"a:1": 1, "b:2": 1, "c:3": 2}, 0, 0)
    assert _lines(caplog) == [
        "Redis primaries a:1 (1), b:2 (1) have that many replica(s) connected and --replicas 1:"
        " a failover of one of them would stop every write to its partitions (the promoted"
        " replica would have 0) until a replica connects to the new primary; run at least 2"
        " replicas"
    ]
    watch.observe({"a:1": 2, "b:2": 2, "c:3": 2}, 0, 0)
    assert _lines(caplog) == [
        "Redis primaries a:1 (2), b:2 (2) have that many replica(s) connected: a failover keeps"
        " writes (--replicas 1)"
    ]


def test_enough_replicas_at_start_say_nothing_and_none_wanted_never_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "delaywheel.cluster")
    clock = Clock()
    _watch(1, clock).observe({"a:1": 2}, 0, 0)
    assert _lines(caplog) == []
    unwanted = _watch(0, clock)
    unwanted.observe({"a:1": 0}, 0, 0)
    unwanted.observe({"a:1": 1}, 0, 0)
    assert all("would stop" not in line and "refused" not in line for line in _lines(caplog))


def test_writes_refused_for_lack_of_replicas_are_said_once_every_10_s_and_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "delaywheel.cluster")
    clock = Clock()
    watch = _watch(1, clock)
    watch.observe({"a:1": 0}, 0, 0)
    _lines(caplog)
    watch.observe(None, 3, 0)  # three writes refused since the last look
    (line,) = _lines(caplog)
    assert line.startswith("writes refused for lack of replicas: 3 write(s) confirmed")
    assert "--replicas 1 (WAIT)" in line and "a:1 has 0" in line
    assert watch.refusing and watch.stats(3)["refusing"] is True
    for n in range(4, 9):  # more refused, every 2 s: quiet until 10 s have passed
        clock.now_s += 2.0
        watch.observe(None, n, 0)
        if clock.now_s - 100.0 < REFUSED_LINE_EVERY_S:
            assert _lines(caplog) == []
    (line,) = _lines(caplog)
    assert "refused for lack of replicas: 5 write(s) in 10 s" in line
    clock.now_s += 2.0
    watch.observe(None, 8, 0)  # none more, and none written: still refusing
    assert watch.refusing and _lines(caplog) == []
    watch.observe({"a:1": 1}, 8, 1)  # a write confirmed, none refused: confirmed again
    lines = _lines(caplog)
    assert "writes confirmed by replicas again: 8 writes were refused" in lines[-1]
    assert "over 12.0 s" in lines[-1]
    assert not watch.refusing
    assert watch.stats(8) == {
        "wanted": 1,
        "connected": {"a:1": 1},
        "writes_refused": 8,
        "refusing": False,
    }
