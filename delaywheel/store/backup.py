"""``delaywheel backup``: a consistent copy of a store, taken while the server runs.

- SQLite: Python's ``sqlite3.Connection.backup()`` in one step (``pages=-1``),
  from a read transaction, which in WAL mode never blocks the server's
  writes. The ``sqlite3`` shell's ``.backup`` copies a few pages a step and
  starts over whenever another connection commits in between, so under
  steady writes it may never finish; a single step cannot be restarted.
  The copy is then checked (``PRAGMA integrity_check``) and its tasks counted.
- Redis: the snapshot comes over the connection, as a replica gets it (what
  ``redis-cli --rdb`` does): ``SYNC``, then Redis forks a ``BGSAVE`` and
  sends the RDB file, ``$LENGTH`` and that many bytes. It works from any
  machine that can reach Redis, needs no access to Redis's directory, and is
  the whole instance (every key, not only the store's hash). Managed Redis
  services that refuse ``SYNC`` are backed up with their own snapshots.

Either way the copy is written beside FILE and renamed onto it at the end,
so a backup that fails never leaves a partial FILE.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delaywheel.store.base import StoreConfigError, StoreUnavailable, redact_url, scrub, url_secrets
from delaywheel.store.sqlite import parse_sqlite_url

# How long Redis may take to produce the snapshot before it starts sending:
# it forks and writes the RDB first, sending a newline now and then meanwhile.
REDIS_SNAPSHOT_TIMEOUT_S = 600.0
_CHUNK_BYTES = 1 << 20
RDB_MAGIC = b"REDIS"


@dataclass(frozen=True)
class Backup:
    """What was copied: ``tasks`` in the copy (Redis: in the store's hash at the end)."""

    store: str  # the URL, password hidden
    file: Path
    size_bytes: int
    tasks: int | None
    took_s: float


def backup(url: str, file: Path, *, redis_prefix: str = "delaywheel") -> Backup:
    """Copy the store at ``url`` to ``file``; raises ``StoreConfigError``, ``StoreUnavailable``."""
    scheme = url.split(":", 1)[0].lower()
    started = time.perf_counter()
    partial = file.with_name(f".{file.name}.partial")
    try:
        if scheme == "sqlite":
            tasks = _sqlite(url, partial)
        elif scheme in ("redis", "rediss"):
            tasks = _redis(url, partial, redis_prefix)
        elif scheme == "memory":
            raise StoreConfigError(
                "memory:// keeps nothing to back up: its tasks live in the server"
            )
        else:
            raise StoreConfigError(
                f"store URL {redact_url(url)!r}: backup takes sqlite:///PATH or redis://HOST:PORT/DB"
            )
        size = partial.stat().st_size
        os.replace(partial, file)
    finally:
        partial.unlink(missing_ok=True)
    return Backup(redact_url(url), file, size, tasks, time.perf_counter() - started)


def _sqlite(url: str, partial: Path) -> int:
    path, _ = parse_sqlite_url(url)
    if not path.is_file():
        raise StoreConfigError(f"store {url}: no database at {path}")
    try:
        # Read-only: the backup must never create or change the server's file.
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            target = sqlite3.connect(partial)
            try:
                source.backup(target, pages=-1)  # one step: cannot be restarted by a commit
                checked = target.execute("PRAGMA integrity_check").fetchone()[0]
                if checked != "ok":
                    raise StoreUnavailable(
                        f"store {url}: the copy fails integrity_check: {checked}"
                    )
                return int(target.execute("SELECT count(*) FROM tasks").fetchone()[0])
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"store {url}: backup failed: {exc}") from None


def _redis(url: str, partial: Path, prefix: str) -> int:
    import redis
    from redis.exceptions import AuthenticationError, RedisError

    shown, secrets = redact_url(url), url_secrets(url)
    client = redis.Redis.from_url(url, socket_connect_timeout=10, socket_timeout=30)
    try:
        connection: Any = client.connection_pool.get_connection("SYNC")
        try:
            _receive_rdb(connection, partial, shown)
        finally:
            connection.disconnect()  # the rest of the replication stream is not ours
        return int(client.hlen(f"{{{prefix}}}:tasks"))
    except AuthenticationError:
        raise StoreUnavailable(
            f"store {shown}: Redis refused the password, or needs one: put it in the URL as"
            " redis://:PASSWORD@host:port/db"
        ) from None
    except (RedisError, OSError) as exc:
        raise StoreUnavailable(
            f"store {shown}: backup failed: {scrub(str(exc), secrets) or type(exc).__name__}"
        ) from None
    finally:
        client.close()


def _receive_rdb(connection: Any, partial: Path, shown: str) -> None:
    """Send SYNC on an open, authenticated connection and write the RDB it answers with."""
    connection.send_command("SYNC")
    sock = connection._sock  # the payload is raw bytes, not RESP replies: read it ourselves
    sock.settimeout(REDIS_SNAPSHOT_TIMEOUT_S)
    buffered = b""
    while b"\r\n" not in buffered.lstrip(b"\n"):
        received = sock.recv(4096)
        if not received:
            raise StoreUnavailable(
                f"store {shown}: Redis closed the connection before the snapshot"
            )
        buffered += received
    header, _, rest = buffered.lstrip(b"\n").partition(b"\r\n")
    if not header.startswith(b"$") or not header[1:].isdigit():
        said = header.decode("utf-8", "replace")[:200]
        raise StoreUnavailable(f"store {shown}: Redis refused SYNC: {said}")
    remaining = int(header[1:])
    with partial.open("wb") as out:
        first = rest[:remaining]
        out.write(first)
        remaining -= len(first)
        magic = first
        while remaining > 0:
            chunk = sock.recv(min(remaining, _CHUNK_BYTES))
            if not chunk:
                raise StoreUnavailable(f"store {shown}: the snapshot was cut off")
            if len(magic) < len(RDB_MAGIC):
                magic += chunk
            out.write(chunk)
            remaining -= len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if not magic.startswith(RDB_MAGIC):
        raise StoreUnavailable(f"store {shown}: what Redis sent is not an RDB file")
