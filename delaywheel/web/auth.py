"""Who is asking: sessions kept on the server, the sign-in limit, CSRF checks.

A session is a random id in a server-side dict (never data in the cookie),
so logout revokes it at once. Each holds its role (``admin`` or ``viewer``)
and its CSRF token, which every form carries. Sign-in failures are limited
per address by the server's one rule for every door (net/signins.py): a
token cannot be guessed at the loop's speed.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

ADMIN = "admin"
VIEWER = "viewer"
IDLE_S = 3600.0  # a session unused this long is gone
MAX_AGE_S = 12 * 3600.0  # and none lives longer than this


@dataclass
class Session:
    sid: str
    role: str
    csrf: str
    created_s: float
    seen_s: float
    flash: list[str] = field(default_factory=list)

    @property
    def who(self) -> str:
        """How the audit log names it: the role and the id's first characters."""
        return f"{self.role}:{self.sid[:8]}"


class Sessions:
    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}
        self._clock = time.monotonic  # a test may set its own

    def create(self, role: str) -> Session:
        self._expire()
        now_s = self._clock()
        session = Session(secrets.token_urlsafe(32), role, secrets.token_urlsafe(32), now_s, now_s)
        self._by_id[session.sid] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session of ``sid``, its idle time restarted; None when unknown or expired."""
        if not sid:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        now_s = self._clock()
        if now_s - session.seen_s > IDLE_S or now_s - session.created_s > MAX_AGE_S:
            del self._by_id[sid]
            return None
        session.seen_s = now_s
        return session

    def revoke(self, sid: str) -> None:
        self._by_id.pop(sid, None)

    def _expire(self) -> None:
        now_s = self._clock()
        stale = [
            sid
            for sid, s in self._by_id.items()
            if now_s - s.seen_s > IDLE_S or now_s - s.created_s > MAX_AGE_S
        ]
        for sid in stale:
            del self._by_id[sid]

    def __len__(self) -> int:
        return len(self._by_id)


def role_of(given: str, admin_token: str | None, viewer_token: str | None) -> str | None:
    """The role a token signs in as, compared in constant time; None for neither."""
    given_b = given.encode()
    role = None
    # Both compared every time: which one matched must not show in the timing.
    if admin_token is not None and hmac.compare_digest(given_b, admin_token.encode()):
        role = ADMIN
    if viewer_token is not None and hmac.compare_digest(given_b, viewer_token.encode()):
        role = role or VIEWER
    return role


def same_origin(origin: str | None, fetch_site: str | None, own_host: str) -> bool:
    """The browser's word that a request comes from our own pages.

    ``Sec-Fetch-Site`` (every current browser sends it) must be ``same-origin``
    or ``none`` (typed in, a bookmark). ``Origin`` (its host), when sent, must be
    ours; ``null`` is what Chromium sends for our own forms under
    ``Referrer-Policy: no-referrer``, so it counts only with ``Sec-Fetch-Site``'s
    word. A client sending neither (a script) is judged by the CSRF token alone."""
    if fetch_site is not None:
        if fetch_site not in ("same-origin", "none"):
            return False
    elif origin == "null":
        return False
    return origin in (None, "null", own_host)
