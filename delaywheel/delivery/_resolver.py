"""The HTTP sender's resolver: DNS answers filtered through the allow list.

Apart from ``allow.py`` so that checking a target at ``add`` (and the CLI)
never imports aiohttp, which costs a tenth of a second at every start.
"""

from __future__ import annotations

import socket

from aiohttp.abc import AbstractResolver, ResolveResult

from delaywheel.delivery.allow import AllowList


class DestinationRefused(OSError):
    """DNS gave only addresses the allow list refuses."""


class CheckedResolver(AbstractResolver):
    """Resolves with ``inner``, then keeps only the addresses ``allow`` allows."""

    def __init__(self, allow: AllowList, inner: AbstractResolver) -> None:
        self._allow = allow
        self._inner = inner

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        allowed = set(self._allow.allowed_addresses(host, [r["host"] for r in found]))
        kept = [r for r in found if r["host"] in allowed]
        if not kept:
            addresses = ", ".join(dict.fromkeys(r["host"] for r in found))
            raise DestinationRefused(
                f"{host} resolves to {addresses}, which --http-allow={self._allow} refuses"
            )
        return kept

    async def close(self) -> None:
        await self._inner.close()
