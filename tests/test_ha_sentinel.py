"""Nodes on Redis Sentinel through failovers (issue 16, item 7 and scenarios 3 and 4).

Real processes: a primary, two replicas and three Sentinels (tests/redisfarm.py),
two ``delaywheel serve`` nodes with ``--replicas 1`` and L = 3 s on
``redis+sentinel://``, the HTTP sink and the request log of tests/hacheck.py.

- After a failover each node reads its partitions' epochs again on the new
  primary and logs one line, ``store failed over to HOST:PORT: epochs
  re-read, N partitions kept, M dropped``; what it decides is tested on its
  own against real servers (a partition is kept only when both its epoch and
  its lease are this node's).
- A node claims partitions only on a primary the Sentinels vouch for: one
  frozen through a failover and woken is not, while every Sentinel still
  flags it down or the failover's leader names the promoted replica.
- Scenario 3: kill -9 the Redis primary under load. Scenario 4: SIGSTOP it
  past Sentinel's down-after, then SIGCONT. The checker's figures are printed;
  each must end with 0 lost, resurrected, early and pending (every
  acknowledged task delivered within ``SETTLE_S`` of the load's end).
  ``DW_HA_DUMP=DIR`` keeps each run's logs and what the servers hold of the
  ids found wrong, to trace a failure (``_dump``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from clusternodes import metrics_of as _metrics
from conftest import RedisServer, primary_with_replica
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import DelaywheelError
from hacheck import (
    Delivery,
    Fault,
    LoadGenerator,
    Report,
    Request,
    RequestLog,
    Sink,
    check,
    sink,
)
from serverproc import ServerProcess, free_port
from waiting import wait_until

from delaywheel.ha.failover import stale_partitions
from delaywheel.store.redis.layout import Layout
from delaywheel.store.redis.sentinel import SentinelTopology

if TYPE_CHECKING:
    from redisfarm import SentinelFarm

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]
pytest_plugins = ("redisfarm",)

LEASE_S = 3.0  # L, as the tests
PARTITIONS = 16
FAILED_OVER = re.compile(
    r"store failed over to 127\.0\.0\.1:(\d+): epochs re-read,"
    r" (\d+) partitions kept, (\d+) dropped"
)
# Load before the fault, and after the new primary is named (time passing is the test).
BEFORE_S = 1.5
AFTER_S = 3.0
# Every acknowledged task is delivered within this of the load's end: an
# attempt in flight at the fault waits out its target timeout (10 s) first,
# after a takeover of up to 2 L, and a second failover (the Sentinels giving
# up on the replica they promoted first) adds about as much again.
SETTLE_S = 40.0
# The room a loaded machine needs beyond the bound, down-after + 2 L, for
# writes to resume after a failover.
RESUME_MARGIN_S = 3.0


# -- what the node decides after a failover -------------------------------------------


def test_after_a_failover_a_partition_is_kept_only_when_epoch_and_lease_are_ours(
    tmp_path: Path,
) -> None:
    layout = Layout("delaywheel", PARTITIONS)
    store = SentinelTopology(  # no I/O until used
        "redis+sentinel://127.0.0.1:1/dwmaster/0", shown="", connect_timeout_s=5, timeout_s=5
    )

    def token(epoch: int) -> str:
        return f"{epoch} node-a 127.0.0.1:7000"

    held = {0: 5, 1: 5, 2: 5, 3: 5, 4: 5}
    with primary_with_replica(tmp_path) as (primary, replica):
        with primary.client() as client:
            for p in held:
                client.set(layout.partition(p).epoch, 5)
                client.set(layout.partition(p).lease, token(5))
            client.set(layout.partition(1).epoch, 4)  # the acquire's INCR was lost
            client.delete(layout.partition(2).lease)  # expired during the failover
            client.set(layout.partition(3).lease, "5 node-b 127.0.0.1:7001")  # another's now
            client.delete(layout.partition(4).epoch)  # nothing replicated at all
            client.wait(1, 5000)

        def stale(server: RedisServer) -> set[int]:
            address = ("127.0.0.1", server.port)
            return asyncio.run(stale_partitions(store, address, layout, held, token))

        assert stale(primary) == {1, 2, 3, 4}
        # A server that is a replica by now (another failover meanwhile): all dropped.
        assert stale(replica) == set(held)


# -- the nodes through failovers --------------------------------------------------------


def _sentinel_url(farm: SentinelFarm) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in farm.sentinel_addresses)
    return f"redis+sentinel://{hosts}/dwmaster/0"


@pytest.fixture
def sentinel_nodes(redis_sentinels: SentinelFarm) -> Iterator[list[ServerProcess]]:
    """Two nodes with --replicas 1 on the farm, every partition served."""
    url = _sentinel_url(redis_sentinels)
    nodes: list[ServerProcess] = []
    try:
        for name in ("node-a", "node-b"):
            nodes.append(
                ServerProcess(
                    *("--port", str(free_port()), "--node", name, "--lease", str(LEASE_S)),
                    *("--replicas", "1", "--http-allow", "127.0.0.1", "--metrics-port", "0"),
                    store=url,
                )
            )
        wait_until(lambda: _settled(nodes), 30, "every partition served once")
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _served(node: ServerProcess) -> list[int]:
    with Client(*node.address) as dw:
        return [entry["partition"] for entry in dw.stats()["partitions"]]


def _settled(nodes: list[ServerProcess]) -> bool:
    served = [p for node in nodes for p in _served(node)]
    return sorted(served) == list(range(PARTITIONS))


def _under_load(
    farm: SentinelFarm,
    nodes: list[ServerProcess],
    fault: Callable[[], list[float | Fault]],
    requests: RequestLog | None = None,
    deliveries: list[Delivery] | None = None,
) -> Report:
    """Load through a ClusterClient, ``fault()`` (the times it injected), more load
    once the Sentinels name a new primary; then every task settled (delivered,
    or still held after ``SETTLE_S``: pending), and the check. ``requests`` and
    ``deliveries``, when given, get the run's request log and what the sink had."""
    old = farm.current_primary()
    seeds = [f"{node.host}:{node.port}" for node in nodes]
    requests = RequestLog() if requests is None else requests
    with sink() as received, ClusterClient(seeds, failover_timeout_s=20) as dw:
        load = LoadGenerator(dw, received, requests, rate=40, delay_s=(0.2, 1.5)).start()
        time.sleep(BEFORE_S)
        faults = fault()
        wait_until(lambda: _named_primary(farm) not in (None, old.port), 30, "a new primary")
        time.sleep(AFTER_S)
        load.stop()

        def unsettled() -> list[str]:
            report = check(requests.snapshot(), received.received())
            return [task_id for task_id in report.lost if _held(dw, task_id)]

        deadline_s = time.monotonic() + SETTLE_S
        while (pending := unsettled()) and time.monotonic() < deadline_s:
            time.sleep(0.2)
        report = check(requests.snapshot(), received.received(), pending, faults=faults)
        for task_id in pending:  # what each still is, for the failure's output
            print(f"pending {task_id}: {_shown_task(dw, task_id)}")
        _dump(farm, nodes, requests, received, faults, report, pending)
        if deliveries is not None:
            deliveries.extend(received.received())
    print(f"\n{report.summary()}")
    return report


