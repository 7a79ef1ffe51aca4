"""delaywheel side by side with beanstalkd, and with a floor: a do-nothing server.

Every contender is a real server process on 127.0.0.1, driven by a blocking
client in this process (or in ``PLAN.processes`` spawned client processes),
one call at a time unless said otherwise, with a 100-byte ``bytes`` body
everywhere:

- the floor: ``bench/echo_server.py`` (uvloop, one Unpacker, "pong" to
  everything) called with ``delaywheel_client.Client.ping()``;
- delaywheel: ``delaywheel serve`` on the memory store, on Redis (a private
  redis-server with AOF, ``appendfsync everysec``) and on SQLite (a file in a
  temporary directory), called with ``delaywheel_client.Client``;
- beanstalkd: a private one without binlog, and one with its binlog fsynced
  at most once a second (``-f 1000``, as Redis's everysec), called with the
  ``greenstalk`` client.

A scenario sets contenders side by side and runs them in turn, each for
``round_s`` seconds, ``rounds`` times over (A B A B A B): a drift of this
noisy machine then hits all of them alike. A figure is the median of its
rounds, every round listed; a ratio is the median of one over the median of
the other, printed with its target. Rates count completed calls (tasks for
``add_many`` and pipelines, reserve+ack pairs for reserve) over the time the
round took. "Server CPU per call" is the server process's utime + stime (from
``/proc/PID/stat``) over a round, divided by the calls of that round.

Where the processes run. On this two-CPU VM a wakeup on the other CPU costs
about 100 us, several times what a server spends on a request: a one-call-at-
a-time client and its server on different CPUs do ~8k calls/s whoever the
server is, on the same CPU 25-45k, and the scheduler chooses differently for
different servers. So every single-connection scenario pins the client and
every thread of the servers it involves (Redis too) to one CPU, the same one
for every contender: a figure is then the CPU cost of a whole round trip, not
the scheduler's luck. The multi-process scenarios run unpinned, over all CPUs.

Memory per pending task: the server's VmRSS (``/proc/PID/status``) before and
after ``memory_tasks`` tasks due in a day, divided by their number; for
delaywheel right after ``add_many``, on the memory store (which keeps a dict
of the records besides the engine's index, as a store that can load what it
was given must) and on SQLite (records in the file, so the server's own
memory for its tasks); and "loaded": those SQLite tasks read by a fresh
server on that file, less a fresh server on an empty file; for beanstalkd,
put with delay 86,400.

When beanstalkd (or greenstalk) is missing, every beanstalkd figure is left
out and ``params["skipped"]`` says why; likewise Redis. ``run(quick=True)``
runs the same scenarios with tiny rounds and counts. How a contender is
driven (the clients, the loads, one round) is in ``bench/_loads.py``; what
the scenarios share (the plan, the servers, pinning, alternating, the
figures) in ``bench/_section.py``; the memory figures in ``bench/_memory.py``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from multiprocessing import get_context
from pathlib import Path

from bench import Report, Target, progress
from bench._beanstalk import BINLOG_FSYNC_MS, unavailable
from bench._loads import (
    ADD_MANY_BATCH,
    BODY,
    PIPELINE_DEPTH,
    READY_TOPIC,
    WARMUP_STEPS,
    Address,
    Run,
    drive,
    drive_processes,
    warm_up,
)
from bench._memory import memory
from bench._section import (
    FULL,
    QUICK,
    Contender,
    Section,
    add_tasks,
    alternate,
    cpu_figure,
    median_cpu_us,
    median_rate,
    pinned,
    put_jobs,
    rate_figure,
    ratio_figure,
    start_servers,
)


def one_at_a_time(section: Section) -> None:
    """Ping, get and add against the floor, delaywheel on memory and beanstalkd."""
    servers = section.servers
    contenders = [
        section.contender("echo ping", "ping", "echo"),
        section.contender("delaywheel ping", "ping", "dw_memory"),
        section.contender("delaywheel get", "get", "dw_memory"),
        section.contender("delaywheel add", "add", "dw_memory"),
    ]
    if section.has("bs"):
        contenders.append(section.contender("beanstalkd put", "put", "bs"))
    with pinned(servers.pids("echo", "dw_memory", "bs")):
        runs = alternate(contenders, section.plan.rounds)
    echo = runs["echo ping"]
    floor_rate, floor_cpu = median_rate(echo), median_cpu_us(echo)
    section.floor.update(rate=floor_rate, cpu_us=floor_cpu)
    add = median_rate(runs["delaywheel add"])
    figures = section.figures
    figures += [
        rate_figure("echo_ping_rate", "echo floor: Client.ping()", echo, note="bench/echo_server"),
        cpu_figure("echo_cpu_us", "  echo server CPU per call", echo),
    ]
    for method in ("ping", "get"):
        mine = runs[f"delaywheel {method}"]
        figures += [
            rate_figure(f"{method}_rate", f"delaywheel {method}", mine, note="memory store"),
            cpu_figure(f"{method}_cpu_us", f"  server CPU per {method}", mine),
            ratio_figure(
                f"{method}_cpu_vs_echo",
                f"  {method} CPU / echo CPU",
                median_cpu_us(mine),
                floor_cpu,
                Target("<=", 1.3),
                "server CPU per call, delaywheel / echo floor",
            ),
        ]
    figures += [
        rate_figure("add_memory_rate", "delaywheel add, memory", runs["delaywheel add"]),
        ratio_figure(
            "add_memory_vs_echo",
            "  add / echo ping",
            add,
            floor_rate,
            Target(">=", 0.7),
            "rate, delaywheel add / echo floor",
        ),
    ]
    if section.has("bs"):
        put = runs["beanstalkd put"]
        figures += [
            rate_figure(
                "bs_put_rate",
                "beanstalkd put",
                put,
                note=f"server CPU {median_cpu_us(put):.1f} us/put",
            ),
            ratio_figure(
                "add_memory_vs_bs",
                "  add / beanstalkd put",
                add,
                median_rate(put),
                Target(">=", 0.5),
                "rate, delaywheel add (memory) / beanstalkd put (no binlog)",
            ),
        ]


def journaled_one_at_a_time(section: Section) -> None:
    """add journaled to Redis against put with beanstalkd's binlog, one connection."""
    if not section.servers.has("dw_redis"):
        return
    contenders = [section.contender("delaywheel add, Redis", "add", "dw_redis")]
    if section.has("bs_binlog"):
        contenders.append(section.contender("beanstalkd put, binlog", "put", "bs_binlog"))
    with pinned(section.servers.pids("dw_redis", "bs_binlog")):
        runs = alternate(contenders, section.plan.rounds)
    redis = runs["delaywheel add, Redis"]
    section.figures.append(rate_figure("add_redis_rate", "delaywheel add, Redis", redis))
    if section.has("bs_binlog"):
        binlog = runs["beanstalkd put, binlog"]
        section.figures += [
            rate_figure("bs_binlog_put_rate", "beanstalkd put, binlog", binlog),
            ratio_figure(
                "add_redis_vs_bs_binlog",
                "  add Redis / put binlog",
                median_rate(redis),
                median_rate(binlog),
                Target(">=", 0.3),
                "rate, journaled: Redis everysec / binlog -f 1000",
            ),
        ]


