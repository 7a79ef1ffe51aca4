"""The store interface: what the engine may rely on, whichever backend is behind it.

How it is used
--------------
A store keeps one opaque ``bytes`` record per task id and knows nothing else
about tasks. The engine opens it, streams every record back with ``load()`` at
start-up, then journals changes with ``submit()``: it gathers the changes of all
requests made in one event-loop turn into one mapping (group commit), hands
it to ``submit()``, and replies once that write's callback says it is
durable. So ``submit()`` is the only hot path and costs one round trip (Redis)
or one transaction (SQLite) however many changes it carries. It completes by
callback rather than as a coroutine: a Task, a coroutine and the loop turns
between them cost more than the engine's whole work for an add (docs/performance.md),
and a store that can finish at once (memory) answers in the turn that made
the change. ``write()`` is the same operation awaited, for start-up code and
tests.

A mapping cannot hold the same id twice, so the puts and removes of one write
never conflict and their order inside the write does not matter.

Every store promises the contracts in the docstrings below; the conformance
suite in tests/test_store.py checks them on every backend. What "durable"
means differs by backend and is spelled out in each module's docstring.

Errors: ``StoreConfigError`` for mistakes in the URL or a missing driver (raised
by ``open_store()`` and constructors, never by a running store), and
``StoreUnavailable`` for everything that goes wrong at run time; a bare
``StoreError`` only for misuse (opening twice) and for stored data this store
did not write (a Redis hash field that is not UTF-8). Messages name the display
URL (password replaced by ``***``) and never the password.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit, urlunsplit

Changes = Mapping[str, bytes | None]
"""Task id -> packed record to store, or ``None`` to remove the id."""

Done = Callable[["StoreError | None"], None]
"""A write's completion: called once, with None when durable or with the error."""

LaneOutcomes = list[tuple[int, "StoreError | None"]]
"""Lanes whose writes are done, each with None (durable) or its error."""

LanesDone = Callable[[LaneOutcomes], None]
"""``submit_lanes``' completion: called one or more times, naming each lane once."""

DEFAULT_BATCH_SIZE = 10_000

FarRecord = tuple[str, float, bytes]
"""A record of the far tier: its id, its due time (epoch seconds), its bytes."""


class Tiers:
    """What one write does to the far tier besides its puts and removes.

    The far tier (engine/horizon.py) holds delayed tasks due beyond the
    engine's horizon, with a time index and a count per topic, so the
    server keeps nothing of them in memory and a start never reads them
    all. ``load`` yields only the other records (the near tier); the far
    ones are read by time (``far_range``) or by id (``far_get``). The
    store applies, for each id of the write's ``changes``, in this order:

    - ``blind``: a put made only if neither tier holds the id; one that
      does is left as it is and named in ``conflicts`` (the store fills it
      before ``done`` runs), with the rest of the write applied; blind ids
      of one ``groups`` value (id -> group; an ``add_many``'s, all in one
      lane) go together: when one is held, none of the group is put (the
      held ones alone are named in ``conflicts``);
    - ``was_far`` (id -> the topic the far tier holds it under): the id
      leaves the far tier (its index entry, its topic's count) if there;
    - then the change itself: a remove takes the id out of the near tier,
      a put in ``far`` (id -> (due, topic)) goes to the far tier (out of
      the near one), any other put to the near tier.

    A put to the far tier of an id the far tier holds names it in
    ``was_far`` too, so the counts stay exact.
    """

    __slots__ = ("blind", "conflicts", "far", "groups", "was_far")

    def __init__(self) -> None:
        self.far: dict[str, tuple[float, str]] = {}
        self.was_far: dict[str, str] = {}
        self.blind: set[str] = set()
        self.groups: dict[str, str] = {}
        self.conflicts: set[str] = set()

    def refused(self, conflicts: set[str]) -> set[str]:
        """The ids not put, given the blind ids held (``conflicts``): those,
        and the rest of their groups."""
        groups = self.groups
        if not conflicts or not groups:
            return conflicts
        lost = {groups[task_id] for task_id in conflicts if task_id in groups}
        return conflicts | {task_id for task_id, group in groups.items() if group in lost}

    def __bool__(self) -> bool:
        return bool(self.far or self.was_far or self.blind)


class StoreError(Exception):
    """Base class of every error a store raises."""


class StoreUnavailable(StoreError):
    """The store cannot be reached, or an operation on it failed.

    The message names the store's display URL and the cause. The engine turns
    it into the ``unavailable`` reply; retrying later may succeed.
    """


class Unconfirmed(StoreUnavailable):
    """The write reached the store and was applied there, but was not confirmed
    durable (a Redis primary took it; fewer replicas than ``--replicas``
    confirmed it in time). Its requests are answered ``unavailable`` (the
    durability is unknown), but its changes are not undone: the store holds
    them, so the engine keeps them too (the journal, engine/journal.py)."""


