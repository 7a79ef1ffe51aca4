"""Shared fixtures. Each section is owned by whoever wrote it; append new sections below."""

from __future__ import annotations

import contextlib
import itertools
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from delaywheel_client import Client
from serverproc import ServerProcess, free_port

# The machine's services (RabbitMQ, NATS, docker-compose) and the markers of the
# fast loop: fixtures and hooks of their own modules, taken into effect here.
from services import nats_url as nats_url
from services import rabbitmq_url as rabbitmq_url
from suites import pytest_collection_modifyitems as pytest_collection_modifyitems
from suites import pytest_configure as pytest_configure
from suites import pytest_fixture_setup as pytest_fixture_setup
from suites import pytest_runtest_makereport as pytest_runtest_makereport
from suites import pytest_runtest_protocol as pytest_runtest_protocol
from suites import pytest_runtest_setup as pytest_runtest_setup
from suites import pytest_terminal_summary as pytest_terminal_summary

if TYPE_CHECKING:
    from redisfarm import SentinelFarm

# ---------------------------------------------------------------------------
# Redis: one private redis-server per test session (owner: store)
#
# `redis_server` starts `redis-server` on a free port of 127.0.0.1 with AOF on
# and RDB snapshots off, in its own temporary directory, and stops it at the
# end of the session. Tests may stop(), kill() and start() it again: it comes
# back on the same port and directory, so whatever reached the AOF survives.
# `redis_url` hands each test its own, freshly flushed, database number on
# that server (starting it again if an earlier test left it down).
#
# Never point a test at the shared Redis on port 6379, and never FLUSHALL a
# server the test did not start.
# ---------------------------------------------------------------------------

REDIS_DATABASES = 256  # db 0 is left alone; tests cycle through 1..255
REDIS_START_TIMEOUT_S = 10.0


def free_cluster_port() -> int:
    """A free port for a Redis Cluster node, whose cluster bus listens on the
    port 10000 above it: that one must exist (<= 65535) and be free too."""
    while True:
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bus:
            try:
                bus.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port


