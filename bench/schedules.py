"""100,000 recurring schedules on one server: each minute's occurrences fire
within the tick (issue 17's bench figure), and what a schedule costs in memory.

One ``delaywheel serve --store sqlite:///... --metrics-port M`` (the embedded
store: every schedule, and every fire step's occurrence, is journaled), at the
default one-second tick. ``schedules`` schedules ``every: 60`` are added
through a pipeline, their anchors spread over the minute (``anchor = i % 60``),
so about 1,667 come due each second, each putting one ready-queue task. The
server's resident memory (``VmRSS``) is read before the adds and after them;
the difference over the count is the memory per schedule (its record, state,
pending occurrence task and indexes). Then the run waits until every schedule
has fired once (``delaywheel_schedule_occurrences_fired_total``) and reads
the server's ``delaywheel_schedule_fire_lateness_seconds`` histogram (from
each occurrence's firing time to its put): its p99 bucket bound is the
figure, against the tick. Missed and skipped occurrences are counted too
(both should be 0: the server is up, and with ``overlap: allow`` an
occurrence left ready does not skip the next). ``quick``: 2,000 schedules
every 2 s.
"""

from __future__ import annotations

import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench import Figure, Report, Target, progress
from bench._loads import dw_client
from bench._procs import free_port, server_process
from bench.dashboard import lateness_p99_s

TOPIC = "sched"
PIPELINE_BATCH = 1_000
TICK_S = 1.0  # the server's default: the figure is against it


@dataclass(frozen=True)
class Plan:
    schedules: int
    every_s: int


FULL = Plan(schedules=100_000, every_s=60)
QUICK = Plan(schedules=2_000, every_s=2)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def metric_total(metrics_url: str, name: str) -> float:
    """The sum of a counter's samples on /metrics (every label set)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    with tempfile.TemporaryDirectory() as directory:
        store = f"sqlite:///{directory}/schedules.db"
        with server_process(store, args=("--metrics-port", str(metrics_port))) as (pid, address):
            rss_before = rss_bytes(pid)
            progress(f"adding {plan.schedules:,} schedules every {plan.every_s} s")
            add_started = time.perf_counter()
            with dw_client(address) as client:
                for first in range(0, plan.schedules, PIPELINE_BATCH):
                    with client.pipeline() as pipe:
                        for i in range(first, min(first + PIPELINE_BATCH, plan.schedules)):
                            pipe.schedule_add(
                                {
                                    "id": f"bench-{i}",
                                    "every": plan.every_s,
                                    "anchor": i % plan.every_s,
                                    "topic": TOPIC,
                                    "body": b"x",
                                    # Nobody reserves here: under the default
                                    # skip, a ready previous one skips the next.
                                    "overlap": "allow",
                                }
                            )
                add_s = time.perf_counter() - add_started
                rss_after = rss_bytes(pid)
                added_at = time.time()
                progress(f"added in {add_s:.1f} s; waiting for each to fire once")
                fired_name = "delaywheel_schedule_occurrences_fired_total"
                deadline = added_at + 2 * plan.every_s + 30
                while metric_total(metrics_url, fired_name) < plan.schedules:
                    if time.time() > deadline:
                        raise RuntimeError("the schedules did not all fire in time")
                    time.sleep(0.5)
                p99_s, counted = lateness_p99_s(
                    metrics_url, "delaywheel_schedule_fire_lateness_seconds"
                )
                missed = metric_total(metrics_url, "delaywheel_schedule_occurrences_missed_total")
                skipped = metric_total(metrics_url, "delaywheel_schedule_occurrences_skipped_total")
                stats = client.stats()
    per_schedule = (rss_after - rss_before) / plan.schedules
    progress(f"p99 <= {p99_s * 1e3:g} ms over {counted:,} fired; {per_schedule:,.0f} B each")
    figures = [
        Figure(
            "add_rate",
            f"schedule_add, pipelined by {PIPELINE_BATCH:,}, journaled",
            plan.schedules / add_s,
            "/s",
        ),
        Figure(
            "bytes_per_schedule",
            "server memory per schedule (RSS growth over the adds)",
            per_schedule,
            "B",
            note=f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB",
        ),
        Figure(
            "fire_p99_ms",
            f"occurrence lateness p99, {plan.schedules // plan.every_s:,} due each second",
            p99_s * 1e3,
            "ms",
            Target("<=", TICK_S * 1e3),
            note=f"the bucket bound (/metrics) over {counted:,} fired; the tick is "
            f"{TICK_S:g} s; missed {missed:g}, skipped {skipped:g}; "
            f"stats schedules {stats.get('schedules')}",
        ),
    ]
    return Report(
        "schedules",
        f"{plan.schedules:,} schedules every {plan.every_s} s on one server"
        f"{' (quick)' if quick else ''}: SQLite store, the default tick",
        figures,
        params={"quick": quick, "schedules": plan.schedules, "every_s": plan.every_s},
        elapsed_s=time.perf_counter() - started,
    )