def batches(section: Section) -> None:
    """add_many of 1,000 and pipelines of 200 against beanstalkd's serial put."""
    servers = section.servers
    contenders = [
        section.contender("delaywheel add_many, memory", "add_many", "dw_memory"),
        section.contender("delaywheel pipeline, memory", "pipeline", "dw_memory"),
    ]
    if servers.has("dw_redis"):
        contenders.append(section.contender("delaywheel add_many, Redis", "add_many", "dw_redis"))
    if section.has("bs"):
        contenders.append(section.contender("beanstalkd put", "put", "bs"))
    with pinned(servers.pids("dw_memory", "dw_redis", "bs")):
        runs = alternate(contenders, section.plan.rounds)
    many = runs["delaywheel add_many, memory"]
    piped = runs["delaywheel pipeline, memory"]
    figures = section.figures
    figures.append(
        rate_figure(
            "add_many_memory_rate", f"add_many of {ADD_MANY_BATCH:,}, memory", many, "tasks/s"
        )
    )
    put = runs.get("beanstalkd put")
    if put is not None:
        figures.append(
            ratio_figure(
                "add_many_memory_vs_bs",
                "  add_many / beanstalkd put",
                median_rate(many),
                median_rate(put),
                Target(">=", 5.0),
                "tasks/s, add_many / serial put",
            )
        )
    redis = runs.get("delaywheel add_many, Redis")
    if redis is not None:
        figures += [
            rate_figure(
                "add_many_redis_rate", f"add_many of {ADD_MANY_BATCH:,}, Redis", redis, "tasks/s"
            ),
            ratio_figure(
                "add_many_redis_vs_memory",
                "  add_many Redis / memory",
                median_rate(redis),
                median_rate(many),
                Target(">=", 0.8),
                "tasks/s: within 20 % of the memory store",
            ),
        ]
    figures.append(
        rate_figure(
            "pipeline_memory_rate",
            f"pipelined adds, {PIPELINE_DEPTH} a batch",
            piped,
            "tasks/s",
            note="Client.pipeline(), one connection",
        )
    )
    if put is not None:
        figures += [
            rate_figure("bs_put_batches_rate", "beanstalkd put (this rotation)", put),
            ratio_figure(
                "pipeline_memory_vs_bs",
                "  pipelined / beanstalkd put",
                median_rate(piped),
                median_rate(put),
                Target(">=", 3.0),
                "tasks/s, pipelined adds / serial put",
            ),
        ]


