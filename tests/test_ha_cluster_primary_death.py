"""A dead Redis Cluster primary stalls only its own partitions (issue 29, item 5).

Three primaries with a replica each (cluster-node-timeout 2 s), two nodes
with ``--replicas 1``. Load generators add to every partition through
``ClusterClient``s while a probe adds one task every 10 ms to partitions
whose primary stays alive, each add to its partition's owner over a plain
``Client`` (so that it sees every answer as sent, ``moved`` included). One
primary (not the keyspace's own slot's) is killed; once a replica has taken
over, it is restarted as that replica's replica, as an operator would.

In the 15 s after the kill the probe's adds must be acknowledged at its
usual rate: over 90 % of those sent, their p99 latency within 2x of the
5 s before the kill; no answer may be about another partition than the
add's own; and after the promotion every acknowledged add is delivered
(0 lost), none early, none twice.

Before the journal kept a lane per partition (one flush in flight, waiting
for every primary), the probe had 73 of 89 acknowledged in those 15 s,
p99 5.1 s (it was 8 ms before the kill). Before each node registered
itself in a loop of its own and read the leases a pipeline per primary,
it failed in most runs on a busy machine: the coordinator's round waited
about 4-5 s on redis-py's retries of the pipeline that met the dead
primary, the node's registration (then made by the round) lapsed, the
other node saw it gone and took its live partitions over, and the probe
had 424-594 of 1,500 acknowledged. The figures of each run are printed
(``pytest -s``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import DelaywheelError
from hacheck import Fault, LoadGenerator, RequestLog, check, sink
from serverproc import ServerProcess
from test_ha_cluster import PARTITIONS, _node, _seeds, _settled, owner_port
from waiting import wait_until

from delaywheel.store.redis.layout import Layout, partition_of

if TYPE_CHECKING:
    from redisfarm import ClusterFarm

pytest_plugins = ("redisfarm",)
pytestmark = [pytest.mark.redis, pytest.mark.process, pytest.mark.slow, pytest.mark.serial]

LEASE_S = 3.0
NODE_TIMEOUT_MS = 2000
PROBE_EVERY_S = 0.010
BEFORE_S = 5.0
AFTER_S = 15.0
LOADS = 3  # clients adding to every partition
LOAD_RATE = 30.0  # adds a second, each
DELAY_S = 1.0  # the probe's tasks' delay


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFarm]:
    from redisfarm import ClusterFarm, running

    directory = tmp_path_factory.mktemp("primarydeath")
    # As docs/ha.md advises: with full coverage required (Redis's default) every
    # primary answers CLUSTERDOWN from the victim's FAIL to its replica's
    # promotion, and every partition waits (a lease not renewed for 0.8 L in
    # that window is lost, live partitions' too).
    farm = ClusterFarm(directory, node_timeout_ms=NODE_TIMEOUT_MS, full_coverage=False)
    with running(farm) as made:
        yield made


@dataclass
class Answer:
    partition: int
    sent_s: float
    latency_s: float
    ok: bool
    code: str = ""
    about: int | None = None  # the partition an error's data names


@dataclass
class Probe:
    """One add every PROBE_EVERY_S to ``partitions``, each to its owner."""

    nodes: list[ServerProcess]
    partitions: list[int]
    target: dict[str, Any]
    log: RequestLog = field(default_factory=RequestLog)
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        clients = {f"{n.host}:{n.port}": Client(*n.address, timeout_s=5.0) for n in self.nodes}
        owners = self._owners(clients)
        ids = _ids(self.partitions, 20_000)
        try:
            next_s = time.monotonic()
            for n in range(len(ids)):
                if self.stop.is_set():
                    return
                task_id = ids[n]
                p = partition_of(task_id, PARTITIONS)
                client = clients.get(owners.get(p, ""), next(iter(clients.values())))
                self._add(client, task_id, p)
                if self.answers[-1].code in ("moved", "tryagain"):
                    owners = self._owners(clients)
                # Every 10 ms, or at once after a slow answer: no burst to catch up.
                next_s = max(next_s + PROBE_EVERY_S, time.monotonic())
                time.sleep(max(0.0, next_s - time.monotonic()))
        finally:
            for client in clients.values():
                client.close()

    def _add(self, client: Client, task_id: str, p: int) -> None:
        sent_s = time.time()
        answer = Answer(p, sent_s, 0.0, True)
        error: dict[str, Any] = {}

        def call() -> Any:
            try:
                return client.add(
                    "probe", {"id": task_id}, id=task_id, delay=DELAY_S, target=self.target
                )
            except DelaywheelError as exc:
                error["exc"] = exc
                raise

        outcome = self.log._log("add", task_id, call, DELAY_S)
        answer.latency_s = time.time() - sent_s
        exc = error.get("exc")
        if outcome != "ok":
            answer.ok = False
            answer.code = getattr(exc, "code", "") or "timeout"
            data = getattr(exc, "data", None)
            if isinstance(data, dict) and "partition" in data:
                answer.about = data["partition"]
        self.answers.append(answer)

    def _owners(self, clients: dict[str, Client]) -> dict[int, str]:
        for client in clients.values():
            try:
                owners = client.call("cluster")["owners"]
            except Exception:
                continue
            return {o["partition"]: o["address"] for o in owners if o["address"]}
        return {}


def _ids(partitions: list[int], count: int) -> list[str]:
    wanted = set(partitions)
    found: list[str] = []
    n = 0
    while len(found) < count:
        task_id = f"probe-{n}"
        if partition_of(task_id, PARTITIONS) in wanted:
            found.append(task_id)
        n += 1
    return found


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")


def test_a_dead_primary_stalls_only_its_own_partitions(farm: ClusterFarm) -> None:
    prefix = "death"
    layout = Layout(prefix, PARTITIONS)
    options = ("--lease", str(LEASE_S), "--replicas", "1")
    nodes = [_node(farm.url, name, prefix, *options) for name in ("a", "b")]
    # The victim holds partitions, but not the keyspace's own slot (members, meta).
    meta_port = owner_port(farm, layout.meta)
    primary_of = {p: owner_port(farm, layout.partition(p).tasks) for p in range(PARTITIONS)}
    victim_port = next(port for port in sorted(set(primary_of.values())) if port != meta_port)
    victim = next(node for node in farm.nodes if node.port == victim_port)
    live = [p for p, port in primary_of.items() if port != victim_port]
    assert live and len(live) < PARTITIONS
    try:
        with sink() as received:
            wait_until(lambda: _settled(nodes), 20, "the two nodes to share the partitions")
            target = {"type": "http", "url": received.url, "timeout": 1.0}
            log = RequestLog()
            clients = [ClusterClient(_seeds(nodes), timeout_s=1.0) for _ in range(LOADS)]
            loads = [
                LoadGenerator(
                    client, received, log, rate=LOAD_RATE, name=f"load{i}", target_timeout_s=1.0
                ).start()
                for i, client in enumerate(clients)
            ]
            probe = Probe(nodes, live, target)
            thread = threading.Thread(target=probe.run, daemon=True)
            thread.start()
            try:
                time.sleep(BEFORE_S)
                fault_s = time.time()
                victim.kill()
                wait_until(
                    lambda: _promoted(farm, layout, primary_of, victim_port), 30, "a promotion"
                )
                promoted_s = time.time()
                time.sleep(max(0.0, fault_s + AFTER_S - time.time()))
            finally:
                probe.stop.set()
                thread.join()
                for load in loads:
                    load.stop()
                for client in clients:
                    client.close()
            # Back, as the promoted replica's replica (until then WAIT 1 fails there).
            victim.start()
            requests = probe.log.snapshot() + log.snapshot()
            acknowledged = {r.task_id for r in requests if r.op == "add" and r.outcome == "ok"}
            deleted = {r.task_id for r in requests if r.op == "delete" and r.outcome != "error"}
            wait_until(
                lambda: acknowledged - deleted <= {d.task_id for d in received.received()},
                30,
                "every acknowledged add delivered",
            )
            time.sleep(1.5)  # a late duplicate shows now or never
            outage = Fault(fault_s, promoted_s)
            report = check(requests, received.received(), faults=[outage])
            probed = [d for d in received.received() if d.task_id.startswith("probe-")]
            probe_report = check(probe.log.snapshot(), probed, faults=[outage])
    finally:
        for node in nodes:
            node.kill()
    before = [a for a in probe.answers if a.sent_s < fault_s]
    after = [a for a in probe.answers if fault_s <= a.sent_s < fault_s + AFTER_S]
    # Over every add sent, answered or not: a stalled add is what the client feels.
    p99_before = _p99([a.latency_s for a in before])
    p99_after = _p99([a.latency_s for a in after])
    acked_after = sum(a.ok for a in after)
    elsewhere = [a for a in probe.answers if a.about is not None and a.about != a.partition]
    codes = sorted({a.code for a in after if not a.ok})
    print(
        f"\nprimary death: promoted {promoted_s - fault_s:.1f} s after the kill; probe before:"
        f" {len(before)} sent, p99 {p99_before * 1000:.1f} ms; in the {AFTER_S:g} s after:"
        f" {len(after)} sent, {acked_after} acknowledged, p99 {p99_after * 1000:.1f} ms,"
        f" errors {codes}, {len(elsewhere)} answered about another partition;"
        f" all clients: {report.summary()}"
    )
    failed = [r for r in probe.log.snapshot() if r.outcome != "ok" and r.sent_s >= fault_s]
    for r in failed[:5]:  # what a failing run shows first
        print(f"  {r.task_id} at {r.sent_s - fault_s:+.2f} s: {r.outcome} {r.detail[:300]}")
    for task_id in probe_report.duplicates:  # what a failing run shows
        got = [round(d.at_s - fault_s, 2) for d in received.received() if d.task_id == task_id]
        print(f"  {task_id} p{partition_of(task_id, PARTITIONS)} delivered at {got} s")
    assert not elsewhere, elsewhere[:5]
    # It sends the next add after each answer: a stalled probe sends few (225
    # in those 15 s before the lanes). The machine's load moves its pace too.
    usual = len(before) / BEFORE_S * AFTER_S
    assert len(after) > 0.75 * usual, (usual, len(after))
    assert acked_after > 0.9 * len(after), (len(after), acked_after)
    # Within 2x of before. On the shared 2-core test machine the p99 moves
    # between 5 and 60 ms with the load of other work alone, so one under 25
    # ms counts as 25 ms; an add held by the dead primary waits 1 s or more.
    assert p99_after <= 2 * max(p99_before, 0.025), (p99_before, p99_after)
    assert report.ok, report.summary()
    assert not probe_report.duplicates, probe_report.summary()
    assert not report.unexplained, report.summary()


def _promoted(
    farm: ClusterFarm, layout: Layout, primary_of: dict[int, int], dead_port: int
) -> bool:
    dead = [p for p, port in primary_of.items() if port == dead_port]
    try:
        return owner_port(farm, layout.partition(dead[0]).tasks) != dead_port
    except Exception:
        return False
