"""Task stores: where the engine journals every change (the contract is in base.py).

``open_store(url)`` picks the store by the URL's scheme:

- ``redis://[[user]:password@]host:port/db``, ``rediss://`` (TLS), and
  ``redis+sentinel://[:password@]host:port[,host:port...]/MASTER[/DB]`` (the
  primary that Sentinel names): the Redis store, on plain Redis, a Redis
  Cluster (found by asking the node) or Sentinel (the package redis/)
- ``sqlite:///relative.db``, ``sqlite:////absolute.db``: sqlite.py
- ``memory://``: memory.py

The backends are imported only when asked for, so a missing Redis driver
matters only to ``redis://`` URLs.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from delaywheel.store.base import (
    Changes,
    Store,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
    redact_url,
)

__all__ = [
    "Changes",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "is_redis_url",
    "open_store",
    "redact_url",
]

SCHEMES = ("redis://", "rediss://", "redis+sentinel://", "sqlite:///", "memory://")
_REDIS_SCHEMES = ("redis", "rediss", "redis+sentinel")


def _scheme(url: str) -> str:
    try:
        return urlsplit(url).scheme
    except ValueError:
        return ""


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names the Redis store, the one nodes can share."""
    return _scheme(url) in _REDIS_SCHEMES


def open_store(
    url: str,
    *,
    redis_prefix: str = "delaywheel",
    partitions: int | None = None,
    replicas: int = 0,
) -> Store:
    """The store for ``url``, not yet connected: call ``await store.open()``.

    Raises ``StoreConfigError`` (naming the URL, password hidden) for a
    malformed URL, an unknown scheme or a missing driver. ``redis_prefix``
    names the Redis keys (``{prefix:pNNN}:tasks``...), ``partitions`` (None:
    16) and ``replicas`` (WAIT for that many after each write) are the Redis
    store's; other stores ignore them. A Redis store opened here has no
    owner: it writes every partition itself (store/redis/owner.py); a node
    of a shared keyspace builds its ``RedisStore`` with the coordinator's.
    """
    scheme = _scheme(url)
    if scheme in _REDIS_SCHEMES:
        try:
            import redis.asyncio  # noqa: F401
        except ImportError:
            raise StoreConfigError(
                f"store URL {redact_url(url)!r} needs the Redis driver:"
                " pip install 'redis[hiredis]>=5.0'"
            ) from None
        from delaywheel.store.redis import DEFAULT_PARTITIONS, RedisStore

        return RedisStore(
            url,
            prefix=redis_prefix,
            partitions=DEFAULT_PARTITIONS if partitions is None else partitions,
            replicas=replicas,
        )
    if scheme == "sqlite":
        from delaywheel.store.sqlite import SqliteStore

        return SqliteStore(url)
    if scheme == "memory":
        if url.lower() not in ("memory://", "memory:"):
            raise StoreConfigError(f"store URL {redact_url(url)!r}: memory:// takes nothing more")
        from delaywheel.store.memory import MemoryStore

        return MemoryStore(url)
    raise StoreConfigError(
        f"store URL {redact_url(url)!r}: unknown scheme; use one of {', '.join(SCHEMES)}"
    )
