"""The store record of a task: one MessagePack array per task, versioned.

``to_record`` writes the current version (``RECORD_VERSION``);
``read_record`` reads every version a server ever wrote, checking each
field, and ``from_fields`` builds the task from what it read. The id is not
in the record: the store keeps it as the record's key. Loading a million
tasks runs ``read_record`` and ``from_fields`` a million times, so both are
written for speed (see the notes at ``RECORD_VERSION``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]

from delaywheel.engine.task import DEFAULT_PRIORITY, STATES, Completion, Task


def to_record(task: Task) -> bytes:
    """The journal record: every field needed to rebuild the task but its
    id, which the store keeps as the record's key."""
    ttr_s = task.ttr_s
    # 60 packs in 1 byte, 60.0 in 9 (and a huge whole float stays a float).
    if type(ttr_s) is float and ttr_s.is_integer() and -_INT_TTR_S < ttr_s < _INT_TTR_S:
        ttr_s = int(ttr_s)
    fields = (
        V5,
        task.topic,
        STATE_CODE[task.state],
        task.at_s,
        task.created_s,
        task.attempts,
        ttr_s,
        task.max_attempts,
        task.deadline_s or 0,  # no reservation: 1 byte, not 9
        task.body_packed,
        task.target,
        task.last_error,
        task.priority,
    )
    done = task.completion
    if done is None:
        return _pack_record(fields)  # type: ignore[no-any-return]
    # v6: v5's fields and the completion's.
    return _pack_record(  # type: ignore[no-any-return]
        (
            RECORD_VERSION,
            *fields[1:],
            done.retain_s,
            done.completed_s or 0,
            done.outcome,
            done.result_packed,
        )
    )


def from_record(task_id: str, record: bytes) -> Task:
    """Rebuild task ``task_id`` from its record; raises ValueError when corrupt."""
    return from_fields(task_id, read_record(task_id, record))


def from_fields(task_id: str, fields: tuple[Any, ...]) -> Task:
    """Build task ``task_id`` from its record's fields, as ``read_record``
    checked them.

    This runs once per task at start-up (a million times for a million
    tasks), so it builds the object directly instead of through
    ``__init__``.
    """
    if len(fields) == _V6_FIELDS:
        task = from_fields(task_id, fields[:_V5_FIELDS])
        retain_s, completed_s, outcome, result_packed = fields[_V5_FIELDS:]
        task.completion = Completion(retain_s, completed_s, outcome, result_packed)
        return task
    (
        _,
        topic,
        state_code,
        at_s,
        created_s,
        attempts,
        ttr_s,
        max_attempts,
        deadline_s,
        body_packed,
        target,
        last_error,
        priority,
    ) = fields
    task = Task.__new__(Task)
    task._home = None
    task.due_s = 0.0
    task.id = task_id
    task.topic = _intern(topic)
    task.state = STATES[state_code]
    task.at_s = at_s
    task.created_s = created_s
    task.attempts = attempts
    task.ttr_s = float(ttr_s)  # an int in the record when whole
    task.max_attempts = max_attempts
    # Most tasks hold no reservation: they share one 0.0 instead of each
    # keeping its own float (a million of them after a start).
    task.deadline_s = deadline_s or 0.0
    task.body_packed = body_packed
    task.target = target
    task.last_error = last_error
    task.priority = priority
    task.completion = None
    task.seq = 0
    task.queue_seq = -1
    return task


def read_record(task_id: str, record: bytes) -> tuple[Any, ...]:
    """The fields of task ``task_id``'s record in the current layout (whichever
    version wrote it), each checked; raises ValueError when corrupt.

    Each field's type is checked so that a corrupt record is refused here
    rather than failing later inside the wheel.
    """
    try:
        fields = _unpack_record(record)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ValueError(f"unreadable record: {exc}") from exc
    if type(fields) is not tuple:
        raise ValueError(f"not a record: {fields!r:.80}")
    if len(fields) == 11 and fields[0] == 1:
        fields = _fields_of_v1(task_id, fields)
    if len(fields) == 10 and fields[0] in (2, 3):
        fields = (*fields, None, None, DEFAULT_PRIORITY)  # before v4: a queue task, no error
    elif len(fields) == 12 and fields[0] == 4:
        fields = (*fields, DEFAULT_PRIORITY)  # before v5: the default priority
    completion: tuple[Any, ...] | None = None
    if len(fields) == _V6_FIELDS and fields[0] == RECORD_VERSION:
        completion = _checked_completion(fields[_V5_FIELDS:])
        fields = fields[:_V5_FIELDS]
    try:
        (
            version,
            topic,
            state_code,
            at_s,
            created_s,
            attempts,
            ttr_s,
            max_attempts,
            deadline_s,
            body_packed,
            target,
            last_error,
            priority,
        ) = fields
    except ValueError:
        raise ValueError(f"a record of {len(fields)} fields, not 13") from None
    if version not in _READ_VERSIONS or type(state_code) is not int:
        raise ValueError(f"unknown record version {version!r} or state {state_code!r}")
    if not 0 <= state_code < len(STATE_CODE):
        raise ValueError(f"unknown state {state_code!r}")
    if not (
        type(topic) is str
        and type(at_s) is float
        and type(deadline_s) in _NUMBERS
        and type(body_packed) is bytes
        and type(attempts) is int
        and type(max_attempts) is int
        and type(ttr_s) in _NUMBERS
        and type(created_s) in _NUMBERS
        and (target is None or (type(target) is dict and type(target.get("type")) is str))
        and (last_error is None or type(last_error) is str)
        and type(priority) is int
    ):
        raise ValueError("a field has the wrong type")
    if not (_isfinite(at_s) and _isfinite(deadline_s)):
        raise ValueError(f"a time is not finite: at {at_s!r}, deadline {deadline_s!r}")
    return fields if completion is None else fields + completion


