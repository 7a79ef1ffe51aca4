"""``--http-allow``: the destinations the server may send HTTP requests to.

A delay queue that calls any URL a client names is an SSRF tool: a client
that can reach the server could make it call the cloud metadata service, an
admin port on loopback, or anything else on the server's private network.
So HTTP destinations are checked against an allow list, by default
``public``: only globally routable addresses.

Entries, comma-separated (a list of such strings works too):

- ``example.com``: that host name, exactly (case-insensitive). It must
  resolve when the server starts (``check_names_resolve``), so that a word
  meant as something else (``bogus``, ``publc``) stops the start.
- ``*.example.com``: any subdomain of it, at any depth, but not
  ``example.com`` itself.
- ``10.1.2.3``, ``::1``, ``10.0.0.0/8``, ``fd00::/8``: an address or range.
- ``public``: any globally routable address (``_is_public``).
- ``*``: anything.

A destination is allowed when its host name matches a name entry, or ``*``
is present, or its address matches an address entry, a range or ``public``.
A name is matched before DNS; addresses only after it. So there are two
checks:

- at ``add``, ``check_url`` decides what it can without DNS: an IP-literal
  host fully; ``localhost`` and ``*.localhost`` as the loopback addresses
  they must resolve to (RFC 6761); any other name passes when a name entry
  matches it or when an address rule could still allow it after DNS.
- at each attempt, ``CheckedResolver`` (the HTTP session's resolver) keeps
  only the addresses DNS returned that ``allowed_addresses`` allows, so a
  connection is only ever made to a checked address, and a name that
  resolves somewhere else on the second try (DNS rebinding) is refused too.

IPv6 forms that carry an IPv4 address (mapped ``::ffff:a.b.c.d``, compatible
``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) count as public
only when that IPv4 address is: ``ipaddress`` calls ``::127.0.0.1`` and
``2002:7f00:1::`` global, though they lead to loopback.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT = "public"

# RFC 1123 labels, plus "_", which real host names (SRV-style, some intranet
# names) carry and resolvers accept. A DNS name is at most 253 characters.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:{_LABEL}\.)*{_LABEL}")
MAX_NAME_CHARS = 253

_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Never public, whatever ``is_global`` says on a given Python version:
_NOT_PUBLIC = (
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215)
    ipaddress.ip_network("fec0::/10"),  # deprecated site-local, still routed in places
)


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address leads to, for the forms that carry one."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if int(addr) >> 32 == 0 or addr in _NAT64:  # ::a.b.c.d (:: and ::1 included)
        return ipaddress.IPv4Address(int(addr) & 0xFFFF_FFFF)
    return None


def _is_public(addr: IPAddress) -> bool:
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            return _is_public(embedded)
        if any(addr in net for net in _NOT_PUBLIC):
            return False
    # is_global alone lets multicast through (224/4 and ff0e:: are "global").
    return addr.is_global and not addr.is_multicast and not addr.is_reserved


def _forms(addr: IPAddress) -> list[IPAddress]:
    """The forms of an address that an address entry may name."""
    if isinstance(addr, ipaddress.IPv4Address):
        return [addr]
    bare = ipaddress.IPv6Address(int(addr))  # without its %zone
    # A mapped ::ffff:a.b.c.d reaches a.b.c.d: an entry for either form matches.
    return [bare] if bare.ipv4_mapped is None else [bare, bare.ipv4_mapped]


def _kind(addr: IPAddress) -> str:
    """Why an address is not public, for a refusal message."""
    for attr in ("loopback", "link_local", "multicast", "unspecified", "private", "reserved"):
        if getattr(addr, f"is_{attr}"):
            return attr.replace("_", "-")
    return "not public"


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def host_name(text: str) -> str | None:
    """``text`` as a comparable host name (lower case, no trailing dot), or
    None when it is not a syntactically valid one."""
    name = text.lower().removesuffix(".")
    if len(name) > MAX_NAME_CHARS or not _HOST_NAME.fullmatch(name):
        return None
    return name


def _reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _is_localhost(name: str) -> bool:
    return name == "localhost" or name.endswith(".localhost")


class AllowList:
    """A parsed ``--http-allow`` value; ``str()`` gives it back as configured."""

    __slots__ = ("_any", "_entries", "_names", "_networks", "_public", "_suffixes")

    def __init__(self, value: str | Iterable[str] = DEFAULT) -> None:
        items = [value] if isinstance(value, str) else list(value)
        entries = [part.strip() for item in items for part in item.split(",")]
        # Blank parts ("a,,b", a trailing comma) are skipped; a wholly blank
        # value is refused, since it is more likely an unset variable in a
        # start-up script than a wish to refuse every destination.
        self._entries = tuple(entry for entry in entries if entry)
        if not self._entries:
            raise ValueError("--http-allow is empty; leave it out for the default (public)")
        self._any = self._public = False
        self._names: dict[str, str] = {}  # name -> the entry as written
        self._suffixes: list[str] = []  # each with its leading "."
        self._networks: list[IPNetwork] = []
        for entry in self._entries:
            self._add(entry)

    def _add(self, entry: str) -> None:
        lowered = entry.lower()
        if lowered == "*":
            self._any = True
        elif lowered == "public":
            self._public = True
        elif "/" in entry:
            try:
                # strict: "10.1.2.3/8" is more likely a typo than a wish for 10/8.
                self._networks.append(ipaddress.ip_network(entry, strict=True))
            except ValueError as exc:
                raise ValueError(
                    f"--http-allow entry {entry!r} is not a CIDR range: {exc}"
                ) from None
        elif (addr := _address(entry)) is not None:
            self._networks.append(ipaddress.ip_network(addr))
        elif not entry.isascii():
            raise ValueError(f"--http-allow entry {entry!r}: write the name in its xn-- form")
        elif lowered.startswith("*.") and (suffix := host_name(lowered[2:])) is not None:
            self._suffixes.append("." + suffix)
        elif (name := host_name(lowered)) is not None:
            self._names.setdefault(name, entry)
        else:
            raise ValueError(
                f"--http-allow entry {entry!r} is not a host name, *.suffix, address, "
                "CIDR range, public or *"
            )

    @classmethod
    def parse(cls, value: str | Iterable[str] = DEFAULT) -> AllowList:
        """The same as ``AllowList(value)``; raises ValueError naming a bad entry."""
        return cls(value)

    def check_names_resolve(self) -> None:
        """Raise ValueError naming the first host name entry DNS does not know.

        At start (config.py): a word that is no host, ``--http-allow bogus`` or
        ``publc``, would otherwise be taken as a name that no URL ever has, and
        every destination it was meant to allow refused at ``add``. A
        ``*.suffix`` is not looked up: its subdomains are the names used.
        """
        for name, entry in self._names.items():
            try:
                socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
            except (socket.gaierror, UnicodeError) as exc:
                raise ValueError(
                    f"--http-allow entry {entry!r} is not public, *, an address, a CIDR range,"
                    f" a *.suffix or a host name that resolves ({_reason(exc)})"
                ) from None

    def __str__(self) -> str:
        return ",".join(self._entries)

    def __repr__(self) -> str:
        return f"AllowList({str(self)!r})"

    def describe(self) -> str:
        """The list as configured, for messages and ``stats``."""
        return str(self)

    @property
    def has_address_rules(self) -> bool:
        """Whether an address could be allowed without a name matching."""
        return self._any or self._public or bool(self._networks)

    def allows_name(self, host: str) -> bool:
        """Whether a name entry (or ``*``) allows this host name, before DNS."""
        if self._any:
            return True
        name = host_name(host)
        if name is None:
            return False
        return name in self._names or any(name.endswith(sfx) for sfx in self._suffixes)

    def allows_address(self, address: str | IPAddress) -> bool:
        """Whether an address, whatever name led to it, is allowed."""
        addr = _address(address) if isinstance(address, str) else address
        if addr is None:
            return False
        if self._any or (self._public and _is_public(addr)):
            return True
        return any(form in net for form in _forms(addr) for net in self._networks)

    def allowed_addresses(self, host: str, addresses: Iterable[str]) -> list[str]:
        """The addresses DNS gave for ``host`` that may be connected to, in order."""
        if self.allows_name(host):
            return list(addresses)
        return [address for address in addresses if self.allows_address(address)]

    def check_url(self, url: str | URL) -> None:
        """Refuse, with a ValueError that names the host and this list, a URL
        whose destination is refused on what is known without DNS."""
        parsed = url if isinstance(url, URL) else URL(url)
        host = parsed.raw_host
        if not host:
            raise ValueError("the URL has no host")
        addr = _address(host)
        if addr is not None:
            self._check_address(host, [addr])
            return
        name = host_name(host)
        if name is None:
            raise ValueError(f"host {host!r} is not a valid host name or IP address")
        if name.rsplit(".", 1)[-1].isdigit():
            # "127.1", "2130706433": getaddrinfo reads these as IPv4 addresses.
            raise ValueError(f"host {host!r} is a numeric IPv4 form; write it as a.b.c.d")
        if self.allows_name(name):
            return
        if _is_localhost(name):
            self._check_address(host, list(_LOOPBACK))
        elif not self.has_address_rules:
            raise ValueError(f"host {host} matches no entry of --http-allow={self}")

    def _check_address(self, host: str, addrs: list[IPAddress]) -> None:
        if not any(self.allows_address(addr) for addr in addrs):
            kind = _kind(addrs[0])
            raise ValueError(f"host {host} ({kind}) is refused by --http-allow={self}")
