"""A private beanstalkd for the compare section, and the reason when there can be none.

``private_beanstalkd()`` starts ``beanstalkd`` (the Debian package of that
name) listening on a free port of 127.0.0.1 only, optionally with its binlog
in a given directory, and stops it on the way out. The compare section talks
to it with the ``greenstalk`` client (the ``bench`` extra of pyproject.toml).

``unavailable()`` says why beanstalkd cannot be measured (no binary, no
client), or None when it can. When the binary is missing and we are root it
first tries ``apt-get install -y beanstalkd``, once per process: the compare
section then skips every beanstalkd figure with that one message and still
measures delaywheel.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from bench import progress
from bench._procs import _wait_for_port, free_port

HOST = "127.0.0.1"
# The binlog's fsync policy: ``-f 1000``, fsync at most once every 1000 ms.
# That is what Redis's ``appendfsync everysec`` does (the delaywheel Redis store
# runs against such a Redis), so both journals can lose about the last second
# on a power cut and neither pays an fsync per write. beanstalkd's default
# (-f 50) would fsync 20 times as often; -F would never fsync, and -f 0 on
# every write, stricter than the Redis it is compared with.
BINLOG_FSYNC_MS = 1000
APT_TIMEOUT_S = 600.0


@functools.cache
def _binary() -> tuple[str | None, str]:
    """(path of beanstalkd, "") or (None, why not); installs it once if we may."""
    path = shutil.which("beanstalkd")
    if path is not None:
        return path, ""
    if os.geteuid() != 0:
        return None, "beanstalkd is not installed (apt-get install beanstalkd)"
    progress("beanstalkd missing: trying apt-get install -y beanstalkd")
    with suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["apt-get", "install", "-y", "beanstalkd"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            timeout=APT_TIMEOUT_S,
            check=False,
        )
    path = shutil.which("beanstalkd")
    if path is None:
        return None, "beanstalkd is not installed and apt-get install -y beanstalkd failed"
    return path, ""


def unavailable() -> str | None:
    """Why beanstalkd cannot be measured here, or None when it can."""
    try:
        import greenstalk  # noqa: F401  (only whether it is there)
    except ImportError:
        return "the greenstalk client is not installed (pip install '.[bench]')"
    path, why = _binary()
    return why if path is None else None


@contextmanager
def private_beanstalkd(binlog_dir: Path | None = None) -> Iterator[tuple[int, tuple[str, int]]]:
    """beanstalkd on a free port of 127.0.0.1; yields (pid, (host, port)).

    With ``binlog_dir`` it keeps its binlog there, fsynced at most once a
    second (see ``BINLOG_FSYNC_MS``). Call only when ``unavailable()`` is None.
    """
    path, why = _binary()
    if path is None:
        raise RuntimeError(why)
    port = free_port()
    args = [path, "-l", HOST, "-p", str(port)]
    if binlog_dir is not None:
        args += ["-b", str(binlog_dir), "-f", str(BINLOG_FSYNC_MS)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        _wait_for_port(port)
        yield proc.pid, (HOST, port)
    finally:
        proc.terminate()
        proc.wait()