def _checked_completion(fields: tuple[Any, ...]) -> tuple[Any, ...]:
    """A v6 record's completion fields (retain, completed, outcome, result), checked."""
    retain_s, completed_s, outcome, result_packed = fields
    if not (
        (retain_s is None or (type(retain_s) in _NUMBERS and _isfinite(retain_s)))
        and type(completed_s) in _NUMBERS
        and _isfinite(completed_s)
        and (outcome is None or type(outcome) is str)
        and (result_packed is None or type(result_packed) is bytes)
    ):
        raise ValueError("a completion field has the wrong type")
    return fields


# A tuple rather than a map: a record is written on every change, and the
# field names would double its size. Bump the version when the layout changes,
# and keep reading the old one.
#   v6: as v5, then the completion: retain (nil: the topic's), completed
#       (0: not yet), outcome (nil: not yet) and the result (packed, or nil).
#       Written only for a task that has one (a retain, or completed and
#       kept): any other task is still written as v5, not 4 bytes longer.
#   v5: as v4, then the priority (3 bytes for the default 1024).
#   v4: as v3, then the target (nil: the ready queue) and the last delivery
#       error (nil: none); 2 bytes more for a queue task.
#   v3: as v2; ttr and deadline are ints when whole (a record without a
#       reservation is 16 bytes shorter: a tenth of one with a 100-byte body).
#   v2: (2, topic, state code, at, created, attempts, ttr, max_attempts,
#        deadline, body); the state code is its index in STATES.
#   v1: (1, id, topic, state name, at, ...the rest as in v2).
# Version 2 left out the id (the store's key already holds it) and names the
# state by a number: two strings fewer to decode per task, which made loading
# a million tasks about 0.4 s faster.
RECORD_VERSION = 6
V5 = 5  # the layout of a task without a completion (v6 with none)
# v2 and v3 read as v4 without its last two fields, v4 as v5 without its last.
_READ_VERSIONS = frozenset({2, 3, 4, 5, 6})
_V5_FIELDS, _V6_FIELDS = 13, 17
_INT_TTR_S = 2.0**32  # a whole ttr below this is written as an int
# One Packer for every record: a packb per record builds a Packer each time,
# which costs more than the packing (docs/performance.md, "Measurements
# behind the code"). Records are packed on the event loop's thread.
_pack_record = msgpack.Packer(use_bin_type=True).pack
STATE_CODE = {state: code for code, state in enumerate(STATES)}
# Where read_record's fields hold the topic, the state code and the due time.
TOPIC_FIELD, STATE_FIELD, AT_FIELD = 1, 2, 3
_NUMBERS = (int, float)
_intern = sys.intern
_isfinite = math.isfinite


def _unpack_record(record: bytes) -> Any:
    # raw=False (str for MessagePack strings) is msgpack 1.x's default; spelling it
    # out costs a twentieth of the call.
    return msgpack.unpackb(record, use_list=False)


def _fields_of_v1(task_id: str, fields: tuple[Any, ...]) -> tuple[Any, ...]:
    """A version 1 record's fields in the version 2 layout."""
    _, record_id, topic, state, *rest = fields
    if record_id != task_id:
        raise ValueError(f"record holds id {record_id!r}")
    code = STATE_CODE.get(state) if type(state) is str else None
    if code is None:
        raise ValueError(f"unknown state {state!r}")
    return (V5, topic, code, *rest, None, None, DEFAULT_PRIORITY)
