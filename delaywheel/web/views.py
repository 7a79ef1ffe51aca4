"""What the pages show, read from the engine: topics, pages of tasks, dead groups, bodies.

Reads only. A read that grows with the tasks (grouping the dead, the next
due per topic) walks them in chunks of ``SCAN_CHUNK`` and yields to the
loop between chunks, so the server keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from delaywheel.engine.engine import Engine
from delaywheel.engine.task import DEAD, DELAYED, Task
from delaywheel.web import nesting

SCAN_CHUNK = 10_000
PAGE_ROWS = 50
MAX_PAGE_ROWS = 500
SCHEDULE_ROWS = 100  # schedules a page shows (schedule_list's default)
PAGE_CALLS = 5  # list calls one page may make before it says how far it scanned
MAX_BODY_SHOWN = 64 * 1024
PREVIEW_BYTES = 200
NO_ERROR = "(no error recorded)"

# Characters that would hide or reorder text around them: C0/C1 controls,
# DEL, and the bidirectional overrides and isolates (a right-to-left mark can
# make "gpj.exe" read "exe.jpg"). Shown as \uXXXX instead.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every hiding character spelled ``\\uXXXX`` (HTML escaping is Jinja's)."""
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def to_field(value: str) -> str:
    """A value for a form field, in ASCII with JSON's escapes: a NUL or a
    right-to-left mark in an id or topic reaches the page as ``\\u0000``, and
    the browser (which would turn a raw NUL into U+FFFD) sends it back intact."""
    return json.dumps(value, ensure_ascii=True)[1:-1]


def from_field(value: str) -> str:
    """``to_field``'s inverse; ValueError for what it cannot have made."""
    try:
        decoded = json.loads('"' + value + '"')
    except json.JSONDecodeError:
        raise ValueError(f"not a field value of ours: {value!r}") from None
    if not isinstance(decoded, str):
        raise ValueError(f"not a field value of ours: {value!r}")
    return decoded


async def _chunks(items: Iterable[Task]) -> Any:
    """``items``, yielding to the loop every ``SCAN_CHUNK``."""
    for n, item in enumerate(items, 1):
        yield item
        if n % SCAN_CHUNK == 0:
            await asyncio.sleep(0)


@dataclass
class TopicRow:
    name: str
    counts: dict[str, int]
    oldest_ready_s: float | None = None  # its age, in seconds
    next_due_s: float | None = None  # when its earliest delayed task is due
    settings: dict[str, Any] | None = None  # its settings (engine/topics.py), if it has any


async def topics(engine: Engine, name_filter: str = "") -> list[TopicRow]:
    now_s = time.time()
    held = engine.topics.settings
    # Topics with tasks, and those with settings but no task (paused, say).
    names: dict[str, dict[str, int]] = {name: {} for name in held}
    names.update(engine.snapshot().counts.by_topic())
    rows = {
        name: TopicRow(name, counts)
        for name, counts in sorted(names.items())
        if name_filter.lower() in name.lower()
    }
    for name, row in rows.items():
        if name in held:
            row.settings = held[name].to_map(name, now_s)
    for name, row in rows.items():
        head = engine.oldest_ready(name)
        if head is not None:
            row.oldest_ready_s = max(0.0, now_s - head.at_s)
    if any(row.counts.get(DELAYED) for row in rows.values()):
        async for task in _chunks(engine.decoded_tasks()):
            found = rows.get(task.topic)
            if (
                found is not None
                and task.state == DELAYED
                and (found.next_due_s is None or task.at_s < found.next_due_s)
            ):
                found.next_due_s = task.at_s
    return list(rows.values())


@dataclass
class Page:
    tasks: list[dict[str, Any]]
    next: int | str | None  # the cursor of the next page (str: past the horizon), None at the end
    short: bool = False  # fewer rows than asked though not at the end: the scan budget ran out


async def list_page(
    engine: Engine, topic: str | None, state: str | None, cursor: int | str, limit: int
) -> Page:
    """Up to ``limit`` tasks after ``cursor``, in at most ``PAGE_CALLS`` list calls."""
    found: list[dict[str, Any]] = []
    next_cursor: int | str | None = cursor
    for _ in range(PAGE_CALLS):
        query: dict[str, Any] = {"cursor": next_cursor, "limit": min(limit - len(found), 1000)}
        if topic:
            query["topic"] = topic
        if state:
            query["state"] = state
        reply = await engine.through_store(partial(engine.list_tasks, query))
        found.extend(reply["tasks"])
        next_cursor = reply["next"]
        if next_cursor is None or len(found) >= limit:
            break
    return Page(found, next_cursor, short=len(found) < limit and next_cursor is not None)


