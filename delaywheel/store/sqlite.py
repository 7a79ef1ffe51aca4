"""sqlite:///path -- the embedded store for one machine without Redis (stdlib sqlite3).

URL: ``sqlite:///delaywheel.db`` is relative to the working directory at the
time the store is constructed, ``sqlite:////var/lib/delaywheel.db`` absolute
(the SQLAlchemy convention: the path is what follows the third slash). The
path is taken as written, not percent-decoded. The only query parameter is
``synchronous``:

- ``synchronous=full`` (the default): every write is a transaction committed
  to the write-ahead log and fsynced before ``write()`` returns, so an
  acknowledged write survives a process crash, an OS crash and a power cut
  (given a disk that does not lie about fsync).
- ``synchronous=normal``: the WAL is fsynced only at checkpoints. An
  acknowledged write survives a crash of the server process, but an OS crash
  or power cut may lose the last transactions (the database stays
  consistent). Faster; ``warnings()`` reports it.
- ``synchronous=extra``: as full, and also fsyncs the directory; for file
  systems where that matters.

How it works: one table ``tasks(id TEXT PRIMARY KEY, record BLOB NOT NULL)
WITHOUT ROWID``, WAL journal mode, one ``BEGIN IMMEDIATE .. COMMIT`` per
``write()`` (executemany for the puts, executemany for the removes), so a
write is all or nothing. A sqlite3 connection belongs to the thread that made
it, so every blocking call runs on one dedicated worker thread (a single-
thread executor) and the event loop never blocks; because that thread runs
jobs in submission order, writes apply in call order and ``close()`` runs
after any write already submitted. A write's completion comes back to the loop
with ``call_soon_threadsafe``, straight to its callback: no coroutine per
write. ``load()`` is one SELECT read with ``fetchmany`` (a consistent
snapshot), a batch per round on the worker thread.

The far tier (``Tiers``, base.py): a table ``far(id, due, record)`` with an
index on ``(due, id)``, and ``far_counts(topic, n)``, both written in the
same transaction as the tasks they go with; ``load()`` reads only the
``tasks`` table. A file written before the far tier existed gets the two
tables at open (``CREATE TABLE IF NOT EXISTS``); the engine moves its far
tasks there at its first start (docs/operations.md, "Upgrading").
The far tier's reads (``far_range``, ``far_get``) run on a second
connection and thread of their own: a pull reads tens of thousands of
records while the server runs, and on the writer's thread each read of a
batch held up the journal's writes queued behind it (a near add's write
waited 30 ms at the median during a pull of 500,000 far tasks, against
1.6 ms otherwise). WAL lets that connection read while the writer writes;
it sees the last committed write, which is all the engine asks of a far
read (engine/horizon.py: memory lets go of a far task only once its write
is durable).

Assumes one server per database file: two servers on one file would both
write, and the engine would not know of the other's tasks.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from delaywheel.store.base import (
    DEFAULT_BATCH_SIZE,
    Changes,
    Done,
    FarRecord,
    Store,
    StoreConfigError,
    StoreUnavailable,
    Tiers,
    check_batch_size,
    unavailable,
)

T = TypeVar("T")

SYNCHRONOUS_LEVELS = ("full", "normal", "extra")
# How long a write waits for a lock held by another connection (a backup
# tool, a curious operator) before failing with StoreUnavailable.
DEFAULT_BUSY_TIMEOUT_S = 5.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, record BLOB NOT NULL) WITHOUT ROWID"
)
_FAR_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS far"
    " (id TEXT PRIMARY KEY, due REAL NOT NULL, record BLOB NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS far_by_due ON far (due, id)",
    "CREATE TABLE IF NOT EXISTS far_counts (topic TEXT PRIMARY KEY, n INTEGER NOT NULL)"
    " WITHOUT ROWID",
)
_PUT = "INSERT OR REPLACE INTO tasks (id, record) VALUES (?, ?)"
_REMOVE = "DELETE FROM tasks WHERE id = ?"
_FAR_PUT = "INSERT OR REPLACE INTO far (id, due, record) VALUES (?, ?, ?)"
_FAR_REMOVE = "DELETE FROM far WHERE id = ?"
_COUNT = (
    "INSERT INTO far_counts (topic, n) VALUES (?, ?)"
    " ON CONFLICT (topic) DO UPDATE SET n = n + excluded.n"
)


def parse_sqlite_url(url: str) -> tuple[Path, str]:
    """The database path and synchronous level of a ``sqlite:///`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or not parts.path.startswith("/"):
        raise StoreConfigError(
            f"store URL {url!r}: expected sqlite:///relative/path or sqlite:////absolute/path"
        )
    path = parts.path[1:]
    if not path or path.endswith("/"):
        raise StoreConfigError(f"store URL {url!r}: no database file name after sqlite:///")
    if parts.fragment:
        raise StoreConfigError(f"store URL {url!r}: unexpected #fragment")
    try:
        params = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise StoreConfigError(f"store URL {url!r}: bad query string: {exc}") from None
    unknown = sorted(set(params) - {"synchronous"})
    if unknown:
        raise StoreConfigError(
            f"store URL {url!r}: unknown parameter {', '.join(unknown)} (known: synchronous)"
        )
    values = params.get("synchronous", ["full"])
    synchronous = values[-1].lower()
    if len(values) > 1 or synchronous not in SYNCHRONOUS_LEVELS:
        raise StoreConfigError(
            f"store URL {url!r}: synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}"
        )
    return Path(path).absolute(), synchronous


