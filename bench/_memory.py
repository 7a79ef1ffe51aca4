"""The compare section's memory per pending task (``bench/compare.py`` has the method)."""

from __future__ import annotations

from pathlib import Path

from bench import Figure, Target, progress
from bench._beanstalk import private_beanstalkd
from bench._loads import (
    BODY,
    DAY_S,
    TOPIC,
    Address,
    bs_client,
    dw_client,
    rss_bytes,
)
from bench._procs import server_process
from bench._section import Section, add_tasks, pinned, put_jobs, ratio_figure

# -- memory per pending task ------------------------------------------------------------


def settled_rss(pid: int, address: Address) -> int:
    """The RSS of a server that has answered a call (so it has finished starting)."""
    with dw_client(address) as client:
        client.ping()
    return rss_bytes(pid)


# A horizon beyond the tasks' day: every task held in memory.
HELD = ("--horizon", "2d")


def memory(section: Section, directory: Path, beanstalkd: bool) -> None:
    """Bytes per pending task held in the server: just added, loaded by a fresh
    server, beanstalkd. The servers run with a horizon beyond the tasks' day
    (``HELD``), so that every task is in memory, as beanstalkd holds its jobs;
    with the default horizon a task due in a day is kept in the store alone
    (docs/performance.md, "The horizon at 10 million tasks")."""
    count = section.plan.memory_tasks
    progress(f"memory: {count:,} tasks due in a day, memory store")
    added = added_per_task("memory://", count)
    progress(f"memory: {count:,} tasks added on SQLite, then loaded by a fresh server")
    loaded_url = f"sqlite:///{directory / 'loaded.db'}"
    added_sqlite = added_per_task(loaded_url, count)
    loaded = loaded_per_task(loaded_url, f"sqlite:///{directory / 'empty.db'}", count)
    section.figures += _our_figures(added, added_sqlite, loaded)
    if not beanstalkd:
        return
    progress(f"memory: {count:,} beanstalkd jobs with delay {DAY_S:,}")
    theirs = beanstalkd_per_job(count)
    section.figures += _beside_beanstalkd(added, added_sqlite, loaded, theirs)


def added_per_task(url: str, count: int) -> float:
    """The RSS growth per task of a server on ``url`` over adding ``count`` tasks."""
    with server_process(url, args=HELD) as (pid, address):
        before = settled_rss(pid, address)
        with pinned([pid]):  # only for speed: the RSS does not depend on it
            add_tasks(address, count, TOPIC, DAY_S)
        return (rss_bytes(pid) - before) / count


def loaded_per_task(loaded_url: str, empty_url: str, count: int) -> float:
    """The RSS per task of a fresh server on ``loaded_url`` (``count`` tasks),
    less that of one on an empty store."""
    with server_process(loaded_url, args=HELD) as (pid, address):
        loaded_rss = settled_rss(pid, address)
    with server_process(empty_url, args=HELD) as (pid, address):
        empty_rss = settled_rss(pid, address)
    return (loaded_rss - empty_rss) / count


def beanstalkd_per_job(count: int) -> float:
    """beanstalkd's RSS growth per job over putting ``count`` jobs due in a day."""
    with private_beanstalkd() as (pid, address):
        with bs_client(address) as client:
            client.put(BODY)  # the connection's buffers, before the baseline
        before = rss_bytes(pid)
        with pinned([pid]):
            put_jobs(address, count, TOPIC, DAY_S)
        return (rss_bytes(pid) - before) / count


def _our_figures(added: float, added_sqlite: float, loaded: float) -> list[Figure]:
    return [
        Figure(
            "memory_added_bytes",
            "memory per task, added",
            added,
            "B/task",
            note="memory store, RSS growth over add_many; holds the records in a dict too",
        ),
        Figure(
            "memory_added_sqlite_bytes",
            "memory per task, added on SQLite",
            added_sqlite,
            "B/task",
            note="the records are in the file: the server's own memory for its tasks",
        ),
        Figure(
            "memory_loaded_bytes",
            "memory per task, loaded",
            loaded,
            "B/task",
            note="fresh server on the SQLite file, less one on an empty file",
        ),
    ]


def _beside_beanstalkd(
    added: float, added_sqlite: float, loaded: float, theirs: float
) -> list[Figure]:
    """beanstalkd's figure, and ours over it (each at most 1 is the target)."""
    return [
        Figure("bs_memory_bytes", "beanstalkd memory per job", theirs, "B/job"),
        ratio_figure(
            "memory_added_vs_bs",
            "  added / beanstalkd",
            added,
            theirs,
            Target("<=", 1.0),
            "bytes per pending task",
        ),
        ratio_figure(
            "memory_added_sqlite_vs_bs",
            "  added on SQLite / beanstalkd",
            added_sqlite,
            theirs,
            Target("<=", 1.0),
            "bytes per pending task",
        ),
        ratio_figure(
            "memory_loaded_vs_bs",
            "  loaded / beanstalkd",
            loaded,
            theirs,
            Target("<=", 1.0),
            "bytes per pending task",
        ),
    ]