@dataclass
class DeadGroup:
    topic: str
    error: str | None
    count: int = 0
    ids: list[str] = field(default_factory=list)  # the first few, to show

    @property
    def key(self) -> str:
        """The group in a form field: ``-`` for no error, else ``+`` and the error."""
        return "-" if self.error is None else "+" + self.error


def error_of_key(key: str) -> str | None:
    if key == "-":
        return None
    if key.startswith("+"):
        return key[1:]
    raise ValueError(f"not a dead group: {key!r}")


async def dead_groups(engine: Engine) -> list[DeadGroup]:
    groups: dict[tuple[str, str | None], DeadGroup] = {}
    for topic, counts in sorted(engine.snapshot().counts.by_topic().items()):
        if not counts.get(DEAD):
            continue
        async for task in _chunks(engine.dead_tasks(topic)):
            group = groups.get((topic, task.last_error))
            if group is None:
                group = groups[topic, task.last_error] = DeadGroup(topic, task.last_error)
            group.count += 1
            if len(group.ids) < 5:
                group.ids.append(task.id)
    return sorted(groups.values(), key=lambda g: (-g.count, g.topic, g.error or ""))


async def dead_ids(engine: Engine, topic: str, error_key: str | None) -> list[str]:
    """The ids of ``topic``'s dead tasks, of one error group when ``error_key`` is given."""
    error = None if error_key is None else error_of_key(error_key)
    ids = []
    async for task in _chunks(engine.dead_tasks(topic)):
        if error_key is None or task.last_error == error:
            ids.append(task.id)
    return ids


@dataclass
class Body:
    text: str
    json: str
    hex: str
    truncated: bool
    size: int


def result_text(result: Any) -> str:
    """A done task's result as one line of JSON (as a body's is shown: deep
    values collapsed, bytes as text), cut at ``MAX_BODY_SHOWN`` characters."""
    if isinstance(result, bytes):
        result = result.decode("utf-8", errors="replace")
    text = json.dumps(nesting.shown(result), default=repr, ensure_ascii=False)
    return visible(text[:MAX_BODY_SHOWN])


def body_views(body: Any) -> Body:
    """A task's body as text, JSON and hex, each cut at ``MAX_BODY_SHOWN`` bytes."""
    if isinstance(body, bytes):
        raw = body
        text = body.decode("utf-8", errors="replace")
    elif isinstance(body, str):
        raw = body.encode("utf-8", errors="surrogatepass")
        text = body
    else:
        body = nesting.shown(body)  # any depth the protocol accepts, collapsed past 64
        text = json.dumps(body, default=repr, ensure_ascii=False)
        raw = text.encode("utf-8", errors="surrogatepass")
    as_json = json.dumps(
        body if not isinstance(body, bytes) else {"bytes_hex": body.hex()},
        default=repr,
        indent=2,
        ensure_ascii=True,
    )
    cut = MAX_BODY_SHOWN
    return Body(
        text=visible(text[:cut]),
        json=as_json[:cut],
        hex=raw[: cut // 2].hex(" "),
        truncated=len(raw) > cut or len(as_json) > cut,
        size=len(raw),
    )


def preview(body: Any) -> str:
    views = body_views(body)
    return views.text[:PREVIEW_BYTES]


@dataclass
class ClusterRow:
    partition: int
    node: str | None  # None: no owner just now (a takeover is under way)
    address: str | None
    epoch: int | None
    mine: bool  # owned by the node serving this page


@dataclass
class Cluster:
    node: str
    partitions: int
    lease_s: float | None  # None: a single-node store, no leases
    rows: list[ClusterRow]

    @property
    def mine(self) -> int:
        return sum(row.mine for row in self.rows)

    @property
    def unowned(self) -> int:
        return sum(row.node is None for row in self.rows)


def cluster(reply: dict[str, Any]) -> Cluster:
    """The ``cluster`` reply (``Server.cluster_map``) as the cluster page shows it."""
    node = str(reply["node"])
    rows = [
        ClusterRow(o["partition"], o["node"], o["address"], o["epoch"], o["node"] == node)
        for o in reply["owners"]
    ]
    return Cluster(node, int(reply["partitions"]), reply["lease_s"], rows)
