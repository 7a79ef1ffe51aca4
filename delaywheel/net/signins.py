"""Failed sign-ins, per source address: one rule for every door.

The doors are the protocol's ``auth``, the dashboard's ``/api`` (a Bearer
token) and its sign-in form; all share the server's one ``SignIns``, so an
address that guesses on one is slowed on all. The rule: an address may fail
``FREE_FAILURES`` times in a row; after that it is refused, without its token
being looked at, for ``BLOCK_BASE_S`` seconds, doubled at each further
failure up to ``BLOCK_CAP_S``. Its count is forgotten ``FORGET_S`` after its
last failure, or at once when it signs in. So a guesser gets a few tries,
then about one a minute; a user who mistyped waits a second or two.

Only the failing address is refused: a right token from any other address
is answered as usual (a token is a secret, not an address, and an attacker
must not lock the owners out). IPv6 addresses count by their /64, which one
machine usually holds whole.

Logging: one line per address and burst (its first failure since it was last
forgotten), and at most ``LOG_EVERY_S`` apart over all addresses (the lines
skipped are counted in the next). Never the token. The counts by door are in
``/metrics`` (``delaywheel_auth_failures_total``,
``delaywheel_auth_refused_total``).

Memory: at most ``MAX_ADDRESSES`` addresses are tracked; past that the one
failed longest ago is forgotten first.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("delaywheel.auth")  # pinned: its name is documented

DOORS = ("protocol", "api", "sign_in")  # where a token is given; labels in /metrics
FREE_FAILURES = 5
BLOCK_BASE_S = 1.0
BLOCK_CAP_S = 60.0
FORGET_S = 600.0
LOG_EVERY_S = 1.0
MAX_ADDRESSES = 10_000


@dataclass
class _Record:
    failures: int
    last_s: float  # the last failure, time.monotonic()
    until_s: float  # refused until then


class SignIns:
    """Failures by source address, and whether an address may try now."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_source: dict[str, _Record] = {}
        self.failures = dict.fromkeys(DOORS, 0)  # by door, since the start
        self.refused = dict.fromkeys(DOORS, 0)
        self._logged_s = float("-inf")
        self._unlogged = 0  # bursts not logged since the last line

    def retry_in_s(self, address: str | None, door: str) -> float:
        """0 when ``address`` may try a token now; else how long it is refused for
        (and the refusal is counted)."""
        record = self._by_source.get(_source(address))
        if record is None:
            return 0.0
        left_s = record.until_s - self._clock()
        if left_s <= 0:
            return 0.0
        self.refused[door] += 1
        return left_s

    def failed(self, address: str | None, door: str) -> None:
        """``address`` gave a wrong token at ``door``."""
        now_s = self._clock()
        source = _source(address)
        self.failures[door] += 1
        records = self._by_source
        record = records.pop(source, None)  # re-inserted last: the dict is oldest first
        if record is None or now_s - record.last_s > FORGET_S:
            record = _Record(0, now_s, now_s)
            self._log_burst(source, door, now_s)
        record.failures += 1
        record.last_s = now_s
        over = record.failures - FREE_FAILURES
        if over >= 0:
            record.until_s = now_s + min(BLOCK_BASE_S * 2.0**over, BLOCK_CAP_S)
        records[source] = record
        if len(records) > MAX_ADDRESSES:
            del records[next(iter(records))]

    def succeeded(self, address: str | None) -> None:
        """``address`` signed in: its past failures are forgotten."""
        if self._by_source:
            self._by_source.pop(_source(address), None)

    def _log_burst(self, source: str, door: str, now_s: float) -> None:
        if now_s - self._logged_s < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more sources since the last line)" if self._unlogged else ""
        log.warning(
            "failed sign-in from %s (%s): after %d failures in a row it is refused for a "
            "growing time, up to %g s%s",
            *(source, door, FREE_FAILURES, BLOCK_CAP_S, more),
            extra={"peer": source, "door": door, "more": self._unlogged},
        )
        self._logged_s = now_s
        self._unlogged = 0


def _source(address: str | None) -> str:
    """What failures count against: the address, or an IPv6 address's /64."""
    if not address:
        return "unknown"
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.split("%")[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
