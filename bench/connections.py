"""Connections at scale, side by side: delaywheel, Redis and beanstalkd in one run.

Each server is a real process on 127.0.0.1: ``delaywheel serve`` on the memory
store, a private redis-server (AOF, as the compare section's), a private
beanstalkd without binlog. The connections are held by client processes
(``bench/_holder.py``, 500 connections each), so that no process needs more
than a default soft limit of open files. Three figures:

- Memory per connection: the server's VmRSS (``/proc/PID/status``) before
  and after ``idle`` connections that each made one round trip (delaywheel
  ``ping``, Redis ``PING``, beanstalkd ``list-tube-used``), divided by their
  number; and the same with a consumer blocked on each (delaywheel
  ``reserve``, Redis ``BLPOP``, beanstalkd ``reserve-with-timeout``). Each
  of the two on a fresh server (one that held 5,000 connections before
  reuses what they freed), which first takes and drops 200 connections, so
  that what a first connection allocates once is not counted per connection.
- Time to answer N blocked consumers after one batch: from just before the
  batch is sent (delaywheel one ``add_many`` of N, Redis one ``RPUSH`` of N
  values, beanstalkd N ``put`` in one write, as it has no batch put) to the
  moment the last consumer's reply arrived, read from the monotonic clock
  that every process of the machine shares. The consumers are all waiting
  at the server before the batch goes (its own count says so). The median of
  ``rounds``; every round listed.
- Connections accepted per second: this process opens ``accept``
  connections one after another, each with one round trip, keeping them
  open (a burst of workers reconnecting), contenders alternating round by
  round; and the server's CPU per connection over the burst.

Unpinned: the holders and the servers share both CPUs, as they would.
"""

from __future__ import annotations

import itertools
import math
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from bench import Figure, Report, Target, progress
from bench._beanstalk import private_beanstalkd, unavailable
from bench._holder import ROUND_TRIP
from bench._loads import Address, cpu_s, dw_client, rss_bytes
from bench._procs import private_redis_process, server_process

HOLDER = (sys.executable, "-m", "bench._holder")
PER_HOLDER = 500
WARM_CONNECTIONS = 200
SETTLE_S = 0.5  # after connections open or close, before the RSS is read
WAIT_TIMEOUT_S = 120.0
# The bounds: 8 kB per idle connection, 1 s to answer 5,000 reserves.
IDLE_TARGET = Target("<=", 8192)
TOPICS = itertools.count()  # a topic (list, tube) per round of blocked consumers
ANSWER_TARGET = Target("<=", 1000.0)


@dataclass(frozen=True)
class Plan:
    idle: int  # connections for the memory figures
    answer: tuple[int, ...]  # consumers for the time-to-answer figures, the last at `idle`
    accept: int  # connections per accept round
    rounds: int


FULL = Plan(idle=5_000, answer=(1_000, 5_000), accept=2_000, rounds=3)
QUICK = Plan(idle=300, answer=(100, 300), accept=200, rounds=1)
# The figures' keys name the full plan's counts, whatever the plan (params say).
ANSWER_KEYS = ("1000", "5000")


@dataclass
class Contender:
    kind: str  # dw, redis, bs: what bench/_holder.py speaks
    name: str
    pid: int
    address: Address
    waiting: Callable[[], int]  # consumers blocked at the server, by its own count


# -- the holders -------------------------------------------------------------------------


