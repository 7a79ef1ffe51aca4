"""Several nodes on one Redis keyspace (issue 16): real servers, a private redis-server.

Each node serves the partitions it holds a lease for; a task is fired by the
node that owns its partition, so two nodes never both hand it out. The
tests consume with plain clients on every node and count each id.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest
from delaywheel_client import Client, ClusterClient, Moved, TryAgain
from prometheus_client.parser import text_string_to_metric_families

from tests.serverproc import ServerProcess
from tests.waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.slow]

LEASE_S = 1.5
PARTITIONS = 16


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node(redis_url: str, name: str, *args: str, lease_s: float = LEASE_S) -> ServerProcess:
    # ServerProcess passes --port 0 first; the later --port wins. A real port,
    # because a node's address is what the others send clients to.
    port = str(_free_port())
    return ServerProcess(
        "--port", port, "--node", name, "--lease", str(lease_s), *args, store=redis_url
    )


def _served(proc: ServerProcess) -> set[int]:
    with Client(*proc.address) as dw:
        return {entry["partition"] for entry in dw.stats()["partitions"]}


def _settled(*nodes: ServerProcess) -> bool:
    """Every partition served by exactly one of ``nodes``."""
    seen = [_served(node) for node in nodes]
    return (
        all(seen)  # each has some (a joining node has none for a moment)
        and sum(len(s) for s in seen) == PARTITIONS
        and set().union(*seen) == set(range(PARTITIONS))
    )


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
    nodes = [_node(redis_url, "a"), _node(redis_url, "b")]
    try:
        wait_until(lambda: _settled(*nodes), 10, "the two nodes to share the partitions")
        yield nodes
    finally:
        for node in nodes:
            node.kill()


def _seeds(nodes: list[ServerProcess]) -> list[str]:
    return [f"{node.host}:{node.port}" for node in nodes]


def test_two_nodes_share_the_partitions_and_fire_each_task_once(
    two_nodes: list[ServerProcess],
) -> None:
    a, b = (_served(node) for node in two_nodes)
    assert a and b and not a & b  # both serve some, none twice
    with ClusterClient(_seeds(two_nodes)) as dw:
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
        other = next(e for e in dw.cluster()["owners"] if e["node"] == "b")
        task_id = next(f"x{n}" for n in range(10_000) if _partition(f"x{n}") == other["partition"])
        with pytest.raises(Moved) as caught:
            dw.add("t", None, id=task_id)
    assert caught.value.data == {
        "partition": other["partition"],
        "owner": other["address"],
        "epoch": other["epoch"],
    }


def _partition(task_id: str) -> int:
    import zlib

    return zlib.crc32(task_id.encode()) % PARTITIONS


def test_kill_9_of_an_owner_is_taken_over_within_two_leases(
    two_nodes: list[ServerProcess],
) -> None:
    with ClusterClient(_seeds(two_nodes)) as dw:
        for n in range(100):
            dw.add("t", None, id=f"k-{n}", delay=0.5)
    killed, survivor = two_nodes
    killed.kill()
    started = time.monotonic()
    wait_until(lambda: len(_served(survivor)) == PARTITIONS, 2 * LEASE_S + 5, "the takeover")
    took_s = time.monotonic() - started
    assert took_s <= 2 * LEASE_S + 2  # generous: the bound is 2 L
    got = _drain([survivor], 100, 10)
    assert sorted(got) == sorted(f"k-{n}" for n in range(100))


def test_sigterm_hands_the_partitions_back_at_once(redis_url: str) -> None:
    lease_s = 6.0  # long: a takeover well before it shows a handoff, not an expiry
    nodes = [
        _node(redis_url, "a", "--metrics-port", "0", lease_s=lease_s),
        _node(redis_url, "b", "--metrics-port", "0", lease_s=lease_s),
    ]
    try:
        wait_until(lambda: _settled(*nodes), 15, "the two nodes to share the partitions")
        with ClusterClient(_seeds(nodes)) as dw:
            for n in range(100):
                dw.add("t", None, id=f"h-{n}", delay=1.0)
        leaving, staying = nodes
        started = time.monotonic()
        assert leaving.stop() == 0
        wait_until(lambda: len(_served(staying)) == PARTITIONS, lease_s, "the handoff")
        assert time.monotonic() - started < lease_s / 2
        assert "handed back partition" in leaving.log_text()
        got = _drain([staying], 100, 10)
        assert sorted(got) == sorted(f"h-{n}" for n in range(100))
        assert _drain([staying], 1, 1.0) == []
        metrics = _metrics(staying)
        assert metrics["delaywheel_partitions_owned"] == PARTITIONS
        assert metrics["delaywheel_takeovers_total"] >= PARTITIONS  # its own and a's
        assert metrics["delaywheel_fenced_flushes_total"] == 0
    finally:
        for node in nodes:
            node.kill()


def _metrics(proc: ServerProcess) -> dict[str, float]:
    url = next(m.group(1) for line in proc.log if (m := re.search(r"metrics on (\S+)", line)))
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def test_a_paused_owner_is_fenced_and_answers_moved(two_nodes: list[ServerProcess]) -> None:
    paused, other = two_nodes
    before = _served(paused)
    assert paused.proc is not None
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: len(_served(other)) == PARTITIONS, 4 * LEASE_S + 5, "the takeover")
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    # Back, it learns it lost them (self-fenced while stopped) and serves none of them.
    wait_until(lambda: not _served(paused) & before, 5, "the paused node to drop them")
    task_id = next(f"p{n}" for n in range(10_000) if _partition(f"p{n}") in before)

    def answered_moved() -> bool:
        # tryagain until its next look at the leases shows the new owner
        with Client(*paused.address) as dw:
            try:
                dw.add("t", None, id=task_id)
            except Moved as exc:
                return exc.data is not None and exc.data["owner"] == f"{other.host}:{other.port}"
            except TryAgain:
                return False
        raise AssertionError(f"the paused node took {task_id!r}, which it no longer owns")

    wait_until(answered_moved, 5, "the paused node to answer moved")


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
