"""The Sentinel layout with one replica under ``--replicas 1``, and the handback after
a failover (docs/ha.md, "How many replicas" and "Graceful handoff").

Real processes: a primary, ONE replica and three Sentinels (tests/redisfarm.py,
quorum 2, down-after 1 s), two ``delaywheel serve`` nodes with ``--replicas 1``
and L = 3 s on ``redis+sentinel://``.

- The layout's risk is said at start, one line per node: a failover of the
  primary would stop every write.
- Kill the primary: the Sentinels promote the replica, which has none of its
  own, so ``WAIT 1`` fails and every write is refused from the kill until a
  replica connects to the new primary (the old one, restarted: Sentinel makes
  it a replica). Each node says why, in the log, ``stats`` and ``/metrics``;
  nothing acknowledged is lost. The figures are printed.
- A node that took every partition while the other looked dead (frozen
  through the failover) hands the surplus back as soon as the other is seen
  again: not after ``--shutdown-grace``, even while writes are refused.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from clusternodes import metrics_of
from delaywheel_client import Client, ClusterClient
from delaywheel_client.errors import DelaywheelError
from hacheck import LoadGenerator, RequestLog, sink
from serverproc import ServerProcess, free_port
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.slow]
pytest_plugins = ("redisfarm",)

LEASE_S = 3.0
PARTITIONS = 16
# Set on the nodes so that a handback that waited it out would show: the
# handback after a failover waited the whole of it (11.5 s with 10 s) before.
SHUTDOWN_GRACE_S = 10.0
# A handback after a failover: the next round (0.5 s), the sends in flight (to a
# sink that answers at once), one write of the partitions' lanes (WAIT's 1 s when
# it fails), the releases; and room for a loaded machine.
HANDBACK_BOUND_S = 4.0
# How long the test keeps the old primary down: writes must stay refused meanwhile.
HELD_DOWN_S = 4.0
RISK_LINE = "a failover of it would stop every write"
REFUSED_LINE = "writes refused for lack of replicas"
_LOGGED_AT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@pytest.fixture
def one_replica_farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from redisfarm import SentinelFarm, running

    with running(SentinelFarm(tmp_path_factory.mktemp("sentinel1"), replicas=1)) as farm:
        yield farm


def _sentinel_url(farm: object) -> str:
    hosts = ",".join(f"{host}:{port}" for host, port in farm.sentinel_addresses)  # type: ignore[attr-defined]
    return f"redis+sentinel://{hosts}/dwmaster/0"


@contextlib.contextmanager
def _nodes(farm: object) -> Iterator[list[ServerProcess]]:
    nodes: list[ServerProcess] = []
    try:
        for name in ("node-a", "node-b"):
            nodes.append(
                ServerProcess(
                    *("--port", str(free_port()), "--node", name, "--lease", str(LEASE_S)),
                    *("--replicas", "1", "--http-allow", "127.0.0.1", "--metrics-port", "0"),
                    *("--shutdown-grace", str(SHUTDOWN_GRACE_S)),
                    store=_sentinel_url(farm),
                )
            )
        wait_until(lambda: sorted(p for n in nodes for p in _served(n)) == list(range(PARTITIONS)),
                   30, "every partition served once")  # fmt: skip
        yield nodes
    finally:
        for node in nodes:
            node.kill()


def _served(node: ServerProcess) -> list[int]:
    with Client(*node.address) as dw:
        return [entry["partition"] for entry in dw.stats()["partitions"]]


def _stats(node: ServerProcess) -> dict[str, object]:
    with Client(*node.address) as dw:
        return dw.stats()


def _named_primary(farm: object) -> int | None:
    address = farm.sentinels[0].master_address()  # type: ignore[attr-defined]
    return None if address is None else address[1]


def _logged_s(line: str) -> float:
    found = _LOGGED_AT.match(line)
    assert found, line
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Adder:
    """Adds one task after another (far in the future: none fires) until stopped;
    notes when each acknowledged one was sent and answered."""

    def __init__(self, nodes: list[ServerProcess]) -> None:
        self.seeds = [f"{n.host}:{n.port}" for n in nodes]
        self.acknowledged: list[tuple[str, float, float]] = []  # id, sent, answered
        self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with ClusterClient(self.seeds, timeout_s=3, failover_timeout_s=2) as dw:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                sent_s = time.time()
                try:
                    task_id = dw.add("one-replica", n, id=f"r-{n}", delay=3600)["id"]
                    self.acknowledged.append((task_id, sent_s, time.time()))
                except DelaywheelError:  # unavailable (WAIT), tryagain: not acknowledged
                    self.refused += 1
                    time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def test_one_replica_refuses_writes_from_the_primarys_death_until_a_replica_is_back(
    one_replica_farm: object,
) -> None:
    farm = one_replica_farm
    with _nodes(farm) as nodes:
        for node in nodes:  # the risk, said once at start
            wait_until(lambda: RISK_LINE in node.log_text(), 10, "the risk line")  # noqa: B023
            assert node.log_text().count(RISK_LINE) == 1, node.log_text()
            assert _stats(node)["replicas"]["connected"] != {}  # type: ignore[index]
        adder = Adder(nodes)
        try:
            wait_until(lambda: len(adder.acknowledged) >= 20, 20, "adds before the kill")
            old = farm.primary  # type: ignore[attr-defined]
            old_port = old.port
            killed_s = time.time()
            old.kill()
            wait_until(lambda: _named_primary(farm) not in (None, old_port), 30, "a new primary")
            new = f"127.0.0.1:{_named_primary(farm)}"
            for node in nodes:
                wait_until(lambda: REFUSED_LINE in node.log_text(), 20, "the refusal line")  # noqa: B023
                wait_until(
                    lambda: _stats(node)["replicas"]["connected"] == {new: 0},  # type: ignore[index]  # noqa: B023
                    10,
                    "stats showing the new primary without a replica",
                )
                assert f"Redis primary {new} has 0 replica(s) connected, fewer than" in (
                    node.log_text()
                )
            refusing = [_stats(node)["replicas"] for node in nodes]
            metrics = [metrics_of(node) for node in nodes]
            time.sleep(
                HELD_DOWN_S
            )  # writes stay refused while no replica is back (time is the test)
            restarted_s = time.time()
            old.start()  # Sentinel makes it a replica of the promoted one
            wait_until(
                lambda: any(sent > restarted_s for _, sent, _ in adder.acknowledged),
                30,
                "writes acknowledged again",
            )
            confirmed_s = min(done for _, sent, done in adder.acknowledged if sent > restarted_s)
            wait_until(
                lambda: all("writes confirmed by replicas again" in n.log_text() for n in nodes),
                20,
                "the line that writes are confirmed again",
            )
            time.sleep(0.5)  # more adds on the healed layout (time passing is the test)
        finally:
            adder.stop()
        before = [done for _, _, done in adder.acknowledged if done < killed_s]
        during = [a for a in adder.acknowledged if killed_s <= a[2] < restarted_s]
        # Writes stopped at the kill and came back only once a replica was back
        # (an add in flight at the kill may be answered just after it).
        assert all(done - killed_s < 0.5 for _, _, done in during), during
        assert [r for r in refusing if r["refusing"] and r["writes_refused"] > 0] == refusing  # type: ignore[index]
        assert all(m["delaywheel_writes_refused_no_replicas_total"] > 0 for m in metrics)
        last_before = max(before)
        print(
            f"\none replica: no write acknowledged for {confirmed_s - last_before:.2f} s;"
            f" the old primary restarted {restarted_s - killed_s:.2f} s after the kill,"
            f" writes acknowledged again {confirmed_s - restarted_s:.2f} s after the restart;"
            f" {adder.refused} adds refused, {len(adder.acknowledged)} acknowledged"
        )
        for node in nodes:
            text = node.log_text()
            refused = [line for line in text.splitlines() if REFUSED_LINE in line]
            # Rate-limited: one line when it began, then at most one per 10 s.
            assert 1 <= len(refused) <= 1 + (confirmed_s - killed_s) / 10 + 1, refused
            assert "store failed over to" in text
        with ClusterClient([f"{n.host}:{n.port}" for n in nodes]) as dw:
            lost = [task_id for task_id, _, _ in adder.acknowledged if dw.get(task_id) is None]
        assert lost == [], f"{len(lost)} acknowledged adds lost: {lost[:5]}"


def test_a_node_that_took_every_partition_at_a_failover_hands_back_at_once(
    one_replica_farm: object, tmp_path: Path
) -> None:
    """node-b is frozen while the primary is killed: node-a takes every partition on
    the new primary, where writes are refused (no replica). node-b woken, node-a
    hands it its share back within ``HANDBACK_BOUND_S``, not ``--shutdown-grace``."""
    farm = one_replica_farm
    with _nodes(farm) as nodes, sink() as received:
        a, b = nodes
        seeds = [f"{n.host}:{n.port}" for n in nodes]
        with ClusterClient(seeds, timeout_s=2, failover_timeout_s=5) as dw:
            load = LoadGenerator(dw, received, RequestLog(), rate=40, delay_s=(0.2, 1.5),
                                 target_timeout_s=1.0).start()  # fmt: skip
            try:
                wait_until(lambda: len(received.received()) >= 20, 20, "deliveries under way")
                assert b.proc is not None
                b.proc.send_signal(signal.SIGSTOP)
                try:
                    old = farm.primary  # type: ignore[attr-defined]
                    old.kill()
                    wait_until(lambda: _named_primary(farm) not in (None, old.port), 30,
                               "a new primary")  # fmt: skip
                    wait_until(lambda: len(_served(a)) == PARTITIONS, 30, "node-a serving all")
                    marks = a.logged
                finally:
                    b.proc.send_signal(signal.SIGCONT)
                woken_s = time.time()
                wait_until(lambda: len(_served(a)) < PARTITIONS, 30, "node-a handing back")
                wait_until(
                    lambda: (
                        sum("handed back partition" in line for line in a.log_since(marks))
                        >= PARTITIONS // 2
                    ),
                    SHUTDOWN_GRACE_S + 10,
                    "node-a's handback",
                )
            finally:
                load.stop()
        handed = [line for line in a.log_since(marks) if "handed back partition" in line]
        took_s = max(map(_logged_s, handed)) - woken_s
        print(
            f"\nhandback after the failover: {len(handed)} partitions, {took_s:.2f} s after SIGCONT"
        )
        assert took_s < HANDBACK_BOUND_S < SHUTDOWN_GRACE_S, "\n".join(a.log_since(marks))