@contextmanager
def held(contender: Contender, count: int, *mode: str) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` connections of ``contender`` held by holder processes, each of which
    has printed its first line (read it with ``line``); let go on the way out."""
    host, port = contender.address
    procs: list[subprocess.Popen[str]] = []
    try:
        for first in range(0, count, PER_HOLDER):
            size = min(PER_HOLDER, count - first)
            procs.append(
                subprocess.Popen(
                    [*HOLDER, contender.kind, host, str(port), str(size), *mode],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            proc.wait(60)
            if proc.stdout is not None:
                proc.stdout.close()
        time.sleep(SETTLE_S)


def line(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    return proc.stdout.readline().split()


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- each server's own count of blocked consumers, and its batch ------------------------------


def sized_reply(address: Address, request: bytes) -> bytes:
    """One request on a fresh connection; the reply's body, whose header gives its size
    (Redis ``$N``, beanstalkd ``OK N``)."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while True:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"{address} closed during {request!r}")
            reply += data
            header, _, body = reply.partition(b"\r\n")
            if _ and len(body) >= int(header.split()[-1].lstrip(b"$")):
                return body


def redis_waiting(address: Address) -> int:
    found = re.search(rb"blocked_clients:(\d+)", sized_reply(address, b"INFO clients\r\n"))
    return int(found.group(1)) if found else 0


def bs_waiting(address: Address) -> int:
    found = re.search(rb"current-waiting: (\d+)", sized_reply(address, b"stats\r\n"))
    return int(found.group(1)) if found else 0


def dw_waiting(address: Address) -> int:
    with dw_client(address) as client:
        return int(client.stats()["waiting_reserves"])


def send_batch(contender: Contender, count: int, topic: str) -> float:
    """Send one batch of ``count`` jobs and wait until the server has taken it all;
    returns the monotonic time just before the batch went."""
    if contender.kind == "dw":
        with dw_client(contender.address) as client:
            tasks = [{"topic": topic, "body": b"x"}] * count
            started = time.monotonic()
            client.add_many(tasks)
            return started
    if contender.kind == "redis":
        name = topic.encode()
        payload = b"*%d\r\n$5\r\nRPUSH\r\n$%d\r\n%s\r\n" % (count + 2, len(name), name)
        payload += b"$1\r\nx\r\n" * count
        lines = 1  # :N, the list's length
    else:
        payload = f"use {topic}\r\n".encode() + b"put 0 0 60 1\r\nx\r\n" * count
        lines = count + 1  # USING TOPIC, then INSERTED ID for each
    with socket.create_connection(contender.address, timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(payload)
        replies = b""
        # beanstalkd drops what a closed connection left unread: wait for every reply
        while replies.count(b"\r\n") < lines:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"{contender.name} closed during the batch")
            replies += data
        return started


# -- the figures -----------------------------------------------------------------------------


def warm(contender: Contender) -> None:
    with held(contender, WARM_CONNECTIONS, "idle") as procs:
        for proc in procs:
            line(proc)


def idle_bytes(contender: Contender, count: int) -> float:
    warm(contender)
    before = rss_bytes(contender.pid)
    with held(contender, count, "idle") as procs:
        ready = sum(int(line(proc)[1]) for proc in procs)
        if ready != count:
            raise RuntimeError(f"{contender.name}: {ready} of {count} connections answered")
        time.sleep(SETTLE_S)
        after = rss_bytes(contender.pid)
    return (after - before) / count


def blocked(contender: Contender, count: int, measure_memory: bool) -> tuple[float, float]:
    """(milliseconds from the batch to the last answer, bytes per blocked consumer or nan).

    Each time on a topic of its own: the jobs a round's consumers took (reserved, on
    delaywheel and beanstalkd) come back when they leave, and must not feed the next."""
    warm(contender)
    topic = f"jobs{next(TOPICS)}"
    before = rss_bytes(contender.pid)
    with held(contender, count, "block", topic) as procs:
        for proc in procs:
            line(proc)  # waiting
        wait_until(lambda: contender.waiting() >= count, f"{count} blocked on {contender.name}")
        per_consumer = math.nan
        if measure_memory:
            time.sleep(SETTLE_S)
            per_consumer = (rss_bytes(contender.pid) - before) / count
        started = send_batch(contender, count, topic)
        answers = [line(proc) for proc in procs]
    answered = sum(int(words[1]) for words in answers)
    if answered != count:
        raise RuntimeError(f"{contender.name}: {answered} of {count} consumers answered")
    return (max(float(words[2]) for words in answers) - started) * 1000, per_consumer


def accept_round(contender: Contender, count: int) -> tuple[float, float]:
    """(connections per second, server CPU microseconds per connection)."""
    request = ROUND_TRIP[contender.kind]
    socks = []
    cpu_before = cpu_s(contender.pid)
    started = time.perf_counter()
    try:
        for _ in range(count):
            sock = socket.create_connection(contender.address, timeout=30)
            socks.append(sock)
            sock.sendall(request)
            if not sock.recv(256):
                raise RuntimeError(f"{contender.name} closed a new connection")
        elapsed_s = time.perf_counter() - started
        cpu_us = (cpu_s(contender.pid) - cpu_before) / count * 1e6
    finally:
        for sock in socks:
            sock.close()
    time.sleep(SETTLE_S)
    return count / elapsed_s, cpu_us


# -- the section ----------------------------------------------------------------------------


def raise_own_limit(needed: int) -> None:
    """This process's soft open-files limit (and so its servers'), up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft < top:
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


def kinds_here(skipped: list[str]) -> list[str]:
    """The servers this machine can run, saying in ``skipped`` why one cannot."""
    kinds = ["dw"]
    if shutil.which("redis-server") is None:
        skipped.append("no redis-server installed: the Redis figures are left out")
    else:
        kinds.append("redis")
    why_not = unavailable()
    if why_not is not None:
        skipped.append(f"beanstalkd figures skipped: {why_not}")
    else:
        kinds.append("bs")
    return kinds


@contextmanager
def launched(kind: str, directory: Path) -> Iterator[Contender]:
    """A fresh server of ``kind``, stopped on the way out."""
    if kind == "dw":
        with server_process("memory://") as (pid, address):
            yield Contender(kind, "delaywheel", pid, address, partial(dw_waiting, address))
    elif kind == "redis":
        redis_dir = Path(tempfile.mkdtemp(dir=directory))
        with private_redis_process(redis_dir) as found:
            assert found is not None  # kinds_here saw redis-server
            pid, url = found
            address = ("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]))
            yield Contender(kind, "Redis", pid, address, partial(redis_waiting, address))
    else:
        with private_beanstalkd() as (pid, address):
            yield Contender(kind, "beanstalkd", pid, address, partial(bs_waiting, address))


def run(quick: bool = False) -> Report:
    started = time.perf_counter()
    plan = QUICK if quick else FULL
    raise_own_limit(plan.idle + plan.accept + 1_000)
    skipped: list[str] = []
    kinds = kinds_here(skipped)
    for message in skipped:
        progress(message)
    directory = Path(tempfile.mkdtemp(prefix="delaywheel-connections-"))
    figures: list[Figure] = []
    try:
        for kind in kinds:
            figures += memory_figures(kind, directory, plan)
        with ExitStack() as stack:
            contenders = [stack.enter_context(launched(kind, directory)) for kind in kinds]
            figures += answer_figures(contenders, plan)
            figures += accept_figures(contenders, plan)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "connections",
        f"connections side by side{' (quick)' if quick else ''}: {plan.idle:,} held, "
        f"{' and '.join(f'{n:,}' for n in plan.answer)} blocked, {plan.accept:,} accepted; "
        f"median of {plan.rounds}",
        figures,
        params={
            "quick": quick,
            "idle_connections": plan.idle,
            "answer_counts": list(plan.answer),
            "accept_connections": plan.accept,
            "rounds": plan.rounds,
            "connections_per_holder": PER_HOLDER,
            "skipped": skipped,
        },
        elapsed_s=time.perf_counter() - started,
    )


def memory_figures(kind: str, directory: Path, plan: Plan) -> list[Figure]:
    """Idle and blocked connections, each on a fresh server: one that has held 5,000
    connections before reuses their freed memory, and would seem to need less."""
    with launched(kind, directory) as contender:
        name = contender.name
        progress(f"{name}: memory of {plan.idle:,} idle connections")
        idle = idle_bytes(contender, plan.idle)
    with launched(kind, directory) as contender:
        progress(f"{name}: memory of {plan.idle:,} blocked consumers")
        _, per_blocked = blocked(contender, plan.idle, measure_memory=True)
    waits = {"dw": "reserve", "redis": "BLPOP", "bs": "reserve-with-timeout"}[kind]
    return [
        Figure(
            f"{kind}_idle_bytes",
            f"{name}: memory per idle connection",
            idle,
            "B/conn",
            IDLE_TARGET if kind == "dw" else None,
            note=f"RSS growth over {plan.idle:,} connections, one round trip each",
        ),
        Figure(
            f"{kind}_blocked_bytes",
            f"{name}: memory per blocked {waits}",
            per_blocked,
            "B/conn",
            IDLE_TARGET if kind == "dw" else None,
            note=f"{plan.idle:,} consumers waiting",
        ),
    ]


def answer_figures(contenders: list[Contender], plan: Plan) -> list[Figure]:
    figures = []
    for count, key in zip(plan.answer, ANSWER_KEYS, strict=True):
        runs: dict[str, list[float]] = {contender.kind: [] for contender in contenders}
        for number in range(1, plan.rounds + 1):
            for contender in contenders:
                progress(f"{contender.name}: {count:,} blocked answered, round {number}")
                runs[contender.kind].append(blocked(contender, count, measure_memory=False)[0])
        for contender in contenders:
            batch = {"dw": "one add_many", "redis": "one RPUSH", "bs": "puts in one write"}
            times = tuple(runs[contender.kind])
            figures.append(
                Figure(
                    f"{contender.kind}_answer_{key}_ms",
                    f"{contender.name}: {count:,} blocked answered",
                    statistics.median(times),
                    "ms",
                    ANSWER_TARGET if contender.kind == "dw" else None,
                    runs=times,
                    note=f"after {batch[contender.kind]}, to the last reply",
                )
            )
    return figures


def accept_figures(contenders: list[Contender], plan: Plan) -> list[Figure]:
    runs: dict[str, list[tuple[float, float]]] = {contender.kind: [] for contender in contenders}
    for number in range(1, plan.rounds + 1):
        for contender in contenders:
            progress(f"{contender.name}: {plan.accept:,} connections accepted, round {number}")
            runs[contender.kind].append(accept_round(contender, plan.accept))
    figures = []
    for contender in contenders:
        rates = tuple(rate for rate, _ in runs[contender.kind])
        cpu_us = statistics.median(cpu for _, cpu in runs[contender.kind])
        figures.append(
            Figure(
                f"{contender.kind}_accept_rate",
                f"{contender.name}: connections accepted",
                statistics.median(rates),
                "conn/s",
                runs=rates,
                note=f"one round trip each, kept open; server CPU {cpu_us:.0f} us/conn",
            )
        )
    return figures
