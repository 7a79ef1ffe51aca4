"""One HA scenario's run: load through a ``ClusterClient``, a sink, then the checker.

``loaded(nodes)`` starts a ``Sink`` and a ``LoadGenerator`` (tests/hacheck.py)
adding tasks with short delays, a tenth of them deleted, aimed at the sink,
through a ``ClusterClient`` on ``nodes``. The test injects its faults inside
the ``with``, notes them in ``run.faults``, and calls ``finish(run, nodes,
scenario)`` last in it (the sink closes at its end). ``finish`` stops the
load, waits until every acknowledged task that was not deleted has been
delivered (or the wait is up), asks the nodes for the ones that were not,
and returns ``check``'s ``Report``, printed as one line (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from delaywheel_client import ClusterClient
from hacheck import (
    Fault,
    LoadGenerator,
    Report,
    RequestLog,
    Sink,
    check,
    failed_attempts,
    sink,
)
from serverproc import KEEP_LOGS, ServerProcess

# The load: adds per second, their delays, and the sink target's timeout. A
# short timeout bounds how long a new owner holds a taken-over attempt
# (journaled as delivering) before sending it again.
RATE_PER_S = 40.0
DELAYS_S = (0.2, 1.5)
TARGET_TIMEOUT_S = 1.0
# Requests to a stopped node give up after this and go again (an add carries its id).
CLIENT_TIMEOUT_S = 1.0
# After the load stops: the longest delay, a held attempt's timeout, and room for a slow machine.
SETTLE_S = DELAYS_S[1] + TARGET_TIMEOUT_S + 15.0


@dataclass
class Run:
    sink: Sink
    log: RequestLog
    load: LoadGenerator
    faults: list[float | Fault] = field(default_factory=list)


def seeds(nodes: Sequence[ServerProcess]) -> list[str]:
    return [f"{node.host}:{node.port}" for node in nodes]


@contextlib.contextmanager
def loaded(nodes: Sequence[ServerProcess], name: str = "load") -> Iterator[Run]:
    """A sink and a load on ``nodes`` for the length of the ``with`` (stopped at its end)."""
    with (
        sink() as running,
        ClusterClient(seeds(nodes), timeout_s=CLIENT_TIMEOUT_S) as client,
    ):
        log = RequestLog()
        load = LoadGenerator(
            client,
            running,
            log,
            rate=RATE_PER_S,
            delay_s=DELAYS_S,
            name=name,
            target_timeout_s=TARGET_TIMEOUT_S,
        )
        run = Run(running, log, load.start())
        try:
            yield run
        finally:
            load.stop()


def undelivered(run: Run) -> set[str]:
    """Acknowledged adds, never deleted (nor tried), that the sink has not had yet."""
    requests = run.log.snapshot()
    deleted = {r.task_id for r in requests if r.op == "delete" and r.outcome != "error"}
    acknowledged = {r.task_id for r in requests if r.op == "add" and r.outcome == "ok"}
    delivered = {d.task_id for d in run.sink.received()}
    return acknowledged - deleted - delivered


def finish(
    run: Run, nodes: Sequence[ServerProcess], scenario: str, gone: Sequence[ServerProcess] = ()
) -> Report:
    """Stop the load, let what is due be delivered, and check the logs: the
    run's, and the servers' (``nodes``, and ``gone``: those stopped for good
    before the end) for the attempts they saw fail."""
    run.load.stop()
    deadline_s = time.monotonic() + SETTLE_S
    while undelivered(run) and time.monotonic() < deadline_s:
        time.sleep(0.1)
    time.sleep(TARGET_TIMEOUT_S + 0.5)  # a late duplicate shows now or never: its attempt's timeout
    missing = undelivered(run)
    pending: list[str] = []
    if missing:
        with ClusterClient(seeds(nodes)) as client:
            pending = [task_id for task_id in sorted(missing) if client.get(task_id) is not None]
    failed = failed_attempts(line for node in [*nodes, *gone] for line in list(node.log))
    report = check(
        run.log.snapshot(), run.sink.received(), pending, faults=run.faults, failed=failed
    )
    print(f"\nHA scenario {scenario}: {report.summary()}")
    _keep(run, scenario, report)
    return report


def _keep(run: Run, scenario: str, report: Report) -> None:
    """The run's requests and deliveries as JSON beside the servers' logs, under
    $KEEP_TEST_LOGS (tests/serverproc.py), to read a failure with them."""
    folder = os.environ.get(KEEP_LOGS)
    if not folder:
        return
    kept = {
        "scenario": scenario,
        "summary": report.summary(),
        "duplicates": report.duplicates,
        "retried": report.retried,
        "faults": [dataclasses.asdict(f) if isinstance(f, Fault) else f for f in run.faults],
        "requests": [dataclasses.asdict(r) for r in run.log.snapshot()],
        "deliveries": [dataclasses.asdict(d) for d in run.sink.received()],
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    name = f"run-{int(time.time() * 1000)}.json"
    (Path(folder) / name).write_text(json.dumps(kept, default=repr, indent=0))


def explain(report: Report) -> str:
    """The figures and the first few ids of each finding, for an assert message."""
    found = {
        "lost": report.lost,
        "resurrected": report.resurrected,
        "early": report.early,
        "unexplained duplicates": sorted(report.unexplained),
    }
    details = "; ".join(f"{what}: {ids[:5]}" for what, ids in found.items() if ids)
    return f"{report.summary()}{'; ' + details if details else ''}"