def fill_dw(address: Address, count: int) -> None:
    add_tasks(address, count, READY_TOPIC, 0)


def fill_bs(address: Address, count: int) -> None:
    put_jobs(address, count, READY_TOPIC, 0)


def reserve(section: Section) -> None:
    """reserve + ack against beanstalkd's reserve + delete, on pre-filled ready queues."""
    servers = section.servers
    fill = section.plan.reserve_fill
    # A round stops when the queue is used up, whatever the time: pairs are never
    # asked of an empty queue. (The warm-up takes its pairs from the queue too.)
    cap = fill - WARMUP_STEPS

    def filled(
        name: str, load: str, server: str, filler: Callable[[Address, int], None]
    ) -> Contender:
        pid, address = servers.procs[server]
        left = [0]  # ready tasks the previous rounds left in the queue

        def go() -> Run:
            # Topped up to the same depth before every round, for both: how
            # deep the queue is must not favour the slower contender.
            filler(address, fill - left[0])
            run = drive(load, address, pid, section.plan.round_s, cap)
            left[0] = cap - run.ops
            return run

        return name, go

    contenders = [filled("delaywheel reserve+ack", "reserve_ack", "dw_memory", fill_dw)]
    if section.has("bs"):
        contenders.append(filled("beanstalkd reserve+delete", "reserve_delete", "bs", fill_bs))
    with pinned(servers.pids("dw_memory", "bs")):
        runs = alternate(contenders, section.plan.rounds)
    pairs = runs["delaywheel reserve+ack"]
    figures = section.figures
    figures.append(rate_figure("reserve_ack_rate", "delaywheel reserve + ack", pairs, "pairs/s"))
    if section.has("bs"):
        deleted = runs["beanstalkd reserve+delete"]
        figures += [
            rate_figure(
                "bs_reserve_delete_rate", "beanstalkd reserve + delete", deleted, "pairs/s"
            ),
            ratio_figure(
                "reserve_vs_bs",
                "  reserve+ack / beanstalkd",
                median_rate(pairs),
                median_rate(deleted),
                Target(">=", 0.6),
                "pairs/s",
            ),
        ]
    figures.append(
        ratio_figure(
            "reserve_vs_echo",
            "  reserve+ack / (echo / 2)",
            median_rate(pairs),
            section.floor["rate"] / 2,
            Target(">=", 0.7),
            "pairs/s against half the echo floor",
        )
    )


