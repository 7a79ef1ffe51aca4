"""TLS for both clients: the ``SSLContext`` made from their ``tls*`` settings, and what a
failed handshake is called.

The context verifies the server as a browser would: its certificate must chain to a
trusted CA (the system's, or ``tls_ca``) and name the host connected to (or
``server_hostname``). Turning that off takes a context of one's own (``tls=context``).
"""

from __future__ import annotations

import os
import ssl
from typing import TypeAlias

PathLike: TypeAlias = "str | os.PathLike[str]"


class _Encrypted(Exception):
    """Raised by the password callback: OpenSSL would otherwise prompt on the terminal."""


def _refuse_password() -> str:
    raise _Encrypted


def client_context(
    tls: bool | ssl.SSLContext,
    ca: PathLike | None,
    cert: PathLike | None,
    key: PathLike | None,
) -> ssl.SSLContext | None:
    """The context to connect with, or None for plain TCP. ``ca`` or ``cert`` turn TLS
    on by themselves. Raises ``ValueError`` naming a file that cannot be loaded,
    or a context given together with files."""
    if isinstance(tls, ssl.SSLContext):
        if ca is not None or cert is not None or key is not None:
            raise ValueError("give tls_ca, tls_cert and tls_key, or a context as tls, not both")
        return tls
    if key is not None and cert is None:
        raise ValueError("tls_key needs tls_cert (the certificate the key belongs to)")
    if not (tls or ca is not None or cert is not None):
        return None
    try:
        context = ssl.create_default_context(cafile=ca)
    except OSError as exc:  # ssl.SSLError included: a file that holds no certificate
        raise ValueError(f"tls_ca {os.fspath(ca or '')!r}: {tls_reason(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        where = f"tls_cert {os.fspath(cert)!r}" + (f", tls_key {os.fspath(key)!r}" if key else "")
        try:
            context.load_cert_chain(cert, key, password=_refuse_password)
        except _Encrypted:
            raise ValueError(f"{where}: the key is encrypted; give an unencrypted key") from None
        except OSError as exc:
            raise ValueError(f"{where}: {tls_reason(exc)}") from None
    return context


# Why a TLS server may close a connection without a word: it wanted a client certificate.
# The asyncio server closes without sending its alert, so the client sees only the close:
# in the handshake under TLS 1.2, and before the first reply under TLS 1.3, where the
# server checks the client's certificate after the client's side of the handshake is done.
_CERT_HINT = (
    " (a server with --tls-client-ca does this when it gets no client certificate it"
    " trusts: see tls_cert)"
)
CLOSED_UNANSWERED_HINT = " before any reply" + _CERT_HINT
# A plain connection closed before any reply: a TLS server does that at once
# to bytes that are not a TLS handshake.
PLAIN_CLOSED_HINT = (
    " before any reply (is the server using TLS? try --tls, or --tls-ca FILE;"
    " in Python tls=True or tls_ca=)"
)


def handshake_failure(exc: ssl.SSLError) -> str:
    """A failed handshake in words, for the ``ConnectionFailed`` it becomes."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate did not verify: {exc.verify_message}"
    if exc.reason == "WRONG_VERSION_NUMBER":
        return "TLS handshake failed: the server did not answer in TLS (is TLS on there?)"
    if isinstance(exc, ssl.SSLEOFError) or exc.reason == "UNEXPECTED_EOF_WHILE_READING":
        return "TLS handshake failed: the server closed the connection" + _CERT_HINT
    return f"TLS handshake failed: {tls_reason(exc)}"


def tls_reason(exc: OSError) -> str:
    """``certificate verify failed``, not ``[SSL: CERTIFICATE_VERIFY_FAILED] ... (_ssl.c:1006)``."""
    if not (isinstance(exc, ssl.SSLError) and exc.reason):
        return exc.strerror or str(exc)
    text = str(exc.reason).replace("_", " ").lower()
    if "certificate required" in text:
        text += " (the server wants a client certificate: tls_cert and tls_key)"
    return text


__all__ = [
    "CLOSED_UNANSWERED_HINT",
    "PLAIN_CLOSED_HINT",
    "PathLike",
    "client_context",
    "handshake_failure",
    "tls_reason",
]
