"""Real nodes sharing one Redis keyspace, for the cluster client, CLI and HA tests.

``node`` starts ``delaywheel serve`` with a node name and a real port (a node's
address is what the others send clients to); ``two_nodes`` is a module fixture of two
of them on a database of the session's private redis-server, waited on until every
partition has one owner and each node's ``cluster`` map says so. Import the fixture
into a test module by name: ``from clusternodes import two_nodes``. ``owned_once``
(every partition served by exactly one node, maps aside) and ``metrics_of`` (a
node's /metrics) are for the HA tests' waits and checks.
"""

from __future__ import annotations

import contextlib
import re
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import free_port
from delaywheel_client import Client
from prometheus_client.parser import text_string_to_metric_families
from serverproc import ServerProcess
from waiting import wait_until

PARTITIONS = 16
LEASE_S = 3.0  # long enough that a loaded machine does not make a node lose a lease
SETTLE_TIMEOUT_S = 20.0


def node(store: str, name: str, *args: str) -> ServerProcess:
    # The later --port wins over ServerProcess's --port 0.
    return ServerProcess(
        "--port", str(free_port()), "--node", name, "--lease", str(LEASE_S), *args, store=store
    )  # fmt: skip


def address(proc: ServerProcess) -> str:
    return f"{proc.host}:{proc.port}"


def served(proc: ServerProcess) -> set[int]:
    """The partitions ``proc`` serves now (its ``stats``)."""
    with Client(*proc.address) as dw:
        return {entry["partition"] for entry in dw.stats()["partitions"]}


def metrics_of(proc: ServerProcess) -> dict[str, float]:
    """The unlabelled samples of ``proc``'s /metrics (started with --metrics-port)."""
    # The last such line: the running process's, when it was started again.
    urls = [m.group(1) for line in proc.log if (m := re.search(r"metrics on (\S+)", line))]
    with urllib.request.urlopen(urls[-1], timeout=10) as reply:
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def owned_once(*nodes: ServerProcess) -> bool:
    """Every partition served by exactly one of ``nodes``."""
    seen = [served(node) for node in nodes]
    return (
        all(seen)  # each has some (a joining node has none for a moment)
        and sum(len(s) for s in seen) == PARTITIONS
        and set().union(*seen) == set(range(PARTITIONS))
    )


def settled(nodes: list[ServerProcess]) -> bool:
    """Every partition served by exactly one node, each node serving some, and every
    node's map saying so (``cluster`` is what the clients read)."""
    seen = [served(proc) for proc in nodes]
    if not all(seen) or sum(map(len, seen)) != PARTITIONS:
        return False
    addresses = {address(proc) for proc in nodes}
    for proc in nodes:
        with Client(*proc.address) as dw:
            owners = {entry["address"] for entry in dw.call("cluster")["owners"]}
        if owners != addresses:
            return False
    return True


@contextlib.contextmanager
def node_pair(store: str, *args: str) -> Iterator[list[ServerProcess]]:
    """Nodes ``a`` and ``b`` on ``store`` (``args`` to both), once settled; stopped after."""
    with nodes_named(store, "ab", *args) as nodes:
        yield nodes


@contextlib.contextmanager
def nodes_named(store: str, names: str, *args: str) -> Iterator[list[ServerProcess]]:
    """A node for each letter of ``names`` on ``store`` (``args`` to each), once
    settled; stopped after."""
    nodes = [node(store, name, *args) for name in names]
    try:
        wait_until(
            lambda: settled(nodes), SETTLE_TIMEOUT_S, f"{len(nodes)} nodes sharing the partitions"
        )
        yield nodes
    finally:
        for proc in nodes:
            proc.stop()


@pytest.fixture(scope="module")
def two_nodes(module_redis_url: str) -> Iterator[list[ServerProcess]]:
    with node_pair(module_redis_url) as nodes:
        yield nodes
