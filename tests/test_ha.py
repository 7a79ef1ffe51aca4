"""Several nodes on one Redis keyspace (issue 16): real servers, a private redis-server.

Each node serves the partitions it holds a lease for; a task is fired by the
node that owns its partition, so two nodes never both hand it out. The first
tests consume with plain clients on every node and count each id.

The scenarios (issue 16, "Tests": 1, 2, 5, 7, 8 and 9; 3 and 4 run on
Sentinel, 6 on Cluster, in their own modules) run at L = 3 s under a load
through a ``ClusterClient`` to an HTTP sink, and the checker (tests/hacheck.py) must
find 0 lost, 0 resurrected, 0 early; duplicates only for an attempt in
flight at a crash or pause, none at all for graceful handoffs; and after a
crash, every task first delivered late by at most 2 L. Each prints its
figures (``pytest -s``); docs/ha.md has a table of them.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from functools import partial

import pytest
import redis
from clusternodes import metrics_of as _metrics
from clusternodes import owned_once as _settled
from clusternodes import served as _served
from delaywheel_client import Client, ClusterClient, Moved, TryAgain
from hacheck import Fault, Report
from hascenario import explain, finish, loaded, seeds
from serverproc import ServerProcess, free_port
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.serial]

LEASE_S = 3.0
PARTITIONS = 16
# The bound: a crashed owner's tasks fire within 2 L.
TAKEOVER_BOUND_S = 2 * LEASE_S
# The scenarios' HTTP sink listens on 127.0.0.1, which a server refuses by default.
SINK_ALLOWED = ("--http-allow", "127.0.0.1")
# The bound for a graceful handoff: the next owner serves a handed-back
# partition within a second plus its load time.
HANDOFF_BOUND_S = 1.0
# What the log lines can show: their times to the millisecond (two of them per
# takeover), a load time to 10 ms (half of that, rounded, per line summed).
LOG_RESOLUTION_S = 0.002
LOAD_RESOLUTION_S = 0.005
_LOGGED = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO delaywheel\.cluster: "
HANDED_BACK = re.compile(_LOGGED + r"handed back partition (\d+)$")
SERVING = re.compile(
    _LOGGED + r"serving partition (\d+), epoch \d+: \d+ tasks loaded in ([\d.]+) s$"
)


def _node(redis_url: str, name: str, *args: str, lease_s: float = LEASE_S) -> ServerProcess:
    # ServerProcess passes --port 0 first; the later --port wins. A real port,
    # because a node's address is what the others send clients to.
    port = str(free_port())
    return ServerProcess(
        *("--port", port, "--node", name, "--lease", str(lease_s), *SINK_ALLOWED, *args),
        store=redis_url,
    )


def _node_name(proc: ServerProcess) -> str:
    with Client(*proc.address) as dw:
        return str(dw.stats()["node"])


def _drain(nodes: list[ServerProcess], want: int, timeout_s: float) -> list[str]:
    """Reserve and ack from every node until ``want`` tasks came (or the time is up)."""
    got: list[str] = []
    clients = [Client(*node.address) for node in nodes]
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < want and time.monotonic() < deadline:
            for dw in clients:
                try:
                    task = dw.reserve("t", timeout=0)
                except Exception:  # a node being stopped or killed
                    continue
                if task is not None:
                    got.append(task["id"])
                    dw.ack(task["id"])
            time.sleep(0.01)
    finally:
        for dw in clients:
            dw.close()
    return got


@pytest.fixture
def two_nodes(redis_url: str) -> Iterator[list[ServerProcess]]:
    nodes = [_node(redis_url, name, "--metrics-port", "0") for name in ("a", "b")]
    try:
        wait_until(lambda: _settled(*nodes), 10, "the two nodes to share the partitions")
        yield nodes
    finally:
        for node in nodes:
            node.kill()


def test_two_nodes_share_the_partitions_and_fire_each_task_once(
    two_nodes: list[ServerProcess],
) -> None:
    a, b = (_served(node) for node in two_nodes)
    assert a and b and not a & b  # both serve some, none twice
    with ClusterClient(seeds(two_nodes)) as dw:
        for n in range(200):
            dw.add("t", {"n": n}, id=f"task-{n}", delay=0.3)
        owners = dw.cluster()["owners"]
    assert {entry["node"] for entry in owners} == {"a", "b"}
    got = _drain(two_nodes, 200, 20)
    assert sorted(got) == sorted(f"task-{n}" for n in range(200))  # each once
    assert _drain(two_nodes, 1, 1.0) == []  # and nothing more


def test_a_request_for_another_nodes_partition_is_answered_moved(
    two_nodes: list[ServerProcess],
) -> None:
    first = two_nodes[0]
    with Client(*first.address) as dw:
        # Its map is what it read of the leases at its last look (every L/3 at most).
        wait_until(lambda: {e["node"] for e in dw.cluster()["owners"]} == {"a", "b"}, 5, "a's map")
        reply = dw.cluster()
        other = next(e for e in reply["owners"] if e["node"] == "b")
        task_id = next(f"x{n}" for n in range(10_000) if _partition(f"x{n}") == other["partition"])
        with pytest.raises(Moved) as caught:
            dw.add("t", None, id=task_id)
        stats = dw.stats()
    # The map's shape (docs/protocol.md), one entry per partition; stats' own share.
    assert (reply["node"], reply["partitions"], reply["lease_s"]) == ("a", PARTITIONS, LEASE_S)
    assert [e["partition"] for e in reply["owners"]] == list(range(PARTITIONS))
    assert all(set(e) == {"partition", "node", "address", "epoch"} for e in reply["owners"])
    mine = [
        {"partition": e["partition"], "epoch": e["epoch"]}
        for e in reply["owners"]
        if e["node"] == "a"
    ]
    assert stats["node"] == "a" and stats["partitions"] == mine
    assert caught.value.data == {
        "partition": other["partition"],
        "owner": other["address"],
        "epoch": other["epoch"],
    }


def _partition(task_id: str) -> int:
    import zlib

    return zlib.crc32(task_id.encode()) % PARTITIONS


# -- the scenarios ------------------------------------------------------------------


def _serving_all(node: ServerProcess) -> bool:
    try:
        return len(_served(node)) == PARTITIONS
    except Exception:  # the node is stopped for the moment
        return False


def _assert_clean(report: Report, *, graceful: bool) -> None:
    figures = explain(report)
    assert report.acknowledged >= 30 and report.delivered >= 25, figures  # the load ran
    assert report.ok and report.pending == 0, figures
    # Duplicates only those the checker explains: after a crash or pause, an
    # attempt in flight at it; and anywhere, the next attempt after one its
    # sender saw fail (the sink, in this loaded process, read it as or after
    # the target's timeout: at-least-once, as on one node; 2 runs of 45 of
    # scenario 7 on main, 5 and 3 such, each run's in one burst).
    assert not report.unexplained, figures
    if graceful:  # a handoff journals every outcome before it lets go: no other
        assert report.duplicates == report.retried, figures


def _assert_took_over(report: Report, serving_s: float) -> None:
    figures = f"{explain(report)}; the survivor served every partition {serving_s:.2f} s after"
    assert report.takeover_s is not None, figures  # tasks were due after the fault
    assert report.takeover_s <= TAKEOVER_BOUND_S, figures
    assert serving_s <= TAKEOVER_BOUND_S, figures


def test_scenario_1_kill_9_of_an_owner_under_load(two_nodes: list[ServerProcess]) -> None:
    killed, survivor = two_nodes
    with loaded(two_nodes) as run:
        time.sleep(1.5)  # the load runs on both nodes before the fault
        run.faults.append(time.time())
        started = time.monotonic()
        killed.kill()
        wait_until(lambda: _serving_all(survivor), 2 * TAKEOVER_BOUND_S, "the takeover")
        serving_s = time.monotonic() - started
        time.sleep(1.5)  # and on the survivor after it
        report = finish(run, [survivor], f"1 (kill -9; serving all after {serving_s:.2f} s)")
    _assert_clean(report, graceful=False)
    _assert_took_over(report, serving_s)


def _an_id_in(partitions: set[int], prefix: str) -> str:
    return next(f"{prefix}{n}" for n in range(10_000) if _partition(f"{prefix}{n}") in partitions)


def test_scenario_2_sigstop_of_an_owner_for_3_leases_is_fenced(
    two_nodes: list[ServerProcess],
) -> None:
    paused, other = two_nodes
    assert paused.proc is not None
    task_id = _an_id_in(_served(paused), "p")
    answers: list[BaseException | None] = []
    with loaded(two_nodes) as run, Client(*paused.address, timeout_s=30) as waiting_client:
        waiting_client.ping()  # its connection is open (accepted) before the pause
        time.sleep(1.5)  # the load runs on both nodes before the fault
        stopped_s = time.time()
        started = time.monotonic()
        paused.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: _serving_all(other), 2 * TAKEOVER_BOUND_S, "the takeover")
            serving_s = time.monotonic() - started
            # A request that waits in the stopped node's socket: on SIGCONT the node
            # reads it at once, and writes it with the epoch it held.
            waiting = threading.Thread(target=_add_answer, args=(waiting_client, task_id, answers))
            waiting.start()
            time.sleep(max(0.0, started + 3 * LEASE_S - time.monotonic()))  # paused for 3 L
        finally:
            paused.proc.send_signal(signal.SIGCONT)
        run.faults.append(Fault(stopped_s, time.time()))
        waiting.join(15)
        time.sleep(1.0)  # the load goes on with the paused node back
        report = finish(run, two_nodes, f"2 (SIGSTOP 3 L; serving all after {serving_s:.2f} s)")
    fenced = [line for line in paused.log if "a write was refused" in line]
    print(f"the add waiting at the paused node was answered {answers!r}; {len(fenced)} fenced")
    # Stopped past 0.8 L, it drops them before its next request (tryagain) or its
    # buffered requests' flushes are refused (moved); it never takes the add.
    assert len(answers) == 1 and isinstance(answers[0], (Moved, TryAgain)), answers
    partition = _partition(task_id)
    if isinstance(answers[0], TryAgain):  # the error's data, as docs/protocol.md gives it
        assert answers[0].data == {"partition": partition, "retry_after_ms": 250}
    else:  # the refusing script named the lease's holder: the other node
        assert answers[0].data["partition"] == partition, answers[0].data
        assert answers[0].data["owner"] == seeds([other])[0], answers[0].data
        assert isinstance(answers[0].data["epoch"], int), answers[0].data
    assert fenced, paused.log_text()
    # One line per event: the refusals at the SIGCONT come within a few ms of
    # each other (one line each was 3 to 5 lines), and so do the self-fences.
    self_fenced = [line for line in paused.log if "no lease renewal for 0.8 L" in line]
    assert len(fenced) <= 2 and len(self_fenced) <= 2, paused.log_text()
    fenced_flushes = _metrics(paused)["delaywheel_fenced_flushes_total"]
    print(f"{fenced_flushes:g} flushes fenced after SIGCONT, in {len(fenced)} line(s)")
    assert fenced_flushes >= 1
    assert task_id not in {d.task_id for d in run.sink.received()}
    _assert_clean(report, graceful=False)
    _assert_took_over(report, serving_s)


def _add_answer(dw: Client, task_id: str, answers: list[BaseException | None]) -> None:
    """One add for ``task_id`` through ``dw``: its error, or None when it was taken."""
    try:
        dw.add("t", None, id=task_id, delay=0.2)
    except Exception as exc:
        answers.append(exc)
    else:
        answers.append(None)


def test_scenario_5_every_lease_key_deleted_mid_run(
    redis_url: str, two_nodes: list[ServerProcess]
) -> None:
    store = redis.Redis.from_url(redis_url)
    overlaps: list[set[int]] = []
    try:
        with loaded(two_nodes) as run:
            time.sleep(1.5)  # the load runs on both nodes before the fault
            leases = list(store.scan_iter(match="*:lease"))
            assert len(leases) == PARTITIONS, leases
            deleted_s = time.time()
            store.delete(*leases)

            def settled_once() -> bool:
                served = [_served(node) for node in two_nodes]
                if served[0] & served[1]:
                    overlaps.append(served[0] & served[1])
                return _settled(*two_nodes)

            # Each owner's next renewal (within L/3) finds no lease and drops the
            # partition; the next round (every 0.5 s) acquires it with a new epoch.
            time.sleep(LEASE_S / 3)
            wait_until(settled_once, 2 * TAKEOVER_BOUND_S, "the partitions taken again")
            settled_s = time.time() - deleted_s
            # An attempt in flight when its owner dropped the partition goes again
            # after its timeout (the drop loses its outcome): at-least-once.
            run.faults.append(Fault(deleted_s, deleted_s + settled_s))
            time.sleep(1.5)  # the load goes on on the new leases
            report = finish(run, two_nodes, f"5 (DEL every lease; settled in {settled_s:.2f} s)")
    finally:
        store.close()
    assert not overlaps, overlaps  # no partition served by both at once
    # Every partition lost once: each owner's renewals (sent together) found no
    # lease, and each node said so in one line naming its partitions.
    losses = [
        (node, found)
        for node in two_nodes
        for line in node.log
        if (found := re.search(r"(?:lost|fenced) partitions \[([\d, ]+)\], epochs", line))
    ]
    named = [int(p) for _, found in losses for p in found.group(1).split(",")]
    assert sorted(named) == list(range(PARTITIONS)), losses
    assert len(losses) <= 2 * len(two_nodes), [found.group(0) for _, found in losses]
    # And counted once each (delaywheel_partitions_lost_total).
    assert sum(_metrics(node)["delaywheel_partitions_lost_total"] for node in two_nodes) == (
        PARTITIONS
    )
    _assert_clean(report, graceful=False)


def _serve_all(nodes: list[ServerProcess]) -> bool:
    return sum(len(_served(node)) for node in nodes) == PARTITIONS


def _logged_at(stamp: str) -> float:
    """A text log line's time (local, as logging writes it), as time.time() counts."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class Takeover:
    """One partition handed back by a stopping node and served by another."""

    def __init__(self, partition: int, released_s: float, served_s: float, load_s: float) -> None:
        self.partition = partition
        self.took_s = served_s - released_s  # from the release to serving it
        # The new owner's load time from that release to serving it: each
        # "serving" line it logged meanwhile (it takes partitions one at a time).
        self.load_s = load_s
        self.lines = 0

    def __repr__(self) -> str:
        return f"p{self.partition}: {self.took_s:.3f} s (load {self.load_s:.2f} s)"