def _dump(
    farm: SentinelFarm,
    nodes: list[ServerProcess],
    requests: RequestLog,
    received: Sink,
    faults: list[float | Fault],
    report: Report,
    pending: list[str],
) -> None:
    """With ``DW_HA_DUMP=DIR``, everything a failed run needs to be traced, in a
    directory of its own under DIR: the request log and the deliveries (JSON
    lines), the faults and the report, the nodes', servers' and Sentinels'
    logs, and what each server holds of every id lost, pending or duplicated
    without explanation (its record, and its partition's epoch and lease)."""
    where = os.environ.get("DW_HA_DUMP")
    if not where:
        return
    out = Path(where) / time.strftime("%H%M%S")
    out.mkdir(parents=True)
    with open(out / "requests.jsonl", "w") as file:
        for request in requests.snapshot():
            file.write(json.dumps(dataclasses.asdict(request), default=str) + "\n")
    with open(out / "deliveries.jsonl", "w") as file:
        for delivery in received.received():
            file.write(json.dumps(dataclasses.asdict(delivery)) + "\n")
    (out / "report.txt").write_text(f"{faults!r}\n{report.summary()}\n{report!r}\n")
    for node in nodes:
        name = node.args[node.args.index("--node") + 1]
        (out / f"{name}.log").write_text(node.log_text())
    for path in farm.directory.rglob("*.log"):
        shutil.copy(path, out / f"{path.parent.name}-{path.name}")
    layout = Layout("delaywheel", PARTITIONS)
    lines = [f"primary {farm.primary.port}, replicas {[r.port for r in farm.replicas]}"]
    for task_id in [*report.lost, *report.unexplained, *pending]:
        keys = layout.of(task_id)
        for server in farm.servers:
            try:
                with server.client() as client:
                    role = client.execute_command("ROLE")[0]
                    held = [client.hget(keys.tasks, task_id), client.get(keys.epoch)]
                    shown = f"{role!r}: {held!r}, lease {client.get(keys.lease)!r}"
            except Exception as exc:  # killed, or frozen
                shown = repr(exc)
            lines.append(f"{task_id} on :{server.port} {shown}")
    (out / "held.txt").write_text("\n".join(lines) + "\n")


