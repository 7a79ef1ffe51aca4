"""The server's log output: text or JSON lines on stderr, and the settings as logged.

Both formats carry the same lines. ``text`` is the classic
``TIME LEVEL LOGGER: MESSAGE``; ``json`` is one object per line for log
shippers, with ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``,
the structured fields a log call passes as ``extra=``, and ``exc`` (the
traceback, as a string) when there is one. A message reads on its own, so
the text format needs no extras; in JSON they repeat what the message says
in a form a query can use. docs/operations.md ("Logging") lists the events.

What never goes in a line: a task's body, the token, the signing secret, a
password of the store or a broker, an HTTP target's query string or its
headers. Each call site is responsible for its own text (URLs go through the
redact helpers); ``shown_settings`` does it for the start line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from delaywheel.config import Settings
from delaywheel.delivery.brokers import redact
from delaywheel.store.base import redact_url

FORMATS = ("text", "json")
# Drivers that log every reconnect attempt (aio-pika's robust connection and
# aiormq under it: an ERROR and an INFO line each, several a second against a
# broker that is down). The broker link logs lost and back once each, so
# these speak only at --log-level debug.
CHATTY_DRIVERS = ("aiormq", "aio_pika")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Settings shown as *** when set: the whole value is a secret.
SECRET_SETTINGS = frozenset({"token", "signing_secret", "web_viewer_token"})

# Every attribute a plain LogRecord has (``taskName`` since 3.12 among them);
# whatever else a record holds came from ``extra=``.
_PLAIN_RECORD = logging.LogRecord("", logging.INFO, "", 0, "", (), None)
_RECORD_ATTRIBUTES = frozenset(vars(_PLAIN_RECORD)) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: an extra of another type is shown rather than lost.
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure(level: str, log_format: str) -> None:
    """Send every logger's records to stderr in ``log_format`` from ``level`` up."""
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    json_lines = log_format == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in CHATTY_DRIVERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)


def shown_settings(settings: Settings) -> dict[str, Any]:
    """Every setting by its field name, as the start line shows it: the token and
    the signing secret as ``***`` (None when unset), passwords in URLs as ``***``."""
    shown: dict[str, Any] = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if field.name in SECRET_SETTINGS:
            value = None if value is None else "***"
        elif field.name == "store_url":
            value = redact_url(value)
        elif field.name == "brokers":
            value = [_shown_broker(spec) for spec in value]
        elif isinstance(value, tuple):
            value = list(value)
        shown[field.name] = value
    return shown


def _shown_broker(spec: str) -> str:
    name, sep, url = spec.partition("=")
    return f"{name}{sep}{redact(url)}" if sep else redact(spec)


def start_line(settings: Settings) -> str:
    """``key=value`` for every setting, values in JSON: one line that reads and parses."""
    return " ".join(
        f"{key}={json.dumps(value, default=str)}" for key, value in shown_settings(settings).items()
    )