def _takeovers(
    stopped: ServerProcess, staying: list[ServerProcess], since_s: float
) -> list[Takeover] | None:
    """Each partition ``stopped`` handed back since ``since_s`` (time.time()),
    and when a node of ``staying`` served it next, from their log lines; None
    while one of them is not in the logs yet (a log is read by a thread)."""
    released: dict[int, float] = {}
    for line in list(stopped.log):
        if (m := HANDED_BACK.match(line)) and _logged_at(m.group(1)) >= since_s - 0.001:
            released[int(m.group(2))] = _logged_at(m.group(1))
    found = []
    for partition, released_s in sorted(released.items()):
        for node in staying:
            served = [
                (_logged_at(m.group(1)), int(m.group(2)), float(m.group(3)))
                for line in list(node.log)
                # A little before the release line too: the release is logged
                # once Redis answered it, and the new owner may be that quick.
                if (m := SERVING.match(line)) and _logged_at(m.group(1)) >= released_s - 0.1
            ]
            ours = [(at_s, load_s) for at_s, p, load_s in served if p == partition]
            if not ours:
                continue
            at_s = min(ours)[0]
            meanwhile = [load_s for line_s, _, load_s in served if line_s <= at_s]
            takeover = Takeover(partition, released_s, at_s, sum(meanwhile))
            takeover.lines = len(meanwhile)
            found.append(takeover)
            break
        else:
            return None
    return found


