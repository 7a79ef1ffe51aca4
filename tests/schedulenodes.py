"""What the schedule tests on real servers share (test_schedule_durable, test_schedule_server).

``SCHEDULE`` is a one-second schedule whose occurrences are taken at once
(ttr 0); ``nominal_seconds`` reads the nominal times back from the ids a
taker got; ``assert_each_once`` checks that they run without a gap or a
repeat; ``schedule_node`` starts a node on a shared Redis keyspace.
"""

from __future__ import annotations

from serverproc import ServerProcess, free_port

# overlap allow: these tests are about the fire step alone. Under the default
# skip, an occurrence left ready while the takers stop (across a restart)
# makes the next one skipped, and the ids have a gap (seen: 1 run in 4 on Redis).
SCHEDULE = {"every": 1, "topic": "occ", "ttr": 0, "catchup": "all", "overlap": "allow"}


def nominal_seconds(ids: list[str], schedule_id: str) -> list[int]:
    prefix = f"s:{schedule_id}:"
    return sorted(int(task_id[len(prefix) :]) for task_id in ids if task_id.startswith(prefix))


def assert_each_once(ids: list[str], schedule_id: str, fired: int) -> None:
    nominals = nominal_seconds(ids, schedule_id)
    assert len(nominals) == len(set(nominals)), f"an occurrence came twice: {nominals}"
    assert nominals == list(range(nominals[0], nominals[0] + len(nominals))), nominals
    assert len(nominals) == fired


def schedule_node(redis_url: str, name: str) -> ServerProcess:
    # A real port: a node's address is what the others send clients to.
    return ServerProcess(
        "--port", str(free_port()), "--node", name, "--lease", "1.5", store=redis_url
    )
