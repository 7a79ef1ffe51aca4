"""Saved schedules' policies on a real server (docs/schedules.md): overlap
``skip``, ``buffer_one`` and ``allow`` with a ready-queue occurrence left
un-acked; catch-up after the server was down across N occurrences (``skip``
0 runs, ``latest`` 1, ``all`` min(N, 100)); a SIGSTOPped owner of two nodes on
one private redis-server; and clock jumps, through the engine's injected
clock (the server has no clock hook: ``Engine.advance`` takes the time).
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import DelaywheelError
from delaywheel_client.partitions import occurrence_id, partition_of
from schedulenodes import SCHEDULE, assert_each_once, nominal_seconds, schedule_node
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.engine.engine import Engine
from delaywheel.store.memory import MemoryStore


def _ids(dw: Client, topic: str) -> list[str]:
    return sorted(task["id"] for task in dw.list(topic=topic, limit=1000)["tasks"])


def _nominal_s(task_id: str) -> float:
    return float(task_id.rsplit(":", 1)[1])


@pytest.mark.process
@pytest.mark.slow
def test_overlap_skip_buffer_one_and_allow_with_an_occurrence_left_unacked() -> None:
    """Each schedule's first occurrence is reserved and never acked (skip's
    with a 1 s TTR that runs out: the same task is ready again, still in
    flight) while 3 s pass: skip counts the later ones skipped, buffer_one
    holds exactly one and puts it when the first is acked, allow runs each."""
    proc = ServerProcess()
    try:
        with Client(*proc.address) as dw:
            for policy, ttr in (("skip", 1), ("buffer_one", 60), ("allow", 60)):
                dw.schedule_add(
                    {"id": policy, "every": 1, "topic": policy, "ttr": ttr, "overlap": policy}
                )
            first = {}
            for policy in ("skip", "buffer_one", "allow"):
                task = dw.reserve(policy, timeout=5)
                assert task is not None
                first[policy] = task["id"]
            time.sleep(3.2)  # three more occurrences come due: the time passing is the test
            during = {policy: dw.schedule_get(policy) for policy in first}
            tasks = {policy: _ids(dw, policy) for policy in first}
            dw.ack(first["buffer_one"])
            wait_until(
                lambda: dw.schedule_get("buffer_one")["counts"]["fired"] == 2,  # type: ignore[index]
                10,
                "the held occurrence to be put once the first is acked",
            )
            acked_at = time.time()
            released = _ids(dw, "buffer_one")
            after = {policy: dw.schedule_pause(policy) for policy in first}
            allowed = _ids(dw, "allow")
    finally:
        proc.kill()

    skip = during["skip"]["counts"]
    assert skip["fired"] == 1 and skip["skipped"] >= 2 and skip["missed"] == 0
    assert tasks["skip"] == [first["skip"]]  # its TTR ran out: the same task, ready again

    held = during["buffer_one"]
    assert held["counts"]["fired"] == 1 and held["counts"]["skipped"] >= 1
    assert held["next"] is not None and held["next"] <= time.time()  # the one held, due
    assert tasks["buffer_one"] == [first["buffer_one"]]  # and not put while the first is out
    # Exactly one held occurrence put on the ack (the newest due then), none more.
    [put] = released
    assert _nominal_s(first["buffer_one"]) < _nominal_s(put) <= acked_at
    assert after["buffer_one"]["counts"]["fired"] in (2, 3)  # and maybe the next, on time

    allow = after["allow"]["counts"]
    assert allow["fired"] >= 4 and allow["skipped"] == 0 and allow["missed"] == 0
    nominals = sorted(int(_nominal_s(task_id)) for task_id in allowed)
    assert nominals == list(range(nominals[0], nominals[0] + allow["fired"]))  # each ran


@pytest.mark.process
@pytest.mark.slow
def test_downtime_over_n_occurrences_fires_0_1_or_min_n_100(tmp_path: Path) -> None:
    """Schedules that start at T0 and end by T0 + 3 s, on a server stopped
    before T0 and started after the end: every occurrence was due while it was
    down (N = 4 each second; N = 150 every 20 ms). The restart's catch-up
    fires 0 (skip), the newest (latest) or the newest min(N, 100) (all), and
    counts the rest missed."""
    proc = ServerProcess(store=f"sqlite:///{tmp_path / 'tasks.db'}", tick="0.01")
    t0_s = math.ceil(time.time()) + 2
    plans = {  # id: (every, catchup, N)
        "skip": (1, "skip", 4),
        "latest": (1, "latest", 4),
        "all": (1, "all", 4),
        "all150": (0.02, "all", 150),
    }
    try:
        with Client(*proc.address) as dw:
            for sid, (every, catchup, n) in plans.items():
                dw.schedule_add(
                    {"id": sid, "every": every, "catchup": catchup, "topic": sid, "ttr": 0,
                     "start_at": t0_s, "end_at": round(t0_s + (n - 1) * every, 3)}
                )  # fmt: skip
        proc.stop()
        assert time.time() < t0_s, "stopped too late: an occurrence may have fired while up"
        time.sleep(t0_s + 3.3 - time.time())  # down across every occurrence
        proc.start()
        with Client(*proc.address) as dw:

            def caught_up() -> dict[str, Any] | None:
                states = {sid: dw.schedule_get(sid) for sid in plans}
                done = all(state["next"] is None for state in states.values())  # type: ignore[index]
                return states if done else None

            states = wait_until(caught_up, 20, "the catch-up of every schedule")
            ids = {sid: _ids(dw, sid) for sid in plans}
    finally:
        proc.kill()

    for sid, (every, catchup, n) in plans.items():
        fired = {"skip": 0, "latest": 1, "all": min(n, 100)}[catchup]
        assert states[sid]["counts"] == {"fired": fired, "skipped": 0, "missed": n - fired}, sid
        nominals_ms = [t0_s * 1000 + round(k * every * 1000) for k in range(n)]
        newest = [occurrence_id(sid, ms) for ms in nominals_ms[n - fired :]]
        assert ids[sid] == sorted(newest), sid
        if fired:
            assert states[sid]["last_fired"] == nominals_ms[-1] / 1000


@pytest.mark.process
@pytest.mark.redis
@pytest.mark.slow
def test_a_sigstopped_owner_fires_no_occurrence_twice(redis_url: str) -> None:
    """Two nodes on one private redis-server (lease 1.5 s). The owner of a
    schedule's partition is SIGSTOPped for 3 s (past 0.8 L: the other takes
    it over and catches up), then SIGCONTed: its stale writes are fenced, and
    each occurrence is taken once, none missing."""
    nodes = [schedule_node(redis_url, "a"), schedule_node(redis_url, "b")]
    got: list[str] = []
    try:
        seeds = [f"{node.host}:{node.port}" for node in nodes]
        with ClusterClient(seeds) as dw:
            wait_until(
                lambda: {e["node"] for e in dw.cluster()["owners"]} == {"a", "b"},
                15,
                "the two nodes to share the partitions",
            )
            layout = dw.cluster()
            owner_of = {entry["partition"]: entry["node"] for entry in layout["owners"]}
            # One schedule on each node's partitions, so one is the stopped node's.
            names: dict[str, str] = {}
            for n in range(64):
                name = f"stop-{n}"
                owner = owner_of[partition_of(f"s:{name}:0", layout["partitions"])]
                names.setdefault(owner, name)
                if len(names) == 2:
                    break
            for name in names.values():
                dw.schedule_add({"id": name, **SCHEDULE})
        stopped = next(node for node in nodes if node.args[node.args.index("--node") + 1] == "a")
        stopped_partition = partition_of(f"s:{names['a']}:0", layout["partitions"])
        epoch_before = next(
            e["epoch"] for e in layout["owners"] if e["partition"] == stopped_partition
        )
        until_s = time.time() + 7.5
        takers = [
            threading.Thread(target=_take_tolerant, args=(node.address, until_s, got))
            for node in nodes
        ]
        for taker in takers:
            taker.start()
        time.sleep(1.5)  # a few occurrences on time first
        assert stopped.proc is not None
        stopped.proc.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # past 0.8 L (1.2 s) and the lease: the time passing is the test
        stopped.proc.send_signal(signal.SIGCONT)
        for taker in takers:
            taker.join()
        with ClusterClient(seeds) as dw:
            fired = {name: dw.schedule_pause(name)["counts"]["fired"] for name in names.values()}
            epochs = {entry["partition"]: entry["epoch"] for entry in dw.cluster()["owners"]}
        # The stopped node's partition changed hands while it was stopped.
        assert epochs[stopped_partition] > epoch_before

        def collected() -> bool:
            for node in nodes:
                _take_tolerant(node.address, time.time() + 0.3, got)
            return all(len(nominal_seconds(got, name)) >= fired[name] for name in fired)

        wait_until(collected, 15, "every fired occurrence to be taken")
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
            node.kill()
    for name in names.values():
        assert fired[name] >= 4
        assert_each_once(got, name, fired[name])


def _take_tolerant(address: tuple[str, int], until_s: float, got: list[str]) -> None:
    """Reserve occurrences until ``until_s`` (ttr 0); a refusal (moved, tryagain,
    unavailable while a partition changes hands) is retried."""
    with Client(*address, timeout_s=10) as dw:
        while time.time() < until_s:
            try:
                task = dw.reserve("occ", timeout=0.2)
            except DelaywheelError:
                time.sleep(0.05)
                continue
            if task is not None:
                got.append(task["id"])


# -- clock jumps, through the engine's injected clock ---------------------------------------

T0_S = 1_800_000_000.0  # a multiple of 10


async def _engine_at(t0_s: float) -> Engine:
    store = MemoryStore("memory://")
    await store.open()
    return Engine(store, now_s=t0_s, tick_s=0.01)


def _occurrences(engine: Engine, schedule_id: str) -> list[float]:
    prefix = f"s:{schedule_id}:"
    return sorted(
        _nominal_s(task["id"])
        for task in engine.list_tasks({"limit": 1000})["tasks"]
        if task["id"].startswith(prefix)
    )


def test_a_clock_stepped_back_never_fires_early_or_twice() -> None:
    async def main() -> None:
        engine = await _engine_at(T0_S)
        # overlap allow: the occurrences left ready do not hold the next ones.
        engine.schedule_add({"id": "b", "every": 10, "topic": "t", "overlap": "allow"}, T0_S)
        engine.advance(T0_S + 10.001)
        assert _occurrences(engine, "b") == [T0_S + 10]
        for back_s in (T0_S + 5, T0_S + 9.999, T0_S + 10.5, T0_S + 19.99):  # back, then creeping
            engine.advance(back_s)
            assert _occurrences(engine, "b") == [T0_S + 10], back_s
            assert engine.next_fire_s() == T0_S + 20  # armed at the pending one, no earlier
        engine.advance(T0_S + 20)
        engine.advance(T0_S + 15)  # back again, past a fire
        engine.advance(T0_S + 20.5)
        assert _occurrences(engine, "b") == [T0_S + 10, T0_S + 20]
        state = engine.schedule_get("b")
        assert state is not None
        assert state["counts"] == {"fired": 2, "skipped": 0, "missed": 0}

    asyncio.run(main())


@pytest.mark.parametrize(("catchup", "fired"), [("skip", 0), ("latest", 1), ("all", 100)])
def test_a_clock_stepped_forward_counts_as_downtime(catchup: str, fired: int) -> None:
    """+3 h at once over a schedule every 10 s: 1,080 occurrences due, as after
    3 h down. Then the clock goes on from there, on time."""

    async def main() -> None:
        engine = await _engine_at(T0_S)
        engine.schedule_add(
            {"id": "f", "every": 10, "topic": "t", "catchup": catchup, "overlap": "allow"}, T0_S
        )
        engine.advance(T0_S + 10)  # on time
        engine.advance(T0_S + 10 + 3 * 3600 + 0.5)
        due = 3 * 3600 // 10  # T0 + 20 .. T0 + 10810
        state = engine.schedule_get("f")
        assert state is not None
        assert state["counts"] == {"fired": 1 + fired, "skipped": 0, "missed": due - fired}
        newest = [T0_S + 10 + 10 * k for k in range(due - fired + 1, due + 1)]
        assert _occurrences(engine, "f") == [T0_S + 10, *newest]
        assert state["next"] == T0_S + 10 + 10 * (due + 1)
        engine.advance(state["next"])
        assert _occurrences(engine, "f")[-1] == state["next"]  # and on time again

    asyncio.run(main())


def test_an_edit_leaves_the_occurrence_in_flight_and_overlap_ends_when_it_is_gone() -> None:
    """Through the engine's injected clock. An update of the template leaves
    the occurrence already put as it was (the old topic and body); the next one
    is put with the new template. Under overlap skip the previous occurrence
    holds the next while it is ready or reserved, and no longer once it is
    deleted, acked or dead."""

    async def main() -> None:
        engine = await _engine_at(T0_S)
        engine.schedule_add(
            {"id": "e", "every": 10, "topic": "old", "body": "v1", "max_attempts": 1}, T0_S
        )
        engine.advance(T0_S + 10)
        first = occurrence_id("e", int((T0_S + 10) * 1000))
        engine.schedule_update("e", {"topic": "new", "body": "v2"}, 1, T0_S + 11)
        kept = engine.get(first)
        assert kept is not None and (kept["topic"], kept["body"]) == ("old", "v1")

        def held_then_freed(at_s: float, free: Callable[[str], Any], previous: str) -> str:
            """The occurrence at ``at_s`` is skipped while ``previous`` is in
            flight; ``free`` ends it, and the one 10 s later fires."""
            engine.advance(at_s)
            assert engine.get(occurrence_id("e", int(at_s * 1000))) is None
            free(previous)
            engine.advance(at_s + 10)
            put = occurrence_id("e", int((at_s + 10) * 1000))
            assert engine.get(put) is not None
            return put

        second = held_then_freed(T0_S + 20, engine.delete, first)  # ready, then deleted
        task = engine.get(second)
        assert task is not None and (task["topic"], task["body"]) == ("new", "v2")
        assert engine.try_reserve("new", T0_S + 31) is not None
        third = held_then_freed(T0_S + 40, engine.ack, second)  # reserved, then acked
        assert engine.try_reserve("new", T0_S + 51) is not None
        # Released on its last attempt (max_attempts 1): dead, so no longer in flight.
        held_then_freed(T0_S + 60, lambda tid: engine.release(tid, 0, T0_S + 61), third)
        dead = engine.get(third)
        assert dead is not None and dead["state"] == "dead"
        state = engine.schedule_get("e")
        assert state is not None
        assert state["counts"] == {"fired": 4, "skipped": 3, "missed": 0}

    asyncio.run(main())