def _restart_every(nodes: list[ServerProcess]) -> tuple[list[float], list[Takeover]]:
    """SIGTERM each node in turn and start it again; the seconds each stop and
    handoff took, and each partition's takeover."""
    handoffs_s = []
    takeovers = []
    for node in nodes:
        staying = [n for n in nodes if n is not node]
        started = time.monotonic()
        since_s = time.time()
        assert node.stop() == 0
        wait_until(lambda staying=staying: _serve_all(staying), 10, "the handoff")
        handoffs_s.append(time.monotonic() - started)
        found = partial(_takeovers, node, staying, since_s)
        takeovers += wait_until(found, 5, "the new owner's serving lines")
        node.start()
        wait_until(lambda: _settled(*nodes), 15, "the partitions shared again")
        time.sleep(1.0)  # the load runs on the restarted node
    return handoffs_s, takeovers


def test_scenario_7_rolling_sigterm_of_every_node(redis_url: str) -> None:
    nodes = [_node(redis_url, name, "--metrics-port", "0") for name in ("a", "b")]
    try:
        wait_until(lambda: _settled(*nodes), 15, "the two nodes to share the partitions")
        with loaded(nodes) as run:
            time.sleep(1.0)  # the load runs on both nodes first
            handoffs_s, takeovers = _restart_every(nodes)
            figures = ", ".join(f"{s:.2f}" for s in handoffs_s)
            took_s = sorted(t.took_s for t in takeovers)
            slowest = max(takeovers, key=lambda t: t.took_s - t.load_s)
            report = finish(
                run,
                nodes,
                f"7 (rolling SIGTERM; stop and handoff {figures} s; takeovers"
                f" {took_s[0]:.2f} to {took_s[-1]:.2f} s, slowest {slowest})",
            )
        metrics = [_metrics(node) for node in nodes]  # of each one's restarted process
    finally:
        for node in nodes:
            node.kill()
    _assert_clean(report, graceful=True)
    for node in nodes:
        assert "handed back partition" in node.log_text()
    assert max(handoffs_s) < LEASE_S, figures  # handed back, not waited out
    # The issue: the next owner takes over in under a second plus its load time.
    assert len(takeovers) == PARTITIONS, takeovers  # each node's share, handed back once
    for t in takeovers:
        margin_s = 2 * LOG_RESOLUTION_S + t.lines * LOAD_RESOLUTION_S
        assert t.took_s < HANDOFF_BOUND_S + t.load_s + margin_s, takeovers
    assert sum(m["delaywheel_partitions_owned"] for m in metrics) == PARTITIONS
    assert (
        metrics[0]["delaywheel_takeovers_total"] == PARTITIONS
    )  # its own and b's, while b was down
    assert all(m["delaywheel_fenced_flushes_total"] == 0 for m in metrics)
    assert all("delaywheel_lease_renewals_failed_total" in m for m in metrics)
    assert all(m["delaywheel_takeover_seconds_total"] > 0 for m in metrics)
    # a's process handed b's share back when b came back; b's handed nothing.
    assert [m["delaywheel_handoffs_total"] for m in metrics] == [
        metrics[1]["delaywheel_partitions_owned"],
        0,
    ]
    assert all(m["delaywheel_partitions_unowned"] == 0 for m in metrics)


