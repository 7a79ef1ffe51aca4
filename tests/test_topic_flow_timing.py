"""A topic's flow on two nodes of one Redis keyspace where timing is what is
tested, run alone (``serial``): the rate, to an HTTP sink and through
``reserve``, on a pair of nodes shared by the module; a pause, a timed pause,
a wait and the limits across a takeover (``kill -9`` of the node that holds
the topic's settings), and a pause across a ``kill -9`` of both nodes, each
on a pair of its own with a short lease.

docs/ha.md ("Topic settings on several nodes") says what holds: no more than
rate * t + burst in any window of t while the partitions stay; during a
takeover the partitions no node serves count for no node, the survivor's
share grows at its first round after it serves them, a node gaining a share
may let out one burst more, and the moved partition's reserved tasks count
against the new owner's share."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from clusternodes import PARTITIONS, SETTLE_TIMEOUT_S, address, node_pair, served, settled
from delaywheel_client import Client, ClusterClient
from delaywheel_client.partitions import partition_of, settings_key
from endpoint import Endpoint
from endpoint import endpoint as endpoint  # the fixture
from flowcheck import (
    Workers,
    blocked_waits,
    cluster_wait,
    learned,
    most_in_any_window,
    owner_of,
    shares,
    spread_ids,
    workers_on_both,
)
from flowcheck import dw as dw  # the fixtures
from flowcheck import nodes as nodes
from flowcheck import sink as sink
from helpers import unique
from serverproc import ServerProcess
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.serial]

FOR_EVER_S = 253_402_300_799.0
TAKEOVER_LEASE_S = 1.5  # the takeover's pairs: a takeover within 2 L
TAKEOVER_TIMEOUT_S = 6 * TAKEOVER_LEASE_S


def test_a_rate_over_two_nodes_holds_for_the_topic(
    nodes: list[ServerProcess], dw: ClusterClient, sink: Endpoint
) -> None:
    topic, rate, burst, count = unique(), 40.0, 4, 40
    dw.topic_set(topic, {"rate": rate, "burst": burst})
    # Eight partitions each: half the rate and half the burst.
    found = learned(nodes, topic, rate=rate / 2)
    assert [f["burst"] for f in found] == [2, 2]
    target = {"type": "http", "url": sink.url("/ok")}
    for task_id in spread_ids(nodes, topic, count):
        dw.add(topic, task_id, id=task_id, target=target)
    wait_until(lambda: len(sink.requests()) == count, 30, "every delivery")
    arrivals_s = [seen.at_s for seen in sink.requests()]
    # No more than rate * t + burst in any window t; more for the jitter between
    # a node's start of an attempt and its arrival here: one per node, and what
    # 50 ms of a stall here (a loaded machine) would bunch together.
    jitter = len(nodes) + rate * 0.05
    for window_s in (0.25, 0.5, 1.0):
        assert most_in_any_window(arrivals_s, window_s) <= rate * window_s + burst + jitter
    took_s = max(arrivals_s) - min(arrivals_s)
    assert took_s >= (count - burst) / rate - 0.1  # the two shares add up to the rate
    assert len({seen.body for seen in sink.requests()}) == count  # each once


def test_reserve_keeps_to_a_rate_over_two_nodes(
    nodes: list[ServerProcess], dw: ClusterClient
) -> None:
    topic, rate, burst, count = unique(), 20.0, 2, 30
    dw.topic_set(topic, {"rate": rate, "burst": burst})
    assert [f["burst"] for f in learned(nodes, topic, rate=rate / 2)] == [1, 1]
    ids = spread_ids(nodes, topic, count)
    for task_id in ids:
        dw.add(topic, task_id, id=task_id)
    workers = Workers(workers_on_both(nodes, 1, 2), topic, count)
    workers.join(60)
    assert sorted(workers.ids) == sorted(ids)
    # As to the HTTP sink: the jitter between the server's answer and the
    # worker's clock is one per node and what 50 ms of a stall bunches together.
    jitter = len(nodes) + rate * 0.05
    for window_s in (0.25, 0.5, 1.0):
        most = most_in_any_window(workers.handed_s, window_s)
        assert most <= rate * window_s + burst + jitter, (window_s, most)
    took_s = max(workers.handed_s) - min(workers.handed_s)
    assert took_s >= (count - burst - jitter) / rate  # the two shares add up to the rate


# -- across a takeover ------------------------------------------------------------


@pytest.fixture
def pair(redis_url: str) -> Iterator[list[ServerProcess]]:
    # The later --lease wins over clusternodes' own.
    with node_pair(redis_url, "--tick", "0.02", "--lease", str(TAKEOVER_LEASE_S)) as nodes:
        yield nodes


def held_by(proc: ServerProcess, stem: str) -> str:
    """A topic named from ``stem`` whose settings' record is in a partition ``proc`` serves."""
    owned = served(proc)
    return next(
        name
        for n in range(10_000)
        if partition_of(settings_key(name := f"{stem}{n}"), PARTITIONS) in owned
    )


