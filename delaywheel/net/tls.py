"""The server's TLS context, from ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca``.

Built at start, so that a path that is wrong, unreadable or not PEM stops the server
with a message naming it, instead of failing the first client's handshake. Each file is
read once by us before OpenSSL loads it: OpenSSL's own errors ("PEM lib") do not say
which file was at fault.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from delaywheel.config import ConfigError, Settings


class _Encrypted(Exception):
    """Raised by the password callback: OpenSSL would otherwise prompt on the terminal."""


def _refuse_password() -> str:
    raise _Encrypted


def _read(what: str, path: str, marker: bytes, kind: str) -> None:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path!r}: {exc.strerror or exc}") from None
    if marker not in data:
        raise ValueError(f"{what} {path!r} holds no PEM {kind}")


def tls_of(settings: Settings) -> ssl.SSLContext | None:
    """The server's TLS context, or None without ``--tls-cert``; raises
    ``ConfigError`` naming the file at fault (app.py builds it before the store
    opens, so a bad file stops the start with its name and nothing else)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None  # the settings checked that the files go together
    try:
        return server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the certificate chain in ``cert`` with its
    private key in ``key`` (PEM, unencrypted; one file may hold both), and when
    ``client_ca`` is given, clients must present a certificate signed by that CA.
    Raises ``ValueError`` naming the file at fault."""
    _read("tls cert", cert, b"-----BEGIN CERTIFICATE-----", "certificate")
    _read("tls key", key, b"PRIVATE KEY-----", "private key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key, password=_refuse_password)
    except _Encrypted:
        raise ValueError(f"tls key {key!r} is encrypted: give an unencrypted key") from None
    except ssl.SSLError as exc:  # e.g. KEY_VALUES_MISMATCH: the key is not the cert's
        raise ValueError(f"tls cert {cert!r} and key {key!r}: {_reason(exc)}") from None
    if client_ca is not None:
        _read("tls client ca", client_ca, b"-----BEGIN CERTIFICATE-----", "certificate")
        try:
            context.load_verify_locations(cafile=client_ca)
        except ssl.SSLError as exc:
            raise ValueError(f"tls client ca {client_ca!r}: {_reason(exc)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _reason(exc: ssl.SSLError) -> str:
    """``key values mismatch``, not ``[X509: KEY_VALUES_MISMATCH] ... (_ssl.c:3926)``."""
    return str(exc.reason).replace("_", " ").lower() if exc.reason else str(exc)
