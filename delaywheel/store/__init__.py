"""Task stores: where the engine journals every change (the contract is in base.py).

``open_store(url)`` picks the store by the URL's scheme:

- ``redis://[[user]:password@]host:port/db``, ``rediss://`` (TLS): redis.py
- ``redis+sentinel://[:password@]host:port[,host:port...]/MASTER[/DB]``: the
  Redis store on the primary that Sentinel names (sentinel.py)
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
    "open_store",
    "redact_url",
]

SCHEMES = ("redis://", "rediss://", "redis+sentinel://", "sqlite:///", "memory://")


def open_store(url: str, *, redis_prefix: str = "delaywheel") -> Store:
    """The store for ``url``, not yet connected: call ``await store.open()``.

    Raises ``StoreConfigError`` (naming the URL, password hidden) for a
    malformed URL, an unknown scheme or a missing driver. ``redis_prefix``
    names the Redis keys (``{prefix}:tasks``); other stores ignore it.
    """
    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        scheme = ""
    if scheme in ("redis", "rediss", "redis+sentinel"):
        try:
            import redis.asyncio  # noqa: F401
        except ImportError:
            raise StoreConfigError(
                f"store URL {redact_url(url)!r} needs the Redis driver:"
                " pip install 'redis[hiredis]>=5.0'"
            ) from None
        if scheme == "redis+sentinel":
            from delaywheel.store.sentinel import RedisSentinelStore

            return RedisSentinelStore(url, prefix=redis_prefix)
        from delaywheel.store.redis import RedisStore

        return RedisStore(url, prefix=redis_prefix)
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