class RedisServer:
    """A private redis-server process that a test may stop, kill and restart."""

    def __init__(
        self,
        directory: Path,
        extra_args: Sequence[str] = (),
        pick_port: Callable[[], int] = free_port,
    ) -> None:
        self.directory = directory
        self.extra_args = list(extra_args)
        self.pick_port = pick_port
        self.port = 0  # chosen at the first start, kept for restarts
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of db 0 (without the password of a ``--requirepass`` server)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the server (no-op when running) and wait until it answers PING."""
        if self.running:
            return
        # A free port can be taken between our probe and redis binding it; only
        # the first start may move to another one.
        first_start = self.port == 0
        for _ in range(3 if first_start else 1):
            if first_start:
                self.port = self.pick_port()
            if self._spawn_and_wait():
                return
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{self._log_tail()}")

    def _spawn_and_wait(self) -> bool:
        args = [
            "redis-server",
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "yes",
            "--dir", str(self.directory),
            "--logfile", "redis.log",
            "--databases", str(REDIS_DATABASES),
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            if self._answers_ping():
                return True
            time.sleep(0.01)
        self.kill()
        return False

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        # +PONG, or -NOAUTH from a --requirepass server; -LOADING is not ready yet.
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def stop(self) -> None:
        """SIGTERM, as an operator's restart does: Redis flushes the AOF and exits."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash. Writes Redis had already written to the AOF survive."""
        self._end(signal.SIGKILL)

    def _end(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def client(self, db: int = 0, password: str | None = None) -> redis.Redis:
        """A blocking client for inspecting and configuring this server; close it."""
        return redis.Redis(port=self.port, db=db, password=password, socket_timeout=5)

    def _log_tail(self) -> str:
        try:
            return "".join((self.directory / "redis.log").read_text().splitlines(True)[-20:])
        except OSError as exc:
            return f"(no log: {exc})"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


_redis_dbs = itertools.cycle(range(1, REDIS_DATABASES))


def db_of(url: str) -> int:
    """The database number of a ``redis_url``."""
    return int(url.rsplit("/", 1)[1])


@contextlib.contextmanager
def primary_with_replica(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A private primary and a replica that has synced with it."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    # No 5 s wait before the diskless sync of the replica (Redis 7's default).
    primary = RedisServer(tmp_path / "primary", ["--repl-diskless-sync-delay", "0"])
    primary.start()
    replica = RedisServer(tmp_path / "replica", ["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        replica.start()
        wait_for_link(replica)
        yield primary, replica
    finally:  # SIGKILL: a primary stopped with SIGTERM waits 10 s for its replicas
        replica.kill()
        primary.kill()


def wait_for_link(replica: RedisServer) -> None:
    deadline = time.monotonic() + 10
    with replica.client() as client:
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)


def _fresh_database_url(redis_server: RedisServer) -> str:
    redis_server.start()
    db = next(_redis_dbs)
    with redis_server.client(db) as client:
        client.flushdb()
    return f"redis://127.0.0.1:{redis_server.port}/{db}"


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/N``: a database of the private server, this test's alone."""
    return _fresh_database_url(redis_server)


# -- a private Redis Cluster (owner: store) --------------------------------------
#
# `redis_cluster` starts three cluster-enabled redis-servers of our own (AOF on,
# free ports), splits the 16384 slots between them and joins them with CLUSTER
# MEET, for the whole session. Tests that use it get it flushed (every node is
# ours). `far_node_url` is a node that does not own the store's key, so a test
# through it shows the client following the cluster's redirections.

CLUSTER_SLOTS = 16384


class RedisCluster:
    def __init__(self, directory: Path, size: int = 3) -> None:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        self.nodes = []
        for i in range(size):
            (directory / f"node{i}").mkdir()
            self.nodes.append(RedisServer(directory / f"node{i}", args, free_cluster_port))

    @property
    def _slots_per_node(self) -> int:
        return -(-CLUSTER_SLOTS // len(self.nodes))  # ceiling division

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        share = self._slots_per_node
        first, *others = self.nodes
        for i, node in enumerate(self.nodes):
            with node.client() as client:
                client.execute_command(
                    "CLUSTER ADDSLOTS", *range(i * share, min((i + 1) * share, CLUSTER_SLOTS))
                )
        with first.client() as client:
            for node in others:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not all(self._ready(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not come up")
            time.sleep(0.05)

    def _ready(self, node: RedisServer) -> bool:
        with node.client() as client:
            info = client.cluster("INFO")  # parsed into a dict of str
        return info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == len(self.nodes)

    def flush(self) -> None:
        for node in self.nodes:
            with node.client() as client:
                client.flushall()

    def owner_of(self, key: str) -> RedisServer:
        """The node that holds ``key`` now, as the cluster says (a test may have
        migrated its slot since ``start``)."""
        with self.nodes[0].client() as client:
            slot = client.execute_command("CLUSTER KEYSLOT", key)
            ranges = client.execute_command("CLUSTER SLOTS")
        for first, last, (_host, port, *_), *_replicas in ranges:
            if first <= slot <= last:
                return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no node serves slot {slot} of {key!r}")

    def far_node_url(self, key: str) -> str:
        """The URL of a node that does not hold ``key``."""
        owner = self.nodes.index(self.owner_of(key))
        return self.nodes[(owner + 1) % len(self.nodes)].url

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# -- the delaywheel server -------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """One real server per test module (memory store, 0.05 s tick); modules that
    need other settings define their own ``server``."""
    proc = ServerProcess()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def address(server: ServerProcess) -> str:
    """The module's server as ``HOST:PORT``, as the CLI's ``--server`` takes it."""
    return f"{server.host}:{server.port}"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(*server.address) as dw:
        yield dw


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic no other test uses, so tests can share a server."""
    return f"topic-{request.node.name}"


# -- a Redis database for a module's own server (owner: client targets) ----------
#
# `redis_url` is per test; a module that starts one server for all its tests on
# a Redis store takes `module_redis_url`, a database drawn from the same cycle,
# so no `redis_url` test is handed it while the module runs.


@pytest.fixture(scope="module")
def module_redis_url(redis_server: RedisServer) -> str:
    return _fresh_database_url(redis_server)


# -- a durable store, SQLite and then Redis (owner: priority) -------------------


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def durable_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file of the test's own, then a Redis database of its own: for a
    test that kills its server and starts it again on the same store."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tasks.db'}"
    url: str = request.getfixturevalue("redis_url")
    return url


# -- each store, empty: the store's conformance suite and the horizon's (owner: store)

# The stores a test taking `store_url` runs on, unless its module names its own
# `STORE_KINDS` (test_store.py adds Sentinel, whose farm is its module's).
STORE_KINDS = (
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
)
SENTINEL_DB = 2  # the Sentinel farm's database a `redis-sentinel` store uses


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_url" in metafunc.fixturenames:
        stores = getattr(metafunc.module, "STORE_KINDS", STORE_KINDS)
        metafunc.parametrize("store_url", stores, indirect=True)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of each kind, empty: memory, SQLite, a private Redis (a database
    of its own), a Redis Cluster (flushed; every script must be legal there)
    and, where the module lists it, Sentinel (its `module_sentinels` farm's
    database, flushed)."""
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"  # tmp_path is absolute: four slashes
    if kind == "redis-cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        cluster.flush()
        return cluster.far_node_url("{delaywheel}:meta")
    if kind == "redis-sentinel":
        farm: SentinelFarm = request.getfixturevalue("module_sentinels")
        with farm.current_primary().client(SENTINEL_DB) as client:
            client.flushdb()
        hosts = ",".join(f"{host}:{port}" for host, port in farm.sentinel_addresses)
        return f"redis+sentinel://{hosts}/dwmaster/{SENTINEL_DB}"
    url: str = request.getfixturevalue("redis_url")  # only redis tests start Redis
    return url
