"""Task ids a schedule owns, and the partition rule: written once for the server and every client.

A schedule's occurrence has the id ``s:{X}:{seconds}``: ``X`` the schedule's
id, ``{seconds}`` its nominal time in UTC epoch seconds, ASCII digits with
``.`` and up to three more for a fractional ``every`` (``occurrence_id``;
``parse_occurrence`` reads one back). The schedule's own record is stored
under ``s:{X}:00`` (``record_key``), a form no occurrence takes, since
``occurrence_id`` writes the epoch as ``0``. ``s:`` ids are the schedules'
namespace. A topic's settings are stored under ``s:{topic}:000``
(``settings_key``), another form no occurrence takes, so they live in the
partition ``{topic}`` hashes to.

A task's partition is ``zlib.crc32(key as UTF-8) % partitions``, where the key
is the whole id, except for an id of the occurrence form ``s:{X}:{digits}``
(``{digits}`` ASCII digits, optionally ``.`` and more digits, any number of
each): it hashes ``X``, as a Redis hash tag does. So a schedule, its record
and all its occurrences share one partition, and firing an occurrence is one
fenced write. ``X`` runs to the last ``:``: ``s:a:b:123`` hashes ``a:b``;
``s:x:`` and ``s:x:12a`` hash the whole id. The partition rule is the
contract (clients in other languages route by it), so it takes the form more
loosely than ``parse_occurrence``, which also wants ``X`` not empty and a
time a calendar can show.

This module imports nothing but zlib, so the server uses it as it is.
"""

from __future__ import annotations

import zlib

OCCURRENCE_PREFIX = "s:"
RECORD_SUFFIX = ":00"
SETTINGS_SUFFIX = ":000"
# The longest nominal time an occurrence id may name, 9998-12-31T23:59:59.999Z:
# near year 9999 a datetime in a zone east of UTC overflows, so an id naming a
# later time (a caller's own "s:x:99999999999") is no occurrence.
MAX_NOMINAL_MS = 253_370_764_799_999
_MAX_SECONDS_DIGITS = 12
_MAX_FRACTION_DIGITS = 3


def occurrence_id(schedule_id: str, nominal_ms: int) -> str:
    """``s:{schedule_id}:{nominal UTC epoch seconds}``: the nominal time, not the
    firing time, so a fold's two 01:30s and a late run keep distinct, stable ids."""
    seconds, millis = divmod(nominal_ms, 1000)
    stamp = str(seconds) if millis == 0 else f"{seconds}.{millis:03d}".rstrip("0")
    return f"{OCCURRENCE_PREFIX}{schedule_id}:{stamp}"


def _is_digits(text: str) -> bool:
    # str.isdigit alone takes "²" and "٣" too.
    return text.isascii() and text.isdigit()


def _split(task_id: str) -> tuple[str, str, str] | None:
    """``(X, seconds, fraction)`` of an id of the form ``s:{X}:{digits}[.{digits}]``
    (``fraction`` empty when there is none), or None for any other id."""
    if not task_id.startswith(OCCURRENCE_PREFIX):
        return None
    head, colon, stamp = task_id[2:].rpartition(":")
    if not colon:
        return None
    seconds, dot, fraction = stamp.partition(".")
    if not _is_digits(seconds) or (dot and not _is_digits(fraction)):
        return None
    return head, seconds, fraction


def parse_occurrence(task_id: str) -> tuple[str, int] | None:
    """``(schedule_id, nominal_ms)`` of an occurrence's id, or None for any other id
    (a record key ``s:{X}:00`` reads as ``(X, 0)``: tell it apart with ``is_record_key``)."""
    found = _split(task_id)
    if found is None:
        return None
    schedule_id, seconds, fraction = found
    if (
        not schedule_id
        or len(seconds) > _MAX_SECONDS_DIGITS
        or len(fraction) > _MAX_FRACTION_DIGITS
    ):
        return None
    nominal_ms = int(seconds) * 1000 + int(fraction.ljust(3, "0"))
    if nominal_ms > MAX_NOMINAL_MS:
        return None
    return schedule_id, nominal_ms


def record_key(schedule_id: str) -> str:
    """The store key of a schedule's record (in its id's partition)."""
    return f"{OCCURRENCE_PREFIX}{schedule_id}{RECORD_SUFFIX}"


def is_record_key(key: str) -> bool:
    """Whether ``key`` is ``record_key`` of some schedule id."""
    return key.startswith(OCCURRENCE_PREFIX) and key.endswith(RECORD_SUFFIX) and len(key) > 5


def settings_key(topic: str) -> str:
    """The store key of a topic's settings (in the partition its name hashes to)."""
    return f"{OCCURRENCE_PREFIX}{topic}{SETTINGS_SUFFIX}"


def is_settings_key(key: str) -> bool:
    """Whether ``key`` is ``settings_key`` of some topic."""
    return key.startswith(OCCURRENCE_PREFIX) and key.endswith(SETTINGS_SUFFIX) and len(key) > 6


def topic_of_settings_key(key: str) -> str:
    """The topic whose ``settings_key`` ``key`` is."""
    return key[len(OCCURRENCE_PREFIX) : -len(SETTINGS_SUFFIX)]


def partition_key(task_id: str) -> str:
    """What the partition of ``task_id`` is hashed from: the id, or a
    schedule's id for its record and its occurrences."""
    if task_id.startswith(OCCURRENCE_PREFIX):  # the only cost to any other id
        found = _split(task_id)
        if found is not None:
            return found[0]
    return task_id


def partition_of(task_id: str, partitions: int) -> int:
    """The partition of ``task_id`` in a keyspace of ``partitions`` (the contract)."""
    return zlib.crc32(partition_key(task_id).encode("utf-8")) % partitions