def many_processes(section: Section, pool: ProcessPoolExecutor) -> None:
    """``processes`` client processes at once, each one call at a time: total rates."""
    servers = section.servers
    processes = section.plan.processes

    def contender(name: str, load: str, server: str) -> Contender:
        address = servers.address(server)
        return name, lambda: drive_processes(pool, processes, load, address, section.plan.round_s)

    contenders = [contender("memory", "add", "dw_memory")]
    if section.has("bs"):
        contenders.append(contender("beanstalkd", "put", "bs"))
    if servers.has("dw_redis"):
        contenders.append(contender("Redis", "add", "dw_redis"))
    contenders.append(contender("SQLite", "add", "dw_sqlite"))
    if section.has("bs_binlog"):
        contenders.append(contender("beanstalkd binlog", "put", "bs_binlog"))
    progress(f"starting {processes} client processes")
    for future in [pool.submit(warm_up) for _ in range(processes)]:
        future.result()
    runs = alternate(contenders, section.plan.rounds, f"{processes} processes: ")
    figures = section.figures
    n = processes

    def versus(key: str, mine: str, theirs: str, target: Target | None, note: str) -> None:
        if mine in runs and theirs in runs:
            figures.append(
                ratio_figure(
                    key,
                    f"  {mine} / {theirs}",
                    median_rate(runs[mine]),
                    median_rate(runs[theirs]),
                    target,
                    note,
                )
            )

    figures.append(rate_figure("add8_memory_rate", f"{n} processes: add, memory", runs["memory"]))
    if "beanstalkd" in runs:
        figures.append(rate_figure("bs8_put_rate", f"{n} processes: put", runs["beanstalkd"]))
    versus("add8_memory_vs_bs", "memory", "beanstalkd", Target(">=", 0.6), "total rate")
    if "Redis" in runs:
        figures.append(rate_figure("add8_redis_rate", f"{n} processes: add, Redis", runs["Redis"]))
    figures.append(rate_figure("add8_sqlite_rate", f"{n} processes: add, SQLite", runs["SQLite"]))
    if "beanstalkd binlog" in runs:
        figures.append(
            rate_figure(
                "bs8_binlog_put_rate", f"{n} processes: put, binlog", runs["beanstalkd binlog"]
            )
        )
    versus(
        "add8_redis_vs_bs_binlog",
        "Redis",
        "beanstalkd binlog",
        Target(">=", 0.5),
        "total rate, journaled",
    )
    versus(
        "add8_sqlite_vs_bs_binlog",
        "SQLite",
        "beanstalkd binlog",
        None,
        "total rate, journaled; no target",
    )


# -- the section --------------------------------------------------------------------------


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    why_not = unavailable()
    skipped = [] if why_not is None else [f"beanstalkd figures skipped: {why_not}"]
    for message in skipped:
        progress(message)
    directory = Path(tempfile.mkdtemp(prefix="delaywheel-compare-"))
    spawn = get_context("spawn")
    try:
        with ExitStack() as stack:
            servers = start_servers(stack, directory, why_not is None)
            for message in servers.skipped:
                progress(message)
            section = Section(plan, servers)
            one_at_a_time(section)
            journaled_one_at_a_time(section)
            batches(section)
            reserve(section)
            with ProcessPoolExecutor(plan.processes, mp_context=spawn) as pool:
                many_processes(section, pool)
        memory(section, directory, why_not is None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    skipped += servers.skipped
    return Report(
        "compare",
        f"delaywheel vs beanstalkd and an echo floor{' (quick)' if quick else ''}: "
        f"{plan.rounds} alternating rounds of {plan.round_s:g} s, median; 100-byte bodies",
        section.figures,
        params={
            "quick": quick,
            "rounds": plan.rounds,
            "round_s": plan.round_s,
            "processes": plan.processes,
            "reserve_fill": plan.reserve_fill,
            "memory_tasks": plan.memory_tasks,
            "body_bytes": len(BODY),
            "add_many_batch": ADD_MANY_BATCH,
            "pipeline_depth": PIPELINE_DEPTH,
            "beanstalkd_binlog_fsync_ms": BINLOG_FSYNC_MS,
            "single_connection_pinned_to_one_cpu": True,
            "skipped": skipped,
        },
        elapsed_s=time.perf_counter() - started,
    )
