"""The horizon at scale: N delayed tasks due over a year, the server's memory,
a restart, and the lateness of a steady stream while the far tier is pulled.

**Fill, memory and restart.** A real ``delaywheel serve`` (of this checkout,
or of another source tree with ``--tree``: its own ``.venv/bin/python``, run
in that tree) on a SQLite file, or on a private redis-server on a free port
in a temporary directory, with AOF and snapshots off (the fill is then the
server's writes and nothing of Redis's fsync; never the shared 6379). One
AsyncClient connection adds N tasks with ``add_many`` of ``FILL_BATCH``,
``FILL_IN_FLIGHT`` calls in flight (the way bench/journal.py drives its
pipelines), each task due at a time drawn uniformly (seeded) from two hours
to a year ahead, so none fires and with the default horizon (an hour) every
one is beyond it. Figures: the fill's rate; the server's RSS (``VmRSS`` of
/proc) after the adds; the store's size (the SQLite file with its WAL, or
Redis's ``used_memory`` before and after the fill, per task); then
``restarts`` times: SIGTERM, wait for the exit, start again, and time from
the exec to the ``listening`` line, to the first ``stats`` answered, and to
the first ``get`` of a task of the fill answered, and the RSS once it
answered. Restart figures are the median of the restarts, every run listed.

**Lateness while the far tier is pulled.** A server on a fresh SQLite file (or,
with ``--lateness-store redis``, a private redis-server, AOF off)
with ``--tick 0.01`` and, on a tree that has it, ``--horizon 2m``:
``far_tasks`` tasks of another topic are added first, due uniformly over
``FAR_SPAN_S`` from ``FAR_LEAD_S`` after the fill starts, so that from then
on each pull (every quarter of a horizon, 30 s) brings about
``far_tasks * 30 / FAR_SPAN_S`` of them into the wheel while the stream
runs. The stream: one thread adds ``STREAM_RATE`` tasks a second, one
``add`` at a time, each due 2 s later; ``STREAM_CONSUMERS`` threads reserve
them (blocking) and ack. Lateness = the time a ``reserve`` reply was read,
less the task's ``at``. The stream runs ``stream_s`` seconds (it stops
before the first far task is due, unless the fill took longer than
``FAR_LEAD_S - stream_s``: the note says when). On a tree without the
horizon the same far tasks are simply held in memory: that is the "before".

``python -m bench horizon`` runs both on this checkout with ``FULL``
counts; ``--quick`` fills 2,000 tasks on SQLite alone, restarts once and
skips the lateness (a pull comes every 30 s at the least). For other trees, counts
and stores: ``python -m bench.horizon --tree DIR --tasks N --store sqlite
--store redis [--lateness]``, which prints the same table.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from delaywheel_client import AsyncClient

from bench import Figure, Report, Target, progress, render_table
from bench._loads import Address, dw_client, rss_bytes
from bench._procs import knows_option, private_redis_process, tree_server
from bench.lateness import percentile

START_TIMEOUT_S = 900.0  # the tree before the horizon loads 10 M tasks in about 20 s
STOP_TIMEOUT_S = 300.0
HOUR_S = 3600.0
YEAR_S = 365 * 24 * HOUR_S
FILL_BATCH = 1_000
FILL_IN_FLIGHT = 8
BODY = {"order": 42, "action": "close-if-unpaid"}
SEED = 20_261_207
MB = 1e6

FAR_LEAD_S = 150.0
FAR_SPAN_S = 600.0
STREAM_RATE = 200  # tasks a second
STREAM_DELAY_S = 2.0
STREAM_CONSUMERS = 2
LATENESS_HORIZON = "2m"


@dataclass(frozen=True)
class Plan:
    """How much: the full run, or ``QUICK``."""

    tasks: int  # delayed tasks due over a year
    restarts: int
    far_tasks: int  # the lateness run's far tasks (0: no lateness run)
    stream_s: float


FULL = Plan(tasks=1_000_000, restarts=3, far_tasks=500_000, stream_s=100.0)
QUICK = Plan(tasks=2_000, restarts=1, far_tasks=0, stream_s=0.0)


# -- a server of a tree -----------------------------------------------------------------


class Server:
    """``delaywheel serve`` of ``tree`` (None: this checkout), started at construction."""

    def __init__(self, tree: Path | None, store_url: str, args: Sequence[str] = ()) -> None:
        self.tree, self.store_url, self.args = tree, store_url, args
        self.process = tree_server(tree, store_url, args, START_TIMEOUT_S)
        self.started = self.process.started  # perf_counter at the exec
        self.listening_s = self.process.listening_s  # exec to the listening line
        self.address: Address = self.process.address

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def stop(self) -> float:
        """SIGTERM and wait for the exit: the seconds it took."""
        started = time.perf_counter()
        self.process.stop(STOP_TIMEOUT_S)
        return time.perf_counter() - started


@contextmanager
def running(tree: Path | None, store_url: str, args: Sequence[str] = ()) -> Iterator[Server]:
    server = Server(tree, store_url, args)
    try:
        yield server
    finally:
        server.stop()


def knows_horizon(tree: Path | None) -> bool:
    """Whether the tree's server takes ``--horizon`` (the tree before it does not)."""
    return knows_option(tree, "--horizon")