def taken_over(survivor: ServerProcess) -> None:
    wait_until(
        lambda: len(served(survivor)) == PARTITIONS, TAKEOVER_TIMEOUT_S, "the survivor's takeover"
    )


def drain(dw: Client, topic: str) -> list[str]:
    got = []
    while (task := dw.reserve(topic, 0)) is not None:
        got.append(task["id"])
    return got


def two_pauses(
    pair: list[ServerProcess], held: str, timed: str, pause_s: float
) -> tuple[float, list[str], list[str]]:
    """``held`` paused until resumed (a note with it), ``timed`` for ``pause_s``, both
    applied on both nodes, then six tasks of each spread over them: the pause's end
    and the ids."""
    with ClusterClient([address(proc) for proc in pair]) as dw:
        dw.topic_set(held, {"paused_until": FOR_EVER_S, "note": "incident"})
        pause_end_s = time.time() + pause_s
        dw.topic_set(timed, {"paused_until": pause_end_s})
        learned(pair, held, paused_until=FOR_EVER_S)
        learned(pair, timed, paused_until=pause_end_s)
        held_ids, timed_ids = spread_ids(pair, held, 6), spread_ids(pair, timed, 6)
        for topic, ids in ((held, held_ids), (timed, timed_ids)):
            for task_id in ids:
                dw.add(topic, task_id, id=task_id)
    return pause_end_s, held_ids, timed_ids


PAUSE_S = 8.0  # from its topic_set: beyond the learning and the takeover (2 s), with room


@pytest.mark.slow
def test_a_pause_a_timed_pause_and_a_wait_outlast_a_takeover(pair: list[ServerProcess]) -> None:
    killed, survivor = pair
    held, timed = held_by(killed, "held"), held_by(killed, "timed")
    waited = next(f"waited{n}" for n in range(1000) if owner_of(pair, f"waited{n}") == 0)
    pause_end_s, held_ids, timed_ids = two_pauses(pair, held, timed, PAUSE_S)
    with ClusterClient([address(proc) for proc in pair]) as dw:
        dw.add("results", id=waited, retain=60)
    waiting = cluster_wait(pair, waited, 60)  # at the node about to die
    blocked_waits(pair, 1)
    killed.kill()
    taken_over(survivor)
    with Client(*survivor.address) as dw:
        assert time.time() < pause_end_s - 1, "the takeover outlasted the timed pause"
        assert dw.topic_get(held)["note"] == "incident"
        assert (dw.topic_get(timed)["paused"], dw.topic_get(timed)["paused_until"]) == (
            True, pause_end_s,
        )  # fmt: skip
        # Both topics' tasks, the moved partitions' too: ready, and held back.
        assert dw.reserve(held, 0) is None and dw.reserve(timed, 0) is None
        assert {dw.get(task_id)["state"] for task_id in held_ids + timed_ids} == {"ready"}  # type: ignore[index]
        # The timed pause ends by itself, on time: a blocked reserve is answered then.
        first = dw.reserve(timed, 30)
        ended_s = time.time()
        assert first is not None and first["attempts"] == 1
        assert pause_end_s - 0.05 <= ended_s < pause_end_s + 2, ended_s - pause_end_s
        assert sorted([first["id"], *drain(dw, timed)]) == sorted(timed_ids)
        assert dw.reserve(held, 0) is None  # the other pause holds on
    with ClusterClient([address(survivor)]) as dw:
        dw.topic_set(held, {"paused_until": None})
        assert sorted(drain(dw, held)) == sorted(held_ids)
        # The wait sent to the dead node is sent again to the survivor, and
        # answered by an ack there.
        task = dw.reserve("results", 5)
        assert task is not None and task["id"] == waited
        assert dw.ack(waited, {"after": "the takeover"}) is True
    answer = waiting.result()
    assert (answer["state"], answer["result"]) == ("done", {"after": "the takeover"})