def test_scenario_8_scale_2_to_3_to_2(redis_url: str, two_nodes: list[ServerProcess]) -> None:
    with loaded(two_nodes) as run:
        time.sleep(1.0)  # the load runs on two nodes first
        third = _node(redis_url, "c")
        try:
            wait_until(lambda: _settled(*two_nodes, third), 15, "three nodes to share")
            time.sleep(1.5)  # on three
            started = time.monotonic()
            assert third.stop() == 0
            wait_until(lambda: _settled(*two_nodes), 15, "two nodes to share again")
            scaled_down_s = time.monotonic() - started
        finally:
            third.kill()
        time.sleep(1.0)  # on two again
        figures = f"8 (2 -> 3 -> 2; back to 2 in {scaled_down_s:.2f} s)"
        report = finish(run, two_nodes, figures, gone=[third])
    _assert_clean(report, graceful=True)
    assert "handed back partition" in third.log_text()
    assert scaled_down_s < LEASE_S  # handed back, not waited out


def test_scenario_9_two_nodes_with_no_ha_options_on_one_redis(redis_url: str) -> None:
    # No --node, --lease or --partitions: what an operator's second start does.
    # The default name is host and port, so each gets a port of its own.
    first = ServerProcess("--port", str(free_port()), *SINK_ALLOWED, store=redis_url)
    second: ServerProcess | None = None
    try:
        wait_until(lambda: len(_served(first)) == PARTITIONS, 15, "the first node's partitions")
        with loaded([first]) as run:
            time.sleep(1.0)  # one node, alone
            second = ServerProcess("--port", str(free_port()), *SINK_ALLOWED, store=redis_url)
            wait_until(lambda: _settled(first, second), 15, "the second node to share")
            time.sleep(1.5)  # both
            report = finish(run, [first, second], "9 (a second node with no HA options)")
        names = {_node_name(node) for node in (first, second)}
    finally:
        for node in (first, second):
            if node is not None:
                node.kill()
    assert len(names) == 2, names
    _assert_clean(report, graceful=True)