def reply_for(error: StoreError) -> tuple[str, dict[str, Any] | None]:
    """The protocol error a failed write answers its requests with: ``unavailable``
    (the outcome is unknown), or what the error says (``Fenced``: ``moved``)."""
    return getattr(error, "reply_code", "unavailable"), getattr(error, "reply_data", None)


class StoreConfigError(StoreError):
    """The store URL is malformed, names an unknown scheme, or needs a driver
    that is not installed (the message names the package to install)."""


class Store(abc.ABC):
    """A map of task id to opaque record bytes, persisted by the backend.

    Life cycle: construct (does no I/O), ``open()``, then ``load()`` once, then
    any number of ``submit()`` (or ``write()``) calls, then ``close()``. A store object is
    opened once: after ``close()`` make a new one (``open_store(url)``).
    """

    url: str
    """The display URL: the password, if any, is replaced by ``***``. Safe for
    logs, stats and error messages."""

    persistent: ClassVar[bool] = True
    """Whether records outlive the store object (False only for memory://)."""

    inline: ClassVar[bool] = False
    """Whether ``submit()`` always completes before it returns (memory://): the
    journal then flushes at the end of each connection's work, not a turn later."""

    tiered: ClassVar[bool] = False
    """Whether the store keeps a far tier (``Tiers``, ``far_range``,
    ``far_get``, ``far_counts``); without one the engine holds every task."""

    lanes: int = 1
    """How many lanes the store's writes fall in (``lane_of``): writes of
    different lanes succeed or fail on their own (a Redis keyspace's
    partitions, which may live on different Cluster primaries). One lane:
    every write stands or falls whole, and ``submit_lanes`` is not used."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._state = "new"  # -> "open" -> "closed"

    def _start_open(self) -> None:
        """Called first by ``open()``: refuse a second open."""
        if self._state != "new":
            raise StoreError(f"store {self.url} is already {self._state}; open a new store")

    def _check_open(self, action: str) -> None:
        """Called first by ``load()``; ``submit()`` uses ``_not_open()``."""
        error = self._not_open(action)
        if error is not None:
            raise error

    def _not_open(self, action: str) -> StoreUnavailable | None:
        """The error for ``action`` on a store that is not open, or None when it is."""
        if self._state == "open":
            return None
        state = "closed" if self._state == "closed" else "not open yet"
        return StoreUnavailable(f"store {self.url}: {action} failed: the store is {state}")

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and create whatever schema the backend needs.

        Raises ``StoreUnavailable`` naming the URL when the backend cannot be
        reached or refuses; nothing is left open then, and ``open()`` may be
        called again (for example after a backoff). Calling it on a store that
        is open or closed raises ``StoreError``.
        """

    @abc.abstractmethod
    def load(self, batch_size: int = DEFAULT_BATCH_SIZE) -> AsyncIterator[list[tuple[str, bytes]]]:
        """Yield every stored ``(id, record)`` exactly once, in batches.

        An async generator: ``async for batch in store.load(): ...``. Each
        batch is non-empty and holds at most ``batch_size`` pairs; the order
        of records is unspecified. Meant for start-up: it must not run
        concurrently with ``write()`` (what it returns for records changed
        meanwhile is unspecified). Raises ``StoreUnavailable`` on failure,
        ``StoreError`` on a record it cannot read back, and ``ValueError``
        when ``batch_size < 1``.
        """

    @abc.abstractmethod
    def submit(self, changes: Changes, done: Done, tiers: Tiers | None = None) -> None:
        """Start applying all puts (id -> bytes) and removes (id -> None) together;
        call ``done(None)`` once they are durable, or ``done(error)``.

        - One round trip or one transaction, whatever the number of changes.
        - All or nothing, as far as the backend allows (see each module).
        - Durable when ``done(None)`` runs, in the backend's sense (see each module).
        - Removing an absent id is not an error. An empty mapping is a no-op.
        - Writes are applied in the order they were submitted; later writes
          do not wait for earlier ones to complete before being submitted.
        - ``done`` is called exactly once, on the event loop's thread, possibly
          before ``submit`` returns (a store that finishes at once). It gets a
          ``StoreUnavailable`` on failure: the write may or may not have been
          applied, so the caller must neither acknowledge it nor assume it
          was lost. ``submit`` itself never raises for a failed write.
        - After ``close()`` (or before ``open()``) it fails with ``StoreUnavailable``.
        - The caller must not change ``changes`` until ``done`` has run.
        - ``tiers``: what the write does to the far tier (``Tiers``), in the
          same transaction or script; only on a ``tiered`` store.
        """

    async def far_range(
        self, lane: int, after: tuple[float, str] | None, before_s: float | None, limit: int
    ) -> list[FarRecord]:
        """Far records of ``lane`` in (due, id) order: after ``after`` (a
        (due, id) already read; None: from the first), due before
        ``before_s`` (None: any), at most ``limit``."""
        raise StoreError(f"store {self.url} keeps no far tier")

    async def far_get(self, task_ids: Sequence[str]) -> dict[str, tuple[float, bytes]]:
        """The far records of those of ``task_ids`` the far tier holds: id -> (due, record)."""
        raise StoreError(f"store {self.url} keeps no far tier")

    async def far_counts(self, lane: int) -> dict[str, int]:
        """How many records of ``lane`` the far tier holds, by topic (kept by
        the writes themselves: no scan)."""
        return {}

    def lane_of(self, key: str) -> int:
        """The lane of ``key``'s writes, in ``range(lanes)``."""
        return 0

    def lane_group(self, lane: int) -> object:
        """What ``lane``'s writes fail with: the lanes of one group (one server)
        fail and come back together (the store's watch ends an outage by it)."""
        return None

    def submit_lane(
        self, lane: int, changes: Changes, done: Done, tiers: Tiers | None = None
    ) -> None:
        """``submit`` of one lane's changes (the journal's path when one lane is
        ready: one request at a time). This default, for a store of one lane,
        is ``submit``."""
        self.submit(changes, done, tiers)

    def submit_lanes(
        self,
        writes: Sequence[tuple[int, Changes]],
        done: LanesDone,
        tiers: Mapping[int, Tiers] | None = None,
    ) -> None:
        """Start the writes of several lanes (``(lane, changes)``, each lane once)
        together: one round trip per server that holds them. Each lane's
        changes are all or nothing, as ``submit``'s; different lanes' outcomes
        are independent, and ``done`` may report them as they come, in several
        calls, each lane exactly once. The caller keeps at most one write of a
        lane in flight. This default, for a store of one lane, is ``submit``."""
        for lane, changes in writes:
            self.submit(
                changes, partial(_lane_done, done, lane), None if tiers is None else tiers.get(lane)
            )

    async def write(self, changes: Changes, tiers: Tiers | None = None) -> None:
        """``submit(changes)`` awaited: returns once durable, raises its error.

        If the awaiting task is cancelled the write still goes on, and may land.
        """
        finished: asyncio.Future[StoreError | None] = asyncio.get_running_loop().create_future()

        def done(error: StoreError | None) -> None:
            if not finished.done():
                finished.set_result(error)

        self.submit(changes, done, tiers)
        error = await finished
        if error is not None:
            raise error

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections, files and threads. Idempotent; never raises
        ``StoreUnavailable``. Writes called before ``close()`` are finished
        first (or fail as they would have); writes called after it raise
        ``StoreUnavailable``."""

    @abc.abstractmethod
    def warnings(self) -> list[str]:
        """After ``open()``: configuration that could lose acknowledged writes,
        one sentence each, for the operator's log. Empty when there is none.
        They do not repeat the URL; the caller logs it alongside."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"