def _shown_task(dw: ClusterClient, task_id: str) -> str:
    try:
        task = dw.get(task_id)
    except Exception as exc:
        return f"get raised {exc!r}"
    if task is None:
        return "gone"
    fields = ("state", "attempts", "at", "cycle", "slot")
    return ", ".join(f"{name} {task[name]!r}" for name in fields)


def _named_primary(farm: SentinelFarm) -> int | None:
    address = farm.sentinels[0].master_address()
    return None if address is None else address[1]


def _any_names_another(farm: SentinelFarm, port: int) -> bool:
    return any(
        (address := sentinel.master_address()) is not None and address[1] != port
        for sentinel in farm.sentinels
    )


def _held(dw: ClusterClient, task_id: str) -> bool:
    try:
        return dw.get(task_id) is not None
    except Exception:  # its partition is between owners: still held
        return True


def _failover_lines(nodes: list[ServerProcess]) -> list[list[tuple[int, int, int]]]:
    return [
        [tuple(map(int, m.groups())) for m in FAILED_OVER.finditer(node.log_text())]  # type: ignore[misc]
        for node in nodes
    ]


def _assert_scenario(report: Report, nodes: list[ServerProcess], farm: SentinelFarm) -> None:
    assert report.ok, report.summary()
    # Every acknowledged task delivered in the end, none still held after SETTLE_S.
    assert report.pending == 0, report.summary()
    assert not report.unexplained, report.summary()  # duplicates only of attempts in flight
    # The primary went away under the leases: some renewals failed, and were counted.
    assert sum(_metrics(n)["delaywheel_lease_renewals_failed_total"] for n in nodes) > 0
    # The load ran through the fault (one add at a time: it stalls while
    # the store is away, so how many depends on how long that was).
    assert report.acknowledged >= 20, report.summary()
    new_port = farm.current_primary().port
    replicas = {server.port for server in farm.replicas}
    for node, lines in zip(nodes, _failover_lines(nodes), strict=True):
        print(f"{node.args[node.args.index('--node') + 1]}: {_shown(lines)}")
        # One line per failover (the Sentinels may have promoted a replica, given
        # up on it and promoted the other), the last naming the new primary.
        ports = [port for port, _kept, _dropped in lines]
        assert ports and ports[-1] == new_port and set(ports) <= replicas, node.log_text()
        assert all(kept + dropped <= PARTITIONS for _port, kept, dropped in lines)


def _shown(lines: list[tuple[int, int, int]]) -> str:
    return "; ".join(f"failed over to :{p}, {k} kept, {d} dropped" for p, k, d in lines)


def test_a_node_serves_nothing_on_a_primary_the_sentinels_replaced_while_it_was_frozen(
    redis_sentinels: SentinelFarm,
) -> None:
    """A node's partitions self-fence while the primary is frozen; its next
    round, blocked on that primary, goes on once the primary wakes, when the
    Sentinels have replaced it but not yet demoted it. Every Sentinel still
    flags it down then, or names it while failing it over: no answer vouches
    for it, so the round claims nothing there (it did: it took every partition
    back on the woken primary, whose writes WAIT confirmed through the replica
    not yet re-pointed, and served them until its next look, 0.5 s later; the
    failover discarded all of it: 147 adds acknowledged 50 ms after the
    SIGCONT were gone in one run of three). Every partition is served again,
    on the new primary, after the failover line, and every add acknowledged
    from the SIGCONT on is there."""
    farm = redis_sentinels
    old = farm.primary
    assert old.proc is not None
    node = ServerProcess(
        *("--port", str(free_port()), "--node", "node-a", "--lease", str(LEASE_S)),
        *("--replicas", "1"),
        store=_sentinel_url(farm),
    )
    acknowledged: list[str] = []
    stop = threading.Event()

    def add_one_at_a_time() -> None:  # far in the future: none is delivered
        with Client(*node.address, timeout_s=2) as dw:
            for n in itertools.count():
                if stop.is_set():
                    return
                try:
                    acknowledged.append(dw.add("t", id=f"woken-{n}", delay=3600)["id"])
                except DelaywheelError:  # unavailable, moved, tryagain: not acknowledged
                    time.sleep(0.005)

    adding = threading.Thread(target=add_one_at_a_time)
    try:
        wait_until(lambda: _settled([node]), 30, "every partition served")
        # The node may learn of the failover from the Sentinels before the
        # primary wakes, or after it: the lines are read from the freeze on.
        frozen_at = node.logged
        old.proc.send_signal(signal.SIGSTOP)
        try:
            # The node's partitions self-fence (0.8 L without a renewal) before the
            # failover's leader names the promoted replica; woken at once, the
            # primary meets Sentinels that all still flag it down (the others
            # follow the leader within a second or two).
            wait_until(lambda: "fenced partition" in node.log_text(), 10, "self-fencing")
            wait_until(lambda: _any_names_another(farm, old.port), 30, "a Sentinel to fail over")
        finally:
            old.proc.send_signal(signal.SIGCONT)
            adding.start()
        wait_until(lambda: FAILED_OVER.search(node.log_text()) is not None, 30, "the failover line")
        wait_until(lambda: _settled([node]), 30, "every partition served again")
        time.sleep(1.0)  # adds acknowledged on the new primary too (time is the test)
        stop.set()
        adding.join()
        assert acknowledged
        with Client(*node.address, timeout_s=5) as dw:
            lost = [task_id for task_id in acknowledged if dw.get(task_id) is None]
        assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged adds lost: {lost[:5]}"
        # Nothing served from the freeze to the failover line; every partition after it.
        after = node.log_since(frozen_at)
        failed_over = next(i for i, line in enumerate(after) if FAILED_OVER.search(line))
        served_before = [line for line in after[:failed_over] if "serving partition" in line]
        assert not served_before, "\n".join(after)
        assert sum("serving partition" in line for line in after[failed_over:]) == PARTITIONS
    finally:
        stop.set()
        if adding.is_alive():
            adding.join()
        node.stop()