@pytest.mark.slow
def test_the_limits_hold_while_the_partitions_move_to_the_survivor(
    pair: list[ServerProcess],
) -> None:
    killed, survivor = pair
    seeds = [address(proc) for proc in pair]
    limited, rated = held_by(killed, "limited"), held_by(killed, "rated")
    concurrency, rate, burst = 3, 10.0, 2
    with ClusterClient(seeds) as dw:
        dw.topic_set(limited, {"concurrency": concurrency})
        dw.topic_set(rated, {"rate": rate, "burst": burst})
        learned(pair, limited)
        learned(pair, rated, rate=rate / 2)
        limited_ids, rated_ids = spread_ids(pair, limited, 24), spread_ids(pair, rated, 40)
        moved = {task_id for task_id in limited_ids + rated_ids if owner_of(pair, task_id) == 0}
        # A short TTR: a reservation whose answer the kill cut off comes back soon.
        for topic, ids in ((limited, limited_ids), (rated, rated_ids)):
            for task_id in ids:
                dw.add(topic, task_id, id=task_id, ttr=10)
    connect = [lambda: ClusterClient(seeds)]
    at_limit = Workers(connect * 5, limited, len(limited_ids), hold_s=0.25, kill_expected=True)
    at_rate = Workers(connect * 3, rated, len(rated_ids), kill_expected=True)
    wait_until(lambda: at_limit.handed() >= 4 and at_rate.handed() >= 4, 10, "both under way")
    killed.kill()
    taken_over(survivor)
    taken_s = time.monotonic()
    # The survivor's share grows to the whole at its first round after it serves them.
    wait_until(
        lambda: (
            (shares(survivor, limited) or {}).get("concurrency") == concurrency
            and (shares(survivor, rated) or {}).get("rate") == rate
        ),
        TAKEOVER_TIMEOUT_S,
        "the survivor's shares to grow",
    )
    at_limit.join(60)
    at_rate.join(60)
    assert sorted(set(at_limit.ids)) == sorted(limited_ids)
    assert sorted(set(at_rate.ids)) == sorted(rated_ids)
    # The dead node's tasks went out after the takeover, from the survivor.
    handed = zip(at_limit.ids + at_rate.ids, at_limit.handed_s + at_rate.handed_s, strict=True)
    assert any(task_id in moved and at_s > taken_s for task_id, at_s in handed)
    # Never more than the limit held at once (the moved partitions' reserved
    # tasks count against the survivor's share)...
    assert at_limit.most_held <= concurrency, at_limit.report()
    # ... and no more than rate * t + burst in any window of t, one burst more
    # for the survivor's bucket in the window of the move (docs/ha.md), and
    # the jitter: one per node, and what 50 ms of a stall bunches together.
    jitter = len(pair) + rate * 0.05
    for window_s in (0.5, 1.0, 2.0):
        most = most_in_any_window(at_rate.handed_s, window_s)
        assert most <= rate * window_s + 2 * burst + jitter, (window_s, most)


# Both nodes start again and take their partitions once the dead ones' leases
# lapse (2 L), then learn each other's settings: over 7 s from the topic_set, seen here.
RESTART_PAUSE_S = 15.0


@pytest.mark.slow
def test_a_pause_and_a_timed_pause_outlast_a_kill_9_of_both_nodes(
    pair: list[ServerProcess],
) -> None:
    held, timed = unique("held"), unique("timed")
    seeds = [address(proc) for proc in pair]
    pause_end_s, held_ids, timed_ids = two_pauses(pair, held, timed, RESTART_PAUSE_S)
    for proc in pair:
        proc.kill()
    for proc in pair:
        proc.start()  # on its port: the same address
    wait_until(lambda: settled(pair), TAKEOVER_TIMEOUT_S + SETTLE_TIMEOUT_S, "both nodes back")
    # Each node loads the records it serves and learns the others' again.
    learned(pair, held, paused_until=FOR_EVER_S)
    learned(pair, timed, paused_until=pause_end_s)
    assert time.time() < pause_end_s - 1, "the restart outlasted the timed pause"
    for proc in pair:
        with Client(*proc.address) as direct:
            assert direct.reserve([held, timed], 0) is None
    with ClusterClient(seeds) as dw:
        states = {dw.get(task_id)["state"] for task_id in held_ids + timed_ids}  # type: ignore[index]
        assert states == {"ready"}
        first = dw.reserve(timed, 30)
        ended_s = time.time()
        assert first is not None and first["attempts"] == 1
        assert pause_end_s - 0.05 <= ended_s < pause_end_s + 2, ended_s - pause_end_s
        # Both nodes end it: the rest come out of both at once.
        rest = [task["id"] for _ in timed_ids[1:] if (task := dw.reserve(timed, 1)) is not None]
        assert sorted([first["id"], *rest]) == sorted(timed_ids)
        assert dw.reserve(held, 0) is None
        dw.topic_set(held, {"paused_until": None})
        wait_until(lambda: all(shares(proc, held) is None for proc in pair), 10, "the resume")
        got = [task["id"] for _ in held_ids if (task := dw.reserve(held, 1)) is not None]
        assert sorted(got) == sorted(held_ids)
