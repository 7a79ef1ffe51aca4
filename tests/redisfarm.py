"""Redis deployments for the high-availability tests: Sentinel and Cluster.

- ``SentinelFarm``: a primary, two replicas (``--replicaof``) and three
  Sentinels (``redis-server sentinel.conf --sentinel``, quorum 2) monitoring
  it as ``MASTER_NAME``, with tight timings so a failover takes a few seconds.
- ``ClusterFarm``: a Redis Cluster of three primaries and three replicas,
  made by ``redis-cli --cluster create ... --cluster-replicas 1``, with a
  short ``cluster-node-timeout`` so a replica takes over a killed primary
  quickly.

Each runs in a directory of its own and ``close()`` kills every process and
removes the directory. The fixtures ``redis_sentinels`` and ``redis_cluster6``
give each test a fresh one (tests kill and freeze its processes);
``module_sentinels`` one Sentinel farm for a module's conformance tests (the
Sentinel kind of conftest.py's ``store_url``). Import them with
``pytest_plugins = ("redisfarm",)`` in the test module.
All ports are free ports of 127.0.0.1, never 6379.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from conftest import RedisServer, free_cluster_port, free_port

MASTER_NAME = "dwmaster"
START_TIMEOUT_S = 20.0
# Sentinel: the primary is down after this long without a reply; a failover
# that stalls is retried after failover-timeout. Tight, for fast tests, but
# not so tight that a busy 2-core machine makes Sentinels imagine failures.
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000
# Cluster: a node unreachable this long is failing; its replica takes over.
CLUSTER_NODE_TIMEOUT_MS = 1000
# Redis 7 syncs a new replica diskless after a 5 s wait for more replicas to
# join; ours start together, so no wait. A Sentinel farm's replicas too: one
# promoted by a failover is the primary the other resyncs from, and with the
# wait every change after the failover was unavailable (WAIT 1) for 5.6 s.
PRIMARY_ARGS = ("--repl-diskless-sync-delay", "0")


class Sentinel:
    """One ``redis-server --sentinel`` process with its generated config."""

    def __init__(self, directory: Path, primary_port: int, quorum: int) -> None:
        self.directory = directory
        self.port = free_port()
        self.config = directory / "sentinel.conf"
        # Sentinel rewrites its config file as it learns (replicas, epochs).
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    "daemonize no",
                    f'dir "{directory}"',
                    'logfile "sentinel.log"',
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} {quorum}",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {MASTER_NAME} 2",
                    "",
                ]
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers_ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sentinel did not start on {self.port}:\n{self.log_tail()}")
            time.sleep(0.02)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, decode_responses=True)

    def master_address(self) -> tuple[str, int] | None:
        with self.client() as client:
            reply = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
        return None if reply is None else (reply[0], int(reply[1]))

    def kill(self) -> None:
        _end(self.proc)
        self.proc = None

    def log_tail(self) -> str:
        try:
            return "".join((self.directory / "sentinel.log").read_text().splitlines(True)[-20:])
        except OSError as exc:
            return f"(no log: {exc})"


class SentinelFarm:
    """A primary, two replicas and three Sentinels (see the module docstring)."""

    def __init__(self, directory: Path, replicas: int = 2, sentinels: int = 3) -> None:
        self.directory = directory
        (directory / "primary").mkdir()
        self.primary = RedisServer(directory / "primary", PRIMARY_ARGS)
        self.replicas: list[RedisServer] = []
        self.sentinels: list[Sentinel] = []
        self._replica_count = replicas
        self._sentinel_count = sentinels

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def start(self) -> None:
        self.primary.start()
        for i in range(self._replica_count):
            (self.directory / f"replica{i}").mkdir()
            replica = RedisServer(
                self.directory / f"replica{i}",
                [*PRIMARY_ARGS, "--replicaof", "127.0.0.1", str(self.primary.port)],
            )
            self.replicas.append(replica)
            replica.start()
        for replica in self.replicas:
            _wait_for(partial(_link_up, replica), f"replica {replica.port} to sync")
        quorum = self._sentinel_count // 2 + 1
        for i in range(self._sentinel_count):
            (self.directory / f"sentinel{i}").mkdir()
            sentinel = Sentinel(self.directory / f"sentinel{i}", self.primary.port, quorum)
            self.sentinels.append(sentinel)
            sentinel.start()
        # Ready for a failover once every Sentinel knows the replicas and the
        # other Sentinels (they meet through the primary's hello channel, ~2 s).
        for sentinel in self.sentinels:
            _wait_for(partial(self._knows_all, sentinel), f"sentinel {sentinel.port} to meet")

    def _knows_all(self, sentinel: Sentinel) -> bool:
        with sentinel.client() as client:
            state = client.execute_command("SENTINEL", "MASTER", MASTER_NAME)
        info = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
        return (
            int(info["num-slaves"]) == len(self.replicas)
            and int(info["num-other-sentinels"]) == len(self.sentinels) - 1
        )

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def current_primary(self) -> RedisServer:
        """The server the Sentinels name as primary now."""
        address = self.sentinels[0].master_address()
        assert address is not None
        return next(s for s in self.servers if s.port == address[1])

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.kill()
        for server in self.servers:
            server.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class ClusterFarm:
    """Three primaries and three replicas as one Redis Cluster."""

    def __init__(
        self,
        directory: Path,
        primaries: int = 3,
        replicas_each: int = 1,
        node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS,
        full_coverage: bool = True,
    ) -> None:
        self.directory = directory
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            # no: a primary keeps serving its slots while another's are uncovered
            "--cluster-require-full-coverage", "yes" if full_coverage else "no",
            *PRIMARY_ARGS,
        ]  # fmt: skip
        self.replicas_each = replicas_each
        self.nodes: list[RedisServer] = []
        for i in range(primaries * (1 + replicas_each)):
            (directory / f"node{i}").mkdir()
            self.nodes.append(RedisServer(directory / f"node{i}", args, free_cluster_port))

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        create = [
            "redis-cli", "--cluster", "create", *addresses,
            "--cluster-replicas", str(self.replicas_each), "--cluster-yes",
        ]  # fmt: skip
        created = subprocess.run(create, capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed:\n{created.stdout}{created.stderr}"
            )
        _wait_for(self._ready, "the cluster to be ok on every node")

    def _ready(self) -> bool:
        for node in self.nodes:
            with node.client() as client:
                info = client.cluster("INFO")
                if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(
                    self.nodes
                ):
                    return False
                role = client.execute_command("ROLE")
                if role[0] == b"slave" and role[3] != b"connected":
                    return False
        return True

    def primaries(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.running and _role(node) == "master"]

    def replicas(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.running and _role(node) == "slave"]

    @property
    def url(self) -> str:
        return next(node for node in self.nodes if node.running).url

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def _role(server: RedisServer) -> str:
    with server.client() as client:
        role = client.execute_command("ROLE")
    return role[0].decode() if isinstance(role[0], bytes) else str(role[0])


def _link_up(replica: RedisServer) -> bool:
    with replica.client() as client:
        return client.info("replication").get("master_link_status") == "up"


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _wait_for(ready: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _end(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


Farm = TypeVar("Farm", SentinelFarm, ClusterFarm)


@contextlib.contextmanager
def running(farm: Farm) -> Iterator[Farm]:
    """``farm`` started, and closed (processes killed, files removed) however it ends."""
    try:
        farm.start()
        yield farm
    finally:
        farm.close()


@pytest.fixture
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelFarm]:
    with running(SentinelFarm(tmp_path_factory.mktemp("sentinels"))) as farm:
        yield farm


@pytest.fixture(scope="module")
def module_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelFarm]:
    """One Sentinel farm for a module's tests, which must not kill or freeze it
    (conftest.py's ``store_url`` flushes its database for each test)."""
    with running(SentinelFarm(tmp_path_factory.mktemp("sentinels"))) as farm:
        yield farm


@pytest.fixture
def redis_cluster6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFarm]:
    with running(ClusterFarm(tmp_path_factory.mktemp("cluster6"))) as farm:
        yield farm