class SqliteStore(Store):
    tiered = True

    def __init__(self, url: str, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        super().__init__(url)  # a sqlite URL carries no password
        self.path, self.synchronous = parse_sqlite_url(url)
        self._busy_timeout_s = busy_timeout_s
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread
        # The far tier's reads: their own thread and connection (module docstring).
        self._reader: ThreadPoolExecutor | None = None
        self._read_conn: sqlite3.Connection | None = None  # touched only on the reader thread
        self._warnings: list[str] = []
        self._lock_file: int | None = None  # the descriptor holding the one-node lock

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        """Run ``func(*args)`` on the worker thread."""
        if self._executor is None:
            raise StoreUnavailable(f"store {self.url}: the store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, func, *args)

    async def open(self) -> None:
        self._start_open()
        self._check_the_directory()
        self._hold_the_file()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delaywheel-sqlite")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delaywheel-sqlite-far")
        try:
            journal_mode = await self._run(self._open_sync)
        except (sqlite3.Error, OSError) as exc:
            self._shutdown()
            self._let_go_of_the_file()
            raise unavailable(self.url, "open", exc) from exc
        self._warnings = []
        if journal_mode != "wal":
            self._warnings.append(
                f"the file system refused WAL mode (journal_mode={journal_mode});"
                " writes stay durable but are slower"
            )
        if self.synchronous == "normal":
            self._warnings.append(
                "synchronous=normal: an OS crash or power cut may lose the"
                " last acknowledged writes (a crash of the server alone loses none)"
            )
        self._state = "open"

    def _open_sync(self) -> str:
        # isolation_level=None: no implicit transactions; write() opens its own.
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
        try:
            journal_mode = str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
            conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            conn.execute(_SCHEMA)
            for statement in _FAR_SCHEMA:
                conn.execute(statement)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return journal_mode

    async def load(
        self, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        check_batch_size(batch_size)
        self._check_open("load")
        try:
            cursor = await self._run(self._select_sync)
        except sqlite3.Error as exc:
            raise unavailable(self.url, "load", exc) from exc
        # No prefetch of the next batch while the caller works on this one:
        # building rows needs the GIL the caller holds, and a fresh server
        # loading 1,000,000 tasks measured no gain from it.
        try:
            while True:
                try:
                    rows: list[tuple[str, bytes]] = await self._run(cursor.fetchmany, batch_size)
                except sqlite3.Error as exc:
                    raise unavailable(self.url, "load", exc) from exc
                if not rows:
                    break
                yield rows
        finally:
            if self._executor is not None:
                await self._run(cursor.close)

    def _select_sync(self) -> sqlite3.Cursor:
        assert self._conn is not None
        return self._conn.execute("SELECT id, record FROM tasks")

    def submit(self, changes: Changes, done: Done, tiers: Tiers | None = None) -> None:
        error = self._not_open("write")
        executor = self._executor
        if error is None and executor is None:
            error = StoreUnavailable(f"store {self.url}: the store is closed")
        if error is not None:
            done(error)
            return
        assert executor is not None
        if not changes:
            done(None)
            return
        # Split on the loop thread: the caller's mapping is never read from
        # another thread. The executor runs jobs in submission order.
        loop = asyncio.get_running_loop()
        if tiers:
            job = executor.submit(self._write_tiered_sync, dict(changes), tiers)
        else:
            puts = [(task_id, record) for task_id, record in changes.items() if record is not None]
            removes = [(task_id,) for task_id, record in changes.items() if record is None]
            job = executor.submit(self._write_sync, puts, removes)

        def finished(job: Future[None]) -> None:  # on the worker thread
            loop.call_soon_threadsafe(self._finish, job, done)

        job.add_done_callback(finished)

    def _finish(self, job: Future[None], done: Done) -> None:
        # sqlite3.Error or OSError as a rule; anything else is a bug, but it
        # still fails the write rather than leave its replies waiting forever.
        exc = job.exception()
        done(None if exc is None else unavailable(self.url, "write", exc))

    def _write_sync(self, puts: list[tuple[str, bytes]], removes: list[tuple[str]]) -> None:
        conn = self._conn
        if conn is None:  # closed while this write waited in the queue
            raise sqlite3.OperationalError("the store was closed")
        conn.execute("BEGIN IMMEDIATE")
        try:
            if puts:
                conn.executemany(_PUT, puts)
            if removes:
                conn.executemany(_REMOVE, removes)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _write_tiered_sync(self, changes: dict[str, bytes | None], tiers: Tiers) -> None:
        """A write with far-tier changes (``Tiers``), in one transaction: the
        checks of blind puts read inside it, so nothing slips in between."""
        conn = self._conn
        if conn is None:
            raise sqlite3.OperationalError("the store was closed")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conflicts: set[str] = set()
            for task_id in tiers.blind:
                if (
                    conn.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone()
                    or conn.execute("SELECT 1 FROM far WHERE id = ?", (task_id,)).fetchone()
                ):
                    conflicts.add(task_id)
            refused = tiers.refused(conflicts)
            left: dict[str, int] = {}
            for task_id, topic in tiers.was_far.items():
                if task_id not in refused and conn.execute(_FAR_REMOVE, (task_id,)).rowcount:
                    left[topic] = left.get(topic, 0) - 1
            puts, removes, far_puts = [], [], []
            for task_id, record in changes.items():
                if task_id in refused:
                    continue
                if record is None:
                    removes.append((task_id,))
                    continue
                to_far = tiers.far.get(task_id)
                if to_far is None:
                    puts.append((task_id, record))
                else:
                    removes.append((task_id,))
                    far_puts.append((task_id, to_far[0], record))
                    left[to_far[1]] = left.get(to_far[1], 0) + 1
            if puts:
                conn.executemany(_PUT, puts)
            if removes:
                conn.executemany(_REMOVE, removes)
            if far_puts:
                conn.executemany(_FAR_PUT, far_puts)
            if left:
                conn.executemany(_COUNT, [item for item in left.items() if item[1]])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        tiers.conflicts.update(conflicts)  # only once committed

    async def far_range(
        self, lane: int, after: tuple[float, str] | None, before_s: float | None, limit: int
    ) -> list[FarRecord]:
        self._check_open("far_range")
        where, args = [], []
        if after is not None:
            # A row value walks the (due, id) index from ``after``; the same test
            # spelt with OR made SQLite merge two searches and sort what was left
            # (a pull of 25,000 from 500,000 far tasks: 0.495 s against 0.067 s).
            where.append("(due, id) > (?, ?)")
            args += [after[0], after[1]]
        if before_s is not None:
            where.append("due < ?")
            args.append(before_s)
        query = "SELECT id, due, record FROM far"
        if where:
            query += " WHERE " + " AND ".join(where)
        query += " ORDER BY due, id LIMIT ?"
        args.append(limit)
        return await self._read_far(query, args)

    async def far_get(self, task_ids: Sequence[str]) -> dict[str, tuple[float, bytes]]:
        self._check_open("far_get")
        found: dict[str, tuple[float, bytes]] = {}
        ids = list(task_ids)
        for start in range(0, len(ids), 500):  # SQLite's limit on ? in one statement
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = await self._read_far(
                f"SELECT id, due, record FROM far WHERE id IN ({marks})", chunk
            )
            found.update((task_id, (due, record)) for task_id, due, record in rows)
        return found

    async def far_counts(self, lane: int) -> dict[str, int]:
        self._check_open("far_counts")
        rows = await self._read("SELECT topic, n FROM far_counts WHERE n > 0", [])
        return dict(rows)

    async def _read(self, query: str, args: Sequence[Any]) -> list[Any]:
        def read() -> list[Any]:
            if self._conn is None:
                raise sqlite3.OperationalError("the store was closed")
            return self._conn.execute(query, args).fetchall()

        try:
            return await self._run(read)
        except sqlite3.Error as exc:
            raise unavailable(self.url, "read", exc) from exc

    async def _read_far(self, query: str, args: Sequence[Any]) -> list[Any]:
        """A read of the far tier, on the reader's thread and connection."""
        reader = self._reader
        if reader is None:
            raise StoreUnavailable(f"store {self.url}: the store is closed")

        def read() -> list[Any]:
            conn = self._read_conn
            if conn is None:  # the first far read: made on this thread, used only here
                conn = sqlite3.connect(
                    self.path, timeout=self._busy_timeout_s, isolation_level=None
                )
                conn.execute("PRAGMA query_only=1")
                self._read_conn = conn
            return conn.execute(query, args).fetchall()

        try:
            return await asyncio.get_running_loop().run_in_executor(reader, read)
        except sqlite3.Error as exc:
            raise unavailable(self.url, "read", exc) from exc

    async def read_pragma(self, name: str) -> Any:
        """The value of ``PRAGMA name`` on the store's own connection (for
        diagnostics and tests: ``synchronous`` is per connection)."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a pragma name: {name!r}")
        self._check_open("read_pragma")

        def read() -> Any:
            assert self._conn is not None
            return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

        return await self._run(read)

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        if self._executor is not None:
            try:
                if self._reader is not None:
                    await asyncio.get_running_loop().run_in_executor(
                        self._reader, self._close_reader_sync
                    )
                # Queued behind any write already submitted, so that finishes first.
                await self._run(self._close_sync)
            except sqlite3.Error:
                pass  # closing cannot lose a committed write; nothing to report
            finally:
                self._shutdown()
                self._let_go_of_the_file()

    def _check_the_directory(self) -> None:
        """A missing directory is most often an absolute path written with three
        slashes (``sqlite:///tmp/x.db`` is ``./tmp/x.db``): say so, instead of
        the lock file's FileNotFoundError."""
        directory = self.path.parent
        if directory.is_dir():
            return
        message = f"store {self.url}: the directory {directory} does not exist"
        written = urlsplit(self.url).path[1:]
        if not written.startswith("/"):
            message += (
                f"; sqlite:///{written} is relative to the working directory ({Path.cwd()}),"
                f" an absolute path takes four slashes: sqlite:////{written}"
            )
        raise StoreUnavailable(message)

    def _hold_the_file(self) -> None:
        """One server per SQLite file: an exclusive flock on ``<file>.lock`` for the
        store's life. Two servers on one file would both fire every task. The
        kernel drops the lock when the process ends, kill -9 included, so a
        crash never leaves it stale; the pid written in it names the holder."""
        lock_path = f"{self.path}.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise unavailable(self.url, "open", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreUnavailable(
                f"store {self.url}: the file {self.path} is in use by another delaywheel"
                f" server (pid {holder}, holding {lock_path}): a SQLite store serves one"
                " server; stop that one, or give this one another file"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_file = fd

    def _let_go_of_the_file(self) -> None:
        fd, self._lock_file = self._lock_file, None
        if fd is not None:
            os.close(fd)  # drops the flock

    def _close_sync(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _close_reader_sync(self) -> None:
        conn, self._read_conn = self._read_conn, None
        if conn is not None:
            conn.close()

    def _shutdown(self) -> None:
        for executor in (self._executor, self._reader):
            if executor is not None:
                # Its queue is empty by now, so the thread ends at once; no need
                # to block the loop joining it.
                executor.shutdown(wait=False)
        self._executor = self._reader = None

    def warnings(self) -> list[str]:
        return list(self._warnings)
