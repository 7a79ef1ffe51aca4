"""Topic settings: pause, rate, burst, concurrency, retain, dead_retain and a note, kept durable.

A topic has settings only once ``topic_set`` gave it some: the others have
the defaults (``DEFAULTS``) and no record. A topic's record is stored under
``settings_key(topic)`` (``s:{topic}:000``, in the partition its name hashes
to, as a schedule's record is in its id's), journaled with ``record_other``
as a schedule's is, loaded by ``split`` from the store's records at a start
or a takeover, and dropped with its partition. Settings all back to their
defaults delete the record.

What the settings hold back is ``delaywheel.engine.flow``'s.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import msgpack  # type: ignore[import-untyped, unused-ignore]
from delaywheel_client.partitions import is_settings_key, settings_key, topic_of_settings_key

from delaywheel.checks import bad, known_fields, number, show
from delaywheel.engine import validate
from delaywheel.engine.journal import Journal

log = logging.getLogger("delaywheel.engine")

# A pause without an end: the last second of the year 9999 (a number JSON
# and every client can carry, where infinity is not).
PAUSED_FOR_EVER_S = 253_402_300_799.0
MAX_NOTE_CHARS = 1000
MAX_COUNT = 2**31 - 1  # burst and concurrency: what every client and store carries
# A rate's bucket when no burst is given holds what the rate gives in this
# long, at least one task. One is not enough for a fast rate: the bucket
# could not bank the fraction of a millisecond by which each timer wake comes
# after its token, and a topic limited to 500 a second got 436 (the sink's
# count, 2026-12-06). Two already bank it; 20 ms of the rate keeps a slow
# rate's first tasks one at a time (1 up to 50 a second) and smooths a fast one.
AUTO_BURST_S = 0.02
MAX_RETAIN_S = validate.DEFAULT_MAX_DELAY_S
RECORD_KIND = "topic"
# Version 2 added dead_retain; a version 1 record (8 fields) reads with it nil.
RECORD_VERSION = 2
RECORD_FIELDS = (
    "paused_until", "rate", "burst", "concurrency", "retain", "dead_retain", "note",
)  # fmt: skip
LIST_FIELDS = frozenset({"paused", "limit", "cursor"})


@dataclass(frozen=True, slots=True)
class TopicSettings:
    paused_until: float | None = None  # Unix s; None: not paused
    rate: float | None = None  # tasks a second handed out; None: no limit
    burst: int | None = None  # how many may go at once after a quiet time; None: ``bucket``
    concurrency: int | None = None  # reserved or delivering at once; None: no limit
    retain: float = 0.0  # seconds a completed task is kept
    dead_retain: float | None = None  # seconds a dead task is kept; None: --dead-retention
    note: str = ""

    def paused(self, now_s: float) -> bool:
        return self.paused_until is not None and now_s < self.paused_until

    @property
    def bucket(self) -> int:
        """The burst in force: the one given, else ``AUTO_BURST_S`` of the rate, at least 1."""
        if self.burst is not None:
            return self.burst
        if self.rate is None:
            return 1
        return min(MAX_COUNT, max(1, math.ceil(self.rate * AUTO_BURST_S)))

    def limits(self) -> bool:
        """Whether these settings hold anything back, ever (a pause or a limit)."""
        return self.paused_until is not None or self.rate is not None or bool(self.concurrency)

    def to_map(self, topic: str, now_s: float) -> dict[str, Any]:
        shown: dict[str, Any] = {"topic": topic, "paused": self.paused(now_s)}
        shown.update((f.name, getattr(self, f.name)) for f in fields(self))
        shown["burst"] = self.bucket  # a burst not given: the one the rate makes
        return shown


DEFAULTS = TopicSettings()
# A topic, what this node applied to it before a change and what it applies after.
Changed = Callable[[str, TopicSettings, TopicSettings], None]
FIELDS = frozenset(f.name for f in fields(TopicSettings))


def check_changes(value: Any) -> dict[str, Any]:
    """The settings a ``topic_set`` changes, each checked; nil puts a field
    back to its default."""
    given = known_fields("settings", value, FIELDS)
    changes: dict[str, Any] = {}
    for name, field_value in given.items():
        if field_value is None:
            changes[name] = getattr(DEFAULTS, name)
        elif name == "paused_until":
            changes[name] = number(name, field_value, low=-math.inf, high=PAUSED_FOR_EVER_S)
        elif name == "rate":
            if type(field_value) not in (int, float) or not 0 < field_value < math.inf:
                raise bad(f"rate must be a number > 0 (tasks a second), got {show(field_value)}")
            changes[name] = float(field_value)
        elif name in ("burst", "concurrency"):
            if type(field_value) is not int or not 1 <= field_value <= MAX_COUNT:
                raise bad(f"{name} must be an int from 1 to {MAX_COUNT}, got {show(field_value)}")
            changes[name] = field_value
        elif name in ("retain", "dead_retain"):
            changes[name] = number(name, field_value, high=MAX_RETAIN_S)
        else:  # note
            if (
                type(field_value) is not str
                or len(field_value) > MAX_NOTE_CHARS
                or not _utf8(field_value)
            ):
                raise bad(f"note must be a str of at most {MAX_NOTE_CHARS} characters "
                          "(UTF-8: no lone surrogate), "
                          f"got {show(field_value)}")  # fmt: skip
            changes[name] = field_value
    return changes


def _utf8(text: str) -> bool:
    """Whether ``text`` can be stored: a lone surrogate (JSON's ``"\\ud974"``) cannot."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def to_record(settings: TopicSettings) -> bytes:
    fields_kept = (getattr(settings, name) for name in RECORD_FIELDS)
    return msgpack.packb((RECORD_KIND, RECORD_VERSION, *fields_kept), use_bin_type=True)  # type: ignore[no-any-return]


def read_record(record: bytes) -> TopicSettings:
    """A topic's settings from their record; ValueError when it is corrupt."""
    try:
        fields_read = msgpack.unpackb(record, raw=False)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ValueError(f"unreadable record: {exc}") from exc
    if type(fields_read) is not list or len(fields_read) < 2 or fields_read[0] != RECORD_KIND:
        raise ValueError(f"not a topic's settings: {fields_read!r:.80}")
    version = fields_read[1]
    names = [name for name in RECORD_FIELDS if version == RECORD_VERSION or name != "dead_retain"]
    if version not in (1, RECORD_VERSION):
        raise ValueError(f"unknown version {version!r}")
    if len(fields_read) != 2 + len(names):
        raise ValueError(f"not a topic's settings: {fields_read!r:.80}")
    try:
        changes = check_changes(dict(zip(names, fields_read[2:], strict=True)))
    except Exception as exc:
        raise ValueError(str(exc)) from None
    return replace(DEFAULTS, **changes)


class TopicTable:
    """Every topic's settings this node holds (those of the partitions it serves),
    and those it learned from the nodes that hold the others (``learn``)."""

    def __init__(
        self,
        journal: Journal,
        check_served: Callable[[str], None],
        changed: Changed,
    ) -> None:
        self._journal = journal
        self._check_served = check_served  # raises moved/tryagain for another node's key
        self.settings: dict[str, TopicSettings] = {}
        # On several nodes, the settings of topics whose record another node
        # holds, as it published them (ha/topics.py), and their records as read.
        self.elsewhere: dict[str, TopicSettings] = {}
        self._elsewhere_records: dict[str, bytes] = {}
        # What this node applies: its own, else learned; a topic of the
        # defaults is not in it (an ack looks here, and most miss).
        self.applied: dict[str, TopicSettings] = {}
        # Called with a topic and its settings before and after, each time what
        # this node applies to the topic changes (flow control's, dead tasks').
        self._changed = changed

    def of(self, topic: str) -> TopicSettings:
        """The settings this node applies to ``topic``: its own, else learned."""
        return self.applied.get(topic, DEFAULTS)

    def _apply(self, topic: str) -> None:
        """``topic``'s applied settings anew, from the held and the learned;
        the change, if any, to ``changed``."""
        before = self.applied.get(topic, DEFAULTS)
        after = self.settings.get(topic) or self.elsewhere.get(topic) or DEFAULTS
        if after == DEFAULTS:
            self.applied.pop(topic, None)
        else:
            self.applied[topic] = after
        if after != before:
            self._changed(topic, before, after)

    # -- the verbs ---------------------------------------------------------------

    # get and set are served by the node that holds the record: its own are the truth.

    def get(self, topic: Any, now_s: float) -> dict[str, Any]:
        name = self._checked(topic)
        return self.settings.get(name, DEFAULTS).to_map(name, now_s)

    def set(self, topic: Any, changes: Any, now_s: float) -> dict[str, Any]:
        name = self._checked(topic)
        before = self.settings.get(name)
        after = replace(before or DEFAULTS, **check_changes(changes))
        self._keep(name, after)
        record = None if after == DEFAULTS else to_record(after)
        self._journal.record_other(settings_key(name), record, lambda: self._keep(name, before))
        return after.to_map(name, now_s)

    def page(self, query: Any, now_s: float) -> dict[str, Any]:
        fields_given = known_fields("query", {} if query is None else query, LIST_FIELDS)
        paused = fields_given.get("paused")
        if paused is not None and type(paused) is not bool:
            raise bad(f"paused must be true or false, got {show(paused)}")
        limit = fields_given.get("limit", validate.DEFAULT_LIST_LIMIT)
        if type(limit) is not int or not 1 <= limit <= validate.MAX_LIST_LIMIT:
            raise bad(
                f"limit must be an int from 1 to {validate.MAX_LIST_LIMIT}, got {show(limit)}"
            )
        cursor = fields_given.get("cursor")
        if cursor is not None and type(cursor) is not str:
            raise bad(f"cursor must be a value returned as next by topic_list, got {show(cursor)}")
        found: list[dict[str, Any]] = []
        # In name order, so a cursor (the last name returned) pages through once each.
        for name in sorted(self.settings):
            if cursor is not None and name <= cursor:
                continue
            settings = self.settings[name]
            if paused is not None and settings.paused(now_s) != paused:
                continue
            if len(found) == limit:
                return {"topics": found, "next": found[-1]["topic"]}
            found.append(settings.to_map(name, now_s))
        return {"topics": found, "next": None}

    def _checked(self, topic: Any) -> str:
        name = validate.topic(topic)
        self._check_served(settings_key(name))
        return name

    def _keep(self, topic: str, settings: TopicSettings | None) -> None:
        if settings is None or settings == DEFAULTS:
            self.settings.pop(topic, None)
        else:
            self.settings[topic] = settings
            # Held here now: a copy learned from its previous holder is stale.
            self.elsewhere.pop(topic, None)
            self._elsewhere_records.pop(topic, None)
        self._apply(topic)

    # -- several nodes (ha/topics.py) ------------------------------------------------

    def records(self) -> dict[str, bytes]:
        """The records of the settings held here, by topic, for the other nodes."""
        return {name: to_record(settings) for name, settings in self.settings.items()}

    def learn(self, records: dict[str, bytes]) -> None:
        """The settings the other nodes hold, by topic, as they published them:
        kept in ``elsewhere`` (a topic held here is left out: ours is newer)."""
        records = {name: r for name, r in records.items() if name not in self.settings}
        if records == self._elsewhere_records:  # most rounds: nothing changed
            return
        learned: dict[str, TopicSettings] = {}
        for name, record in records.items():
            known = self.elsewhere.get(name)
            if known is not None and self._elsewhere_records.get(name) == record:
                learned[name] = known
                continue
            try:
                learned[name] = read_record(record)
            except ValueError as exc:  # said once: its record is kept as seen
                log.error("skipping corrupt topic settings of %r published: %s", name, exc)
        touched = self.elsewhere.keys() | learned.keys()
        self.elsewhere, self._elsewhere_records = learned, records
        for name in sorted(touched):
            self._apply(name)

    # -- the store -----------------------------------------------------------------

    def load_record(self, key: str, record: bytes) -> None:
        try:
            settings = read_record(record)
        except ValueError as exc:
            log.error("skipping corrupt topic settings %r: %s", key, exc)
            return
        self._keep(topic_of_settings_key(key), settings)

    def drop(self, leaving: Callable[[str], bool]) -> int:
        """Forget the settings of a partition handed back or lost (no write).
        They still apply here, as if learned, until the next ``learn`` says
        what their next holder publishes: a handoff holds the topic back."""
        gone = [name for name in self.settings if leaving(settings_key(name))]
        for name in gone:
            settings = self.settings.pop(name)
            self.elsewhere[name] = settings
            self._elsewhere_records[name] = to_record(settings)
        return len(gone)

    async def split(
        self, batches: AsyncIterator[list[tuple[str, bytes]]]
    ) -> AsyncIterator[list[tuple[str, bytes]]]:
        """The store's records with the topics' settings taken out (and loaded here)."""
        async for batch in batches:
            if any(is_settings_key(key) for key, _ in batch):
                rest = []
                for key, record in batch:
                    if is_settings_key(key):
                        self.load_record(key, record)
                    else:
                        rest.append((key, record))
                batch = rest
            yield batch

    def stats(self, now_s: float) -> dict[str, Any]:
        """Each topic's settings that differ from the defaults, for ``stats``."""
        return {name: s.to_map(name, now_s) for name, s in sorted(self.settings.items())}
