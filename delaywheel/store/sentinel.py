"""redis+sentinel://[:password@]host:port[,host:port...]/MASTER[/DB]: the Redis store
with its primary found through Redis Sentinel.

The Sentinels (one or more ``host:port``) are asked for the primary that
they monitor as ``MASTER``; the store is then the Redis store (redis.py) on
that primary, database ``DB`` (0 by default). The password, when given, is
the data nodes' (``requirepass``), not the Sentinels'.

Following a failover. redis-py's Sentinel client (checks and loading) asks
the Sentinels for the primary on every new connection and drops one that
meets ``READONLY``. The journal link does the same through its ``resolve``
hook (``_redis_journal``): it asks the Sentinels before each connect, so a
drop or a refused handshake finds the new primary on the next attempt, and a
``READONLY`` reply reconnects and sends the flush again (nothing of it ran).
Writes that fail meanwhile fail as on any unreachable Redis
(``StoreUnavailable``, with the store's backoff).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, unquote

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import RedisError

from delaywheel.store._redis_journal import Resolve
from delaywheel.store.base import StoreConfigError, redact_url
from delaywheel.store.redis import RedisStore
from delaywheel.store.redis_client import Client

SCHEME = "redis+sentinel://"


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: list[tuple[str, int]]
    master: str
    db: int
    password: str | None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a ``redis+sentinel://`` URL; ``StoreConfigError`` naming what is wrong."""
    shown = redact_url(url)

    def bad(why: str) -> StoreConfigError:
        return StoreConfigError(
            f"store URL {shown!r}: {why};"
            " expected redis+sentinel://[:password@]host:port[,host:port...]/MASTER[/DB]"
        )

    if not url.lower().startswith(SCHEME):
        raise bad("not a redis+sentinel:// URL")
    rest = url[len(SCHEME) :]
    if "?" in rest or "#" in rest:
        raise bad("takes no query or fragment")
    hosts, _, path = rest.partition("/")
    userinfo, at, hosts = hosts.rpartition("@")
    password = None
    if at:
        if not userinfo.startswith(":") or len(userinfo) < 2:
            raise bad("the password goes as :password@ (no user name)")
        password = unquote(userinfo[1:])
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise bad(f"sentinel {item!r} is not host:port")
        sentinels.append((host.strip("[]"), int(port)))
    parts = path.split("/") if path else []
    if not parts or not parts[0]:
        raise bad("no MASTER name")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise bad(f"{'/'.join(parts[1:])!r} is not a database number")
    return SentinelTarget(
        sentinels, unquote(parts[0]), int(parts[1]) if len(parts) == 2 else 0, password
    )


class RedisSentinelStore(RedisStore):
    def __init__(self, url: str, **options: Any) -> None:
        """``options`` are RedisStore's (prefix, timeouts)."""
        target = parse_sentinel_url(url)
        # The Redis store's own settings (AUTH, SELECT) come from a redis:// URL;
        # its host is replaced by the Sentinels' answer before every connect.
        auth = f":{quote(target.password, safe='')}@" if target.password is not None else ""
        super().__init__(f"redis://{auth}sentinel-primary:6379/{target.db}", **options)
        self.url = redact_url(url)
        self.target = target
        self._sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8
            target.sentinels,
            socket_timeout=self._timeout_s,
            socket_connect_timeout=self._connect_timeout_s,
        )

    async def _connect_client(self) -> Client:
        client = self._sentinel.master_for(
            self.target.master,
            redis_class=Redis,
            db=self.target.db,
            password=self.target.password,
            socket_timeout=self._timeout_s,
            socket_connect_timeout=self._connect_timeout_s,
            client_name="delaywheel",
        )
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        return cast(Client, client)

    def _resolve_primary(self) -> Resolve:
        async def primary() -> tuple[str, int]:
            try:
                host, port = await self._sentinel.discover_master(self.target.master)
            except RedisError as exc:  # the link expects a ConnectionError
                raise ConnectionError(
                    f"no primary for {self.target.master!r} from the Sentinels"
                    f" {', '.join(f'{h}:{p}' for h, p in self.target.sentinels)}: {exc}"
                ) from exc
            return str(host), int(port)

        return primary

    async def close(self) -> None:
        await super().close()
        for sentinel in self._sentinel.sentinels:
            await sentinel.aclose()
