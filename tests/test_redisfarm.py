"""The Sentinel and Cluster deployments of tests/redisfarm.py work, fail over,
and leave nothing behind."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis

if TYPE_CHECKING:  # imported by pytest as a plugin, below: not before
    from redisfarm import ClusterFarm, SentinelFarm

pytest_plugins = ("redisfarm",)  # its fixtures: redis_sentinels, redis_cluster6

# Generous: Sentinel needs down-after (1 s) plus an election of a few seconds.
FAILOVER_BOUND_S = 30.0


def test_sentinels_name_the_primary_and_promote_a_replica(redis_sentinels: SentinelFarm) -> None:
    farm = redis_sentinels
    for sentinel in farm.sentinels:
        assert sentinel.master_address() == ("127.0.0.1", farm.primary.port)
    with farm.primary.client() as client:
        client.set("before", "failover")
        assert client.wait(2, 5000) == 2  # both replicas have it
    old_port = farm.primary.port
    farm.primary.kill()  # SIGKILL
    started_s = time.monotonic()
    while (address := farm.sentinels[0].master_address()) == ("127.0.0.1", old_port):
        assert time.monotonic() - started_s < FAILOVER_BOUND_S, "no replica was promoted"
        time.sleep(0.1)
    assert address is not None
    promoted = farm.current_primary()
    assert promoted in farm.replicas
    deadline = time.monotonic() + FAILOVER_BOUND_S
    with promoted.client() as client:
        while client.info("replication")["role"] != "master":
            assert time.monotonic() < deadline, "the named replica never became primary"
            time.sleep(0.1)
        assert client.get("before") == b"failover"
        client.set("after", "failover")  # it takes writes


def test_the_cluster_is_ok_with_three_primaries_and_three_replicas(
    redis_cluster6: ClusterFarm,
) -> None:
    farm = redis_cluster6
    assert len(farm.primaries()) == 3 and len(farm.replicas()) == 3
    for node in farm.nodes:
        with node.client() as client:
            info = client.cluster("INFO")
            assert info["cluster_state"] == "ok"
            assert int(info["cluster_slots_assigned"]) == 16384
    with redis.RedisCluster(host="127.0.0.1", port=farm.nodes[0].port, socket_timeout=5) as cluster:
        for p in range(16):  # the partitions' tags spread over the primaries
            cluster.set(f"{{delaywheel:p{p:03d}}}:epoch", 1)
        assert cluster.get("{delaywheel:p015}:epoch") == b"1"


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["sentinels", "cluster"])
def test_a_farm_leaves_nothing_behind(kind: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from redisfarm import ClusterFarm, SentinelFarm

    directory = tmp_path_factory.mktemp(kind)
    # Small ones (the fixtures' full sizes are shown working above): teardown is the point.
    farm: SentinelFarm | ClusterFarm = (
        SentinelFarm(directory, replicas=1, sentinels=1)
        if kind == "sentinels"
        else ClusterFarm(directory, replicas_each=0)
    )
    farm.start()
    procs = [s.proc for s in farm.servers] if isinstance(farm, SentinelFarm) else []
    if isinstance(farm, SentinelFarm):
        procs += [s.proc for s in farm.sentinels]
    else:
        procs = [n.proc for n in farm.nodes]
    assert all(proc is not None and proc.poll() is None for proc in procs)
    farm.close()
    assert all(proc is not None and proc.poll() is not None for proc in procs)
    assert not directory.exists()
