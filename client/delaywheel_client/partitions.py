"""The partition rule, written once for the server and every client.

A task's partition is ``zlib.crc32(key as UTF-8) % partitions``, where the key
is the whole id, except for an occurrence of a schedule: an id of the form
``s:{X}:{digits}`` (``{digits}`` ASCII digits, optionally ``.`` and more
digits, as a fractional ``every`` gives) hashes ``X``, the schedule's id, as a
Redis hash tag does. So a schedule and all its occurrences share one
partition, and firing an occurrence is one fenced write. ``X`` runs to the
last ``:``: ``s:a:b:123`` hashes ``a:b``; ``s:x:`` and ``s:x:12a`` hash
the whole id.

This module imports nothing but zlib and re, so the server uses it as it is.
"""

from __future__ import annotations

import re
import zlib

_OCCURRENCE = re.compile(r"s:(.*):[0-9]+(?:\.[0-9]+)?", re.DOTALL)


def partition_key(task_id: str) -> str:
    """What the partition of ``task_id`` is hashed from: the id, or a
    schedule's id for one of its occurrences."""
    if task_id.startswith("s:"):
        found = _OCCURRENCE.fullmatch(task_id)
        if found is not None:
            return found.group(1)
    return task_id


def partition_of(task_id: str, partitions: int) -> int:
    """The partition of ``task_id`` in a keyspace of ``partitions`` (the contract)."""
    return zlib.crc32(partition_key(task_id).encode("utf-8")) % partitions