def tree_name(tree: Path | None) -> str:
    return "this checkout" if tree is None else str(tree)


# -- fill -------------------------------------------------------------------------------


async def _fill(
    address: Address, count: int, topic: str, first_s: float, span_s: float
) -> tuple[float, str]:
    """``count`` tasks due uniformly over [first_s, first_s + span_s] (absolute):
    (adds a second, the id of the first task added)."""
    client = await AsyncClient.connect(*address)
    rng = random.Random(SEED)
    batches = iter(range(0, count, FILL_BATCH))
    first_ids: list[str] = []

    async def producer() -> None:
        for first in batches:
            tasks = [
                {"topic": topic, "body": BODY, "at": first_s + rng.random() * span_s}
                for _ in range(min(FILL_BATCH, count - first))
            ]
            added = await client.add_many(tasks)
            if first == 0:
                first_ids.append(added[0]["id"])

    try:
        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(FILL_IN_FLIGHT)))
        return count / (time.perf_counter() - started), first_ids[0]
    finally:
        await client.close()


def fill(
    address: Address, count: int, topic: str, first_s: float, span_s: float
) -> tuple[float, str]:
    return asyncio.run(_fill(address, count, topic, first_s, span_s))


def settled_rss(server: Server) -> int:
    with dw_client(server.address) as client:
        client.ping()
    return rss_bytes(server.pid)


