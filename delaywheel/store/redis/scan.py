"""Reading one hash of records with HSCAN: the store's one loader.

``scan_hash`` walks a partition's hash with HSCAN COUNT batch_size, so Redis
is never blocked for long, and re-cuts the replies into batches of exactly
batch_size (HSCAN's COUNT is a hint) but the last, dropping the duplicates
HSCAN may return if the hash is rehashed mid walk (this costs a set of the
ids seen). It asks for the next batch before handing out the current one,
so Redis scans while the caller works. A field that is not UTF-8 is no
task id: the load fails naming it, rather than loading a task under a
mangled id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import cast

from delaywheel.store.base import StoreError, unavailable
from delaywheel.store.redis.client import CLIENT_ERRORS, Client

# Loop turns a freshly started HSCAN needs to get its request onto the socket
# (redis-py takes a connection from the pool, then writes). Measured on a
# 1,000,000-task load: one turn overlapped nothing, two did; three for margin.
_TURNS_TO_SEND = 3


async def scan_hash(
    client: Client, key: str, batch_size: int, *, url: str, secrets: Sequence[str] = ()
) -> AsyncIterator[list[tuple[str, bytes]]]:
    """The ``(id, record)`` pairs of hash ``key``, each id once, in batches.

    ``url`` (shown) and ``secrets`` (hidden) name the store in errors."""

    async def scan(cursor: int) -> tuple[int, dict[bytes, bytes]]:
        try:
            cursor, reply = await client.hscan(key, cursor, count=batch_size)
        except CLIENT_ERRORS as exc:
            raise unavailable(url, f"load of {key}", exc, secrets) from exc
        # decode_responses is off: a dict of bytes field -> bytes record.
        return cursor, cast("dict[bytes, bytes]", reply)

    seen: set[str] = set()
    pending: list[tuple[str, bytes]] = []
    scanning = asyncio.ensure_future(scan(0))
    try:
        while True:
            cursor, fields = await scanning
            if cursor != 0:
                # Ask for the next batch now: Redis scans it while the
                # caller works on this one. The task must get as far as
                # sending before we hand the batch out (the caller works
                # without giving the loop a turn), hence the yields.
                scanning = asyncio.ensure_future(scan(cursor))
                for _ in range(_TURNS_TO_SEND):
                    await asyncio.sleep(0)
            # HSCAN may return a field twice (while Redis rehashes the hash).
            ids = _task_ids(url, key, fields)
            found = zip(ids, fields.values(), strict=True)
            if seen.isdisjoint(ids):  # the usual case, checked at C speed
                pending += found
            else:
                pending += [(i, r) for i, r in found if i not in seen]
            seen.update(ids)
            if len(pending) >= batch_size:
                full = len(pending) - len(pending) % batch_size
                for start in range(0, full, batch_size):
                    yield pending[start : start + batch_size]
                pending = pending[full:]
            if cursor == 0:
                break
    finally:
        if not scanning.done():
            scanning.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await scanning
    if pending:
        yield pending


def _task_ids(url: str, key: str, fields: dict[bytes, bytes]) -> list[str]:
    try:
        return list(map(bytes.decode, fields))  # UTF-8; a C-level loop
    except UnicodeDecodeError:
        bad = next(f for f in fields if not _is_utf8(f))
        raise StoreError(
            f"store {url}: hash {key} holds a field that is not a UTF-8 task id: {bad!r}"
        ) from None


def _is_utf8(field: bytes) -> bool:
    try:
        field.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