def _lane_done(done: LanesDone, lane: int, error: StoreError | None) -> None:
    done([(lane, error)])


_PASSWORD_PARAM = re.compile(r"((?:^|&)[^=&]*password=)[^&]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with the password (userinfo or ``password=`` query) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
    except ValueError:  # e.g. an invalid port; still show something useful
        parts = None
        has_password = False
    if parts is None:
        return _redact_loosely(url)
    netloc = parts.netloc
    if has_password:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:***@{hostport}"
    query = _PASSWORD_PARAM.sub(r"\1***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_loosely(url: str) -> str:
    """Redaction for strings urlsplit rejects: blank out any userinfo wholesale."""
    return re.sub(r"//[^/@]*@", "//***@", _PASSWORD_PARAM.sub(r"\1***", url))


def url_secrets(url: str) -> list[str]:
    """The password of ``url`` as written and percent-decoded, to scrub from messages."""
    found: list[str] = []
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        found += [password, unquote(password)]
    for match in re.finditer(r"(?:^|[?&])[^=&]*password=([^&#]*)", url, re.IGNORECASE):
        if match.group(1):
            found += [match.group(1), unquote(match.group(1))]
    return sorted(set(found), key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def unavailable(
    url: str, action: str, cause: BaseException, secrets: Iterable[str] = ()
) -> StoreUnavailable:
    """A ``StoreUnavailable`` naming the display URL, what failed, and why."""
    detail = scrub(str(cause), secrets) or "no detail"
    return StoreUnavailable(f"store {url}: {action} failed: {type(cause).__name__}: {detail}")


def check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
