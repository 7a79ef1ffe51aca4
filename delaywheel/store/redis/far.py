"""Reading the far tier: tasks due beyond --horizon, kept only in Redis.

Each partition's far tier is three keys (layout.py): ``far`` (id -> record),
``due`` (a zset: id -> due time, the tier's time index) and ``farcount``
(topic -> far tasks). The fenced flush writes them (fenced.py); the engine
reads them through the store's ``far_range``, ``far_get`` and ``far_counts``
(store/base.py; engine/far_pull.py pulls what comes due). A failed read is
``StoreUnavailable``, naming the store as ``url`` shows it, ``secrets`` hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from delaywheel.store.base import FarRecord, unavailable
from delaywheel.store.redis.client import Client
from delaywheel.store.redis.layout import Layout, PartitionKeys, partition_of


async def read_range(
    client: Client,
    names: PartitionKeys,
    after: tuple[float, str] | None,
    before_s: float | None,
    limit: int,
    *,
    url: str,
    secrets: Sequence[str],
) -> list[FarRecord]:
    """The partition's due zset read by score from ``after``'s (members of an
    equal score come in id order, as Redis sorts them), then their records."""
    low = "-inf" if after is None else repr(after[0])
    high = "+inf" if before_s is None else f"({before_s!r}"
    found: list[tuple[str, float]] = []
    offset = 0
    try:
        while len(found) < limit:
            want = limit - len(found)
            page = await client.zrangebyscore(
                names.due, low, high, start=offset, num=want, withscores=True
            )
            offset += len(page)
            for member, score in cast(list[tuple[bytes, float]], page):
                task_id = member.decode()
                if after is None or (score, task_id) > after:
                    found.append((task_id, float(score)))
            if len(page) < want:
                break
        if not found:
            return []
        records = cast(list[bytes | None], await client.hmget(names.far, [key for key, _ in found]))
    except Exception as exc:
        raise unavailable(url, "far_range", exc, secrets) from exc
    return [
        (task_id, due_s, record)
        for (task_id, due_s), record in zip(found, records, strict=True)
        if record is not None
    ]


async def read_by_id(
    client: Client, layout: Layout, task_ids: Sequence[str], *, url: str, secrets: Sequence[str]
) -> dict[str, tuple[float, bytes]]:
    """The far tasks of ``task_ids`` that are there: their due times and records."""
    by_partition: dict[int, list[str]] = {}
    for task_id in task_ids:
        by_partition.setdefault(partition_of(task_id, layout.partitions), []).append(task_id)
    found: dict[str, tuple[float, bytes]] = {}
    try:
        for p, ids in by_partition.items():
            names = layout.partition(p)
            records = cast(list[bytes | None], await client.hmget(names.far, ids))
            for task_id, record in zip(ids, records, strict=True):
                if record is not None:
                    due_s = await client.zscore(names.due, task_id)
                    found[task_id] = (0.0 if due_s is None else float(due_s), record)
    except Exception as exc:
        raise unavailable(url, "far_get", exc, secrets) from exc
    return found


async def read_counts(
    client: Client, names: PartitionKeys, *, url: str, secrets: Sequence[str]
) -> dict[str, int]:
    """The partition's far tasks by topic (those with none left out)."""
    try:
        counts = await client.hgetall(names.far_counts)
    except Exception as exc:
        raise unavailable(url, "far_counts", exc, secrets) from exc
    return {
        (topic.decode() if isinstance(topic, bytes) else topic): int(n)
        for topic, n in counts.items()
        if int(n) > 0
    }