def test_a_node_restarted_under_its_name_takes_its_leases_back_at_once(redis_url: str) -> None:
    """kill -9 of a lone node, then the same ``--node`` started again: the
    leases still name it, and it takes them back with a new epoch instead of
    waiting out the lease (20 s here)."""
    lease_s = 20.0
    node = _node(redis_url, "solo", lease_s=lease_s)
    try:
        wait_until(lambda: len(_served(node)) == PARTITIONS, 15, "the node's partitions")
        node.kill()
        started = time.monotonic()
        node.start()
        wait_until(lambda: len(_served(node)) == PARTITIONS, lease_s, "the partitions back")
        back_s = time.monotonic() - started
        with Client(*node.address) as dw:
            epochs = {entry["epoch"] for entry in dw.stats()["partitions"]}
    finally:
        node.kill()
    print(f"restarted under its name: serving all {back_s:.2f} s after the start")
    assert epochs == {2}, epochs  # acquired anew, not the dead process's epoch 1
    assert back_s < lease_s / 2, back_s  # well before the leases could expire


def test_the_cluster_map_is_at_most_one_look_at_the_leases_old(redis_url: str) -> None:
    """A lease taken from under the node (written by hand for a node "z"):
    the node's ``cluster`` names z by its next look at the leases, every
    min(L/3, 0.5 s)."""
    node = _node(redis_url, "solo")
    try:
        wait_until(lambda: len(_served(node)) == PARTITIONS, 15, "the node's partitions")
        partition = 5
        with redis.Redis.from_url(redis_url) as store:
            keys = f"{{delaywheel:p{partition:03d}}}"
            store.set(f"{keys}:epoch", 99)
            store.set(f"{keys}:lease", "99 z 10.0.0.9:3450", px=60_000)
        taken_s = time.monotonic()
        with Client(*node.address) as dw:

            def named() -> bool:
                owner = dw.cluster()["owners"][partition]
                return (owner["node"], owner["epoch"]) == ("z", 99)

            wait_until(named, 10, "the map naming z")
        took_s = time.monotonic() - taken_s
    finally:
        node.kill()
    print(f"the map named the lease's new holder {took_s:.2f} s after it changed")
    assert took_s < min(LEASE_S / 3, 0.5) + 1.5, took_s  # one look, and a loaded machine


def test_another_partition_count_on_a_keyspace_is_refused(redis_url: str) -> None:
    first = _node(redis_url, "a")
    first.stop()
    run = subprocess.run(
        [*(sys.executable, "-m", "delaywheel", "serve"), "--store", redis_url, "--partitions", "8"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode != 0
    assert "16 partitions" in run.stderr and "not 8" in run.stderr


def test_cluster_options_on_a_single_node_store_are_a_usage_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--store", "memory://", "--partitions", "4"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 2
    assert "--partitions" in run.stderr and "serves one node" in run.stderr
