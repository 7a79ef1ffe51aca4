"""redis+sentinel://[:password@]host:port[,host:port...]/MASTER[/DB]: the Redis store
with its primary found through Redis Sentinel (the Sentinel topology).

The Sentinels (one or more ``host:port``) are asked for the primary that
they monitor as ``MASTER``; the store then writes to that primary,
database ``DB`` (0 by default). The password, when given, is
the data nodes' (``requirepass``), not the Sentinels'.

Following a failover. redis-py's Sentinel client (checks and loading) asks
the Sentinels for the primary on every new connection and drops one that
meets ``READONLY``. The journal link does the same through its ``resolve``
hook (link.py): it asks the Sentinels before each connect, so a
drop or a refused handshake finds the new primary on the next attempt, and a
``READONLY`` reply reconnects and sends the flush again (nothing of it ran).
Writes that fail meanwhile fail as on any unreachable Redis
(``StoreUnavailable``).

Telling the node. Every lookup, the journal links' and redis-py's, goes
through one ``_WatchedSentinel``, and the coordinator asks it every round
too (``confirm_primary``): a primary frozen through a failover answers its old
connections again as a primary once it wakes, until the Sentinels demote it.
When the primary named differs from the one named before, every connection
is moved (``_primary_moved``: the links reconnect and resend what was in
flight, redis-py's pool is emptied) and ``on_primary_changed(host, port)``
is called, once per change. The coordinator then reads every owned partition's epoch again on
that primary (``read_on_primary``, topology.py; ha/failover.py): a failover can lose
the last writes, an acquire's epoch among them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, unquote

from redis.asyncio import Redis
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delaywheel.store.base import StoreConfigError, redact_url
from delaywheel.store.redis.link import JournalLink, Resolve
from delaywheel.store.redis.topology import OnPrimaryChanged, Topology

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


class _WatchedSentinel(Sentinel):
    """redis-py's Sentinel client, asking every Sentinel and telling ``on_change``
    when the primary moves.

    redis-py takes the first Sentinel that names a primary not flagged down;
    one that has not noticed the failover yet names the old primary, and the
    answer would flip back and forth. Here every Sentinel is asked and the
    answer with the highest ``config-epoch`` (bumped by each failover) wins,
    never one older than the newest seen: a failover is seen once.

    The address is ``SENTINEL GET-MASTER-ADDR-BY-NAME``'s, not the
    ``SENTINEL MASTERS`` entry's: the Sentinel leading a failover bumps the
    epoch once the replica is promoted, but its entry keeps the old address
    until every replica is re-pointed (up to the failover timeout), while
    GET-MASTER-ADDR-BY-NAME names the promoted one. With the entry's address,
    a leader asked first paired the new epoch with the old primary, and the
    nodes wrote to that primary, thawed from a SIGSTOP, for the failover
    timeout (3.1-3.2 s in scenario 4 with a 3 s timeout; docs/ha.md).

    An entry flagged down (``s_down``, ``o_down``) is skipped only when the
    Sentinel names that very server: the leader's entry keeps the old
    primary flagged down until it answers again, while it names the promoted
    replica already. Skipping it whole, a node learned of the failover only
    once the woken old primary had answered the Sentinels' pings. And an
    answer vouches for the primary (``doubtful`` False) only when no Sentinel
    as new as it names that server while flagging it down or failing it over:
    right when a replaced primary wakes, every Sentinel may still do so.
    """

    def __init__(self, sentinels: list[tuple[str, int]], **options: Any) -> None:
        super().__init__(sentinels, **options)  # type: ignore[no-untyped-call, unused-ignore]
        self.primary: tuple[str, int] | None = None  # the newest one found
        self.config_epoch = -1  # its config-epoch
        self.on_change: OnPrimaryChanged | None = None
        # The last answer does not vouch for the primary: no Sentinel named one,
        # or one as new as the answer sees it down or is failing it over.
        self.doubtful = True

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        answers: list[Answer] = []
        for sentinel in self.sentinels:
            try:
                masters = cast("dict[str, dict[str, Any]]", await sentinel.sentinel_masters())
                state = masters.get(service_name)
                if not state or state["num-other-sentinels"] < self.min_other_sentinels:
                    continue
                current = cast(
                    "tuple[bytes | str, int] | None",
                    await sentinel.sentinel_get_master_addr_by_name(service_name),
                )
            except (RedisConnectionError, ResponseError, RedisTimeoutError) as exc:
                errors.append(f"{sentinel}: {exc!r}")
                continue
            if current:
                answers.append(answer_of(state, current))
        usable = [answer for answer in answers if not answer.down]
        self.doubtful = True  # until an answer is found that vouches for the primary
        if not usable:
            detail = f": {', '.join(errors)}" if errors else ""
            raise MasterNotFoundError(f"No master found for {service_name!r}{detail}")
        newest = max(usable, key=lambda answer: answer.epoch)  # the first of the newest
        epoch, address = newest.epoch, newest.address
        if epoch < self.config_epoch and self.primary is not None:
            return self.primary  # only Sentinels behind the newest failover answered
        self.doubtful = not vouched([a for a in answers if a.epoch >= epoch])
        previous, self.primary, self.config_epoch = self.primary, address, epoch
        if previous is not None and previous != address and self.on_change is not None:
            self.on_change(*address)
        return address


@dataclass(frozen=True)
class Answer:
    """One Sentinel's view of the primary."""

    epoch: int  # config-epoch: bumped by each failover
    address: tuple[str, int]  # what GET-MASTER-ADDR-BY-NAME names
    down: bool  # it names the server it flags s_down or o_down: no primary to use
    # It names the server it flags o_down (a quorum agreed) or is failing over.
    doubts: bool