def store_bytes(path: Path) -> int:
    """The SQLite file and its WAL and shared-memory files."""
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def redis_used_memory(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


# -- restart ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Restart:
    stop_s: float  # SIGTERM to exit, of the server before
    listening_s: float
    stats_s: float  # exec to the first stats answered
    get_s: float  # exec to the first get of a task of the fill answered
    rss: int


def restart(server: Server, task_id: str) -> tuple[Server, Restart]:
    stop_s = server.stop()
    fresh = Server(server.tree, server.store_url, server.args)
    with dw_client(fresh.address) as client:
        client.stats()
        stats_s = time.perf_counter() - fresh.started
        if client.get(task_id) is None:
            raise RuntimeError(f"task {task_id} of the fill is gone after a restart")
        get_s = time.perf_counter() - fresh.started
    return fresh, Restart(stop_s, fresh.listening_s, stats_s, get_s, rss_bytes(fresh.pid))


def median_figure(
    key: str, label: str, runs: Sequence[float], unit: str, target: Target | None, note: str
) -> Figure:
    return Figure(key, label, statistics.median(runs), unit, target, runs=tuple(runs), note=note)


def scale(
    tree: Path | None, store: str, directory: Path, tasks: int, restarts: int
) -> list[Figure]:
    """Fill ``tasks`` over a year on ``store`` (sqlite or redis), then restart."""
    db = directory / "horizon.db"
    with store_url(store, db) as url:
        if url is None:
            progress("no redis-server installed: Redis skipped")
            return []
        server = Server(tree, url)
        try:
            progress(f"{store}: {tasks:,} tasks due over a year, {tree_name(tree)}")
            filled = fill_over_a_year(server, store, url, tasks)
            figures = fill_figures(store, tasks, filled)
            server, runs = restarted(server, filled.task_id, store, restarts)
            if store == "sqlite":
                figures.append(sqlite_file_figure(db, tasks))
        finally:
            server.stop()
    return figures + restart_figures(store, runs)


@dataclass(frozen=True)
class Filled:
    """What the fill measured: its rate, and the memory before and after it."""

    task_id: str  # the first task added: each restart gets it
    rate: float  # adds a second
    empty_rss: int  # the server's, before the fill
    added_rss: int  # the server's, after it
    used_before: int  # Redis's used_memory before the fill (0 on SQLite)
    used_after: int  # and after it


def fill_over_a_year(server: Server, store: str, url: str, tasks: int) -> Filled:
    """``tasks`` due from two hours to a year ahead, with the memory around the fill."""
    empty_rss = settled_rss(server)
    used_before = redis_used_memory(url) if store == "redis" else 0
    now_s = time.time()
    rate, task_id = fill(server.address, tasks, "far", now_s + 2 * HOUR_S, YEAR_S)
    added_rss = settled_rss(server)
    used_after = redis_used_memory(url) if store == "redis" else 0
    return Filled(task_id, rate, empty_rss, added_rss, used_before, used_after)


def fill_figures(store: str, tasks: int, filled: Filled) -> list[Figure]:
    """The fill's rate, the server's RSS after it and, on Redis, used_memory per task."""
    figures = [
        Figure(
            f"{store}_fill_rate",
            f"{store}: adds while filling",
            filled.rate,
            "/s",
            note=f"add_many of {FILL_BATCH:,}, {FILL_IN_FLIGHT} in flight",
        ),
        Figure(
            f"{store}_rss_added_mb",
            f"{store}: server RSS after the adds",
            filled.added_rss / MB,
            "MB",
            Target("<=", 300.0) if store == "sqlite" else None,
            note=f"{tasks:,} tasks; {filled.empty_rss / MB:.0f} MB before them",
        ),
    ]
    if store == "redis":
        used_before, used_after = filled.used_before, filled.used_after
        figures.append(
            Figure(
                "redis_used_memory_per_task",
                "redis: used_memory per task",
                (used_after - used_before) / tasks,
                "B",
                note=f"INFO memory: {used_before / MB:.1f} MB before the fill,"
                f" {used_after / MB:.1f} MB after; AOF off",
            )
        )
    return figures


def restarted(
    server: Server, task_id: str, store: str, restarts: int
) -> tuple[Server, list[Restart]]:
    """``restarts`` restarts in turn: the server last started, and each one measured."""
    runs: list[Restart] = []
    for number in range(restarts):
        progress(f"{store}: restart {number + 1} of {restarts}")
        server, measured = restart(server, task_id)
        runs.append(measured)
    return server, runs


def sqlite_file_figure(db: Path, tasks: int) -> Figure:
    size = store_bytes(db)
    return Figure(
        "sqlite_file_bytes_per_task",
        "sqlite: file per task",
        size / tasks,
        "B",
        note=f"{size / MB:,.0f} MB with its WAL, after the restarts",
    )


def restart_figures(store: str, runs: Sequence[Restart]) -> list[Figure]:
    """The medians of the restarts: to listening, to serving, RSS, and the stop before."""
    target_s = Target("<=", 2.0) if store == "sqlite" else None
    return [
        median_figure(
            f"{store}_restart_listening_s",
            f"{store}: restart to listening",
            [r.listening_s for r in runs],
            "s",
            None,
            note="exec to the listening line, interpreter start included",
        ),
        median_figure(
            f"{store}_restart_serving_s",
            f"{store}: restart to serving",
            [r.get_s for r in runs],
            "s",
            target_s,
            note="exec to the first get answered; first stats at "
            + ", ".join(f"{r.stats_s:.2f}" for r in runs)
            + " s",
        ),
        median_figure(
            f"{store}_rss_restarted_mb",
            f"{store}: server RSS after a restart",
            [r.rss / MB for r in runs],
            "MB",
            Target("<=", 300.0) if store == "sqlite" else None,
            note="once it answered a get",
        ),
        median_figure(
            f"{store}_stop_s",
            f"{store}: SIGTERM to exit",
            [r.stop_s for r in runs],
            "s",
            None,
            note="the server before each restart",
        ),
    ]


@contextmanager
def store_url(store: str, db: Path) -> Iterator[str | None]:
    """The URL of ``store``: the SQLite file ``db``, or for redis a private
    redis-server, AOF off, in ``db``'s folder (None when none is installed)."""
    if store != "redis":
        yield f"sqlite:///{db}"
        return
    with private_redis_process(db.parent, aof=False) as found:
        yield None if found is None else found[1]


# -- lateness while the far tier is pulled ----------------------------------------------


def stream(address: Address, stream_s: float) -> list[float]:
    """``STREAM_RATE`` adds a second due ``STREAM_DELAY_S`` later, for ``stream_s``;
    every lateness (s) the consumers saw."""
    lateness: list[float] = []
    end_s = time.time() + stream_s
    count = int(stream_s * STREAM_RATE)

    def consume() -> None:
        with dw_client(address) as client:
            while len(lateness) < count and time.time() < end_s + STREAM_DELAY_S + 10:
                task = client.reserve("stream", 0.2)
                if task is None:
                    continue
                lateness.append(time.time() - task["at"])
                client.ack(task["id"])

    consumers = [threading.Thread(target=consume) for _ in range(STREAM_CONSUMERS)]
    for thread in consumers:
        thread.start()
    with dw_client(address) as client:
        started = time.monotonic()
        for number in range(count):
            pause_s = started + number / STREAM_RATE - time.monotonic()
            if pause_s > 0:
                time.sleep(pause_s)
            client.add("stream", BODY, delay=STREAM_DELAY_S)
    for thread in consumers:
        thread.join()
    return lateness


def lateness(tree: Path | None, directory: Path, plan: Plan, store: str = "sqlite") -> list[Figure]:
    args = ["--tick", "0.01"]
    horizon = knows_horizon(tree)
    if horizon:
        args += ["--horizon", LATENESS_HORIZON]
    with store_url(store, directory / "lateness.db") as url:
        if url is None:
            progress("no redis-server installed: the lateness on Redis skipped")
            return []
        return _lateness(tree, url, args, horizon, plan, store)


def _lateness(
    tree: Path | None, url: str, args: list[str], horizon: bool, plan: Plan, store: str
) -> list[Figure]:
    with running(tree, url, args) as server:
        fill_started_s = time.time()
        progress(f"lateness: {plan.far_tasks:,} tasks due from {FAR_LEAD_S:.0f} s on")
        fill(server.address, plan.far_tasks, "far", fill_started_s + FAR_LEAD_S, FAR_SPAN_S)
        filled_s = time.time() - fill_started_s
        progress(f"lateness: filled in {filled_s:.1f} s; the stream for {plan.stream_s:.0f} s")
        seen = sorted(stream(server.address, plan.stream_s))
    overlap_s = max(0.0, filled_s + plan.stream_s + STREAM_DELAY_S - FAR_LEAD_S)
    note = (
        f"{store}; {len(seen):,} tasks at {STREAM_RATE}/s due {STREAM_DELAY_S:.0f} s on;"
        f" {'horizon ' + LATENESS_HORIZON if horizon else 'no horizon (all in memory)'};"
        f" {plan.far_tasks:,} far tasks over {FAR_SPAN_S:.0f} s"
    )
    if overlap_s:
        note += f"; the far tasks fired in the last {overlap_s:.0f} s"
    return [
        Figure(
            "lateness_p50_ms", "stream lateness p50", percentile(seen, 0.5) * 1e3, "ms", note=note
        ),
        Figure("lateness_p99_ms", "stream lateness p99", percentile(seen, 0.99) * 1e3, "ms"),
        Figure("lateness_max_ms", "stream lateness max", seen[-1] * 1e3, "ms"),
    ]


# -- the section ------------------------------------------------------------------------


def measure(
    tree: Path | None,
    stores: Sequence[str],
    plan: Plan,
    with_lateness: bool,
    lateness_store: str = "sqlite",
) -> Report:
    started = time.perf_counter()
    figures: list[Figure] = []
    directory = Path(tempfile.mkdtemp(prefix="delaywheel-bench-horizon-"))
    try:
        for store in stores:
            figures += scale(tree, store, directory, plan.tasks, plan.restarts)
        if with_lateness and plan.far_tasks:
            figures += lateness(tree, directory, plan, lateness_store)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return Report(
        "horizon",
        f"The horizon: {plan.tasks if stores else 0:,} tasks due over a year"
        f"{', stream lateness' if with_lateness else ''}, {tree_name(tree)}",
        figures,
        params={
            "tree": tree_name(tree),
            "tasks": plan.tasks if stores else 0,
            "restarts": plan.restarts if stores else 0,
            "stores": list(stores),
            "far_tasks": plan.far_tasks if with_lateness else 0,
            "stream_s": plan.stream_s if with_lateness else 0,
            "lateness_store": lateness_store if with_lateness else None,
        },
        elapsed_s=time.perf_counter() - started,
    )


def run(quick: bool = False) -> Report:
    plan = QUICK if quick else FULL
    # quick: SQLite alone (each store costs two server starts, a second or more)
    stores = ("sqlite",) if quick else ("sqlite", "redis")
    return measure(None, stores, plan, with_lateness=not quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.horizon", description=__doc__)
    parser.add_argument("--tree", type=Path, help="a source tree with its .venv (default: here)")
    parser.add_argument("--tasks", type=int, default=FULL.tasks)
    parser.add_argument("--restarts", type=int, default=FULL.restarts)
    parser.add_argument("--store", action="append", choices=("sqlite", "redis"), default=[])
    parser.add_argument("--lateness", action="store_true", help="the stream while pulled too")
    parser.add_argument("--far-tasks", type=int, default=FULL.far_tasks)
    parser.add_argument("--stream-s", type=float, default=FULL.stream_s)
    parser.add_argument(
        "--lateness-store",
        choices=("sqlite", "redis"),
        default="sqlite",
        help="the store of the lateness run (redis: a private redis-server, AOF off)",
    )
    args = parser.parse_args(argv)
    plan = Plan(args.tasks, args.restarts, args.far_tasks, args.stream_s)
    report = measure(args.tree, args.store, plan, args.lateness, args.lateness_store)
    print(render_table(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