def test_scenario_3_kill_9_of_the_redis_primary_under_load(
    redis_sentinels: SentinelFarm, sentinel_nodes: list[ServerProcess]
) -> None:
    """The documented layout (a primary, two replicas, three Sentinels, quorum 2)
    with the primary killed: writes resume within down-after + 2 L (plus a
    margin for the loaded machine), nothing lost or early, no duplicate the
    docs do not explain, and every delivery carries an epoch of 1 or more."""
    farm = redis_sentinels
    killed_at: list[float] = []

    def kill_primary() -> list[float | Fault]:
        at_s = time.time()
        farm.primary.kill()
        killed_at.append(at_s)
        return [at_s]

    requests, deliveries = RequestLog(), []
    report = _under_load(farm, sentinel_nodes, kill_primary, requests, deliveries)
    _assert_scenario(report, sentinel_nodes, farm)
    resumed_s = writes_resumed_s(requests.snapshot(), killed_at[0])
    print(f"writes resumed {resumed_s:.2f} s after the kill")
    assert resumed_s <= down_after_s() + 2 * LEASE_S + RESUME_MARGIN_S, resumed_s
    assert_epochs_of_deliveries(deliveries)


def down_after_s() -> float:
    """Sentinel's down-after in the farm (imported here: the module is a plugin,
    loaded by pytest before any test module may import it)."""
    from redisfarm import DOWN_AFTER_MS

    return DOWN_AFTER_MS / 1000


def writes_resumed_s(requests: list[Request], fault_s: float) -> float:
    """From ``fault_s`` to the first add sent after it that was acknowledged (its
    client retried it until then): how long no write was taken."""
    done = [
        r.done_s for r in requests if r.op == "add" and r.outcome == "ok" and r.sent_s >= fault_s
    ]
    assert done, "no add acknowledged after the fault"
    return min(done) - fault_s


def assert_epochs_of_deliveries(deliveries: list[Delivery]) -> None:
    """Every delivery carried its partition's epoch, 1 or more (never 0, never none)."""
    epochs = [d.epoch for d in deliveries]
    bad = [e for e in epochs if e is None or e < 1]
    assert epochs and not bad, f"{len(bad)} of {len(epochs)} deliveries with epoch {set(bad)}"


def test_scenario_4_sigstop_of_the_redis_primary_past_down_after(
    redis_sentinels: SentinelFarm, sentinel_nodes: list[ServerProcess]
) -> None:
    farm = redis_sentinels
    old = farm.primary
    assert old.proc is not None

    def freeze_primary() -> list[float | Fault]:
        at_s = time.time()
        old.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            wait_until(lambda: _named_primary(farm) != old.port, 30, "the Sentinels to fail over")
        finally:
            old.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        return [Fault(at_s, time.time())]  # a pause: attempts in flight until it ends

    report = _under_load(farm, sentinel_nodes, freeze_primary)
    _assert_scenario(report, sentinel_nodes, farm)