def answer_of(state: dict[str, Any], current: tuple[bytes | str, int]) -> Answer:
    host = current[0].decode() if isinstance(current[0], bytes) else current[0]
    address = (host, int(current[1]))
    # The entry's address is the primary before a failover, until its end; a
    # failover's leader names the promoted replica once it is promoted, while
    # its entry still flags the old primary down and failing over.
    entry = address == (str(state["ip"]), int(state["port"]))
    down = entry and bool(state["is_sdown"] or state["is_odown"])
    failing_over = "failover_in_progress" in state["flags"]  # a str (RESP2) or a set (RESP3)
    doubts = entry and bool(state["is_odown"] or failing_over)
    return Answer(int(state.get("config-epoch", 0)), address, down, doubts)


def vouched(newest: list[Answer]) -> bool:
    """Whether the answers of the Sentinels as new as the one taken vouch for
    the primary named: none flags it o_down (a quorum agreed it is down) or
    fails it over, and no more than half flag it down at all. One Sentinel's
    own s_down is not enough to hold claims up (it may be the one cut off);
    no failover starts without a quorum."""
    if not newest or any(answer.doubts for answer in newest):
        return False
    return 2 * sum(answer.down for answer in newest) <= len(newest)


class SentinelTopology(Topology):
    """The primary that the Sentinels name, followed through failovers."""

    def __init__(self, url: str, **options: Any) -> None:
        """``options`` are Topology's (shown, timeouts, on_primary_changed)."""
        target = parse_sentinel_url(url)
        # The links' settings (AUTH, SELECT) come from a redis:// URL; its host
        # is replaced by the Sentinels' answer before every connect.
        auth = f":{quote(target.password, safe='')}@" if target.password is not None else ""
        super().__init__(f"redis://{auth}sentinel-primary:6379/{target.db}", **options)
        self.target = target
        self._sentinel = _WatchedSentinel(
            target.sentinels,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.connect_timeout_s,
        )
        self._sentinel.on_change = self._primary_moved
        self._primary: Redis | None = None  # redis-py's client of the primary
        self._links: list[JournalLink] = []  # every write connection, to move them
        self._moving: set[asyncio.Task[None]] = set()  # pool disconnects under way

    def link(self, **options: Any) -> JournalLink:
        link = super().link(**options)
        self._links.append(link)
        return link

    async def confirm_primary(self) -> bool:
        """Whether the Sentinels vouch, now, for the primary this node writes to:
        they name it still (no failover since the last look), and none as new
        as that answer flags it down or is failing it over. The connections
        ask only when they connect: a primary frozen through a failover answers
        the old ones again as if it still were one (until the Sentinels demote
        it), and takes their writes, all to be discarded. Right when it wakes
        every Sentinel still flags it down, and the failover's leader may name
        the old primary until it has seen the replica promoted: no answer that
        vouches for it."""
        moves = self.primary_moves
        try:
            await self._sentinel.discover_master(self.target.master)
        except (RedisError, OSError):
            return False
        return self.primary_moves == moves and not self._sentinel.doubtful

    def primary_address(self) -> str:
        """The primary the Sentinels named last (the master's name until asked)."""
        found = self._sentinel.primary
        return self.target.master if found is None else f"{found[0]}:{found[1]}"

    def _primary_moved(self, host: str, port: int) -> None:
        """Every connection to the previous primary goes: the write links
        reconnect (resending what was in flight), redis-py's pool is emptied."""
        self.primary_moves += 1
        for link in self._links:
            link.reconnect()
        if self._primary is not None:
            task = asyncio.get_running_loop().create_task(
                self._primary.connection_pool.disconnect()
            )
            self._moving.add(task)
            task.add_done_callback(self._moving.discard)
        if self.on_primary_changed is not None:
            self.on_primary_changed(host, port)

    async def _connect(self) -> Topology:
        client = self._sentinel.master_for(
            self.target.master,
            redis_class=Redis,
            db=self.target.db,
            password=self.target.password,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.connect_timeout_s,
            client_name="delaywheel",
        )
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        self._client = self._primary = client
        return self

    def _resolve(self) -> Resolve:
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
        self._primary = None
        await super().close()
        for sentinel in self._sentinel.sentinels:
            await sentinel.aclose()
