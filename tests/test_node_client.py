"""The Node.js client's own tests (clients/node), run from here so that ``make test`` runs them.

``npm ci`` installs what clients/node/package-lock.json pins, and ``npm test`` builds the
TypeScript with ``tsc`` and runs ``node --test`` against real servers it starts with this
interpreter (``DELAYWHEEL_PYTHON``): one server per group of tests, two nodes on a private
redis-server, a TLS server with certificates made by openssl, the Python client in a
subprocess for the bodies read across languages, and ``npm pack``. Node 20 or later is
required: without node or npm the test is skipped on a developer's machine and fails in CI
(tests/services.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from services import need_program

pytestmark = [pytest.mark.process, pytest.mark.redis, pytest.mark.packaging, pytest.mark.slow]

PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "node"
NPM_TIMEOUT_S = 600  # npm ci fetches from the registry when its cache is cold
MIN_NODE_MAJOR = 20


def npm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["npm", *args],
        cwd=PACKAGE,
        env={**os.environ, "DELAYWHEEL_PYTHON": sys.executable, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_S,
    )


def test_node_client_suite() -> None:
    node = need_program("node", "nodejs")
    need_program("npm", "npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    found = re.match(r"v(\d+)", version.stdout)
    assert found and int(found.group(1)) >= MIN_NODE_MAJOR, (
        f"clients/node needs Node {MIN_NODE_MAJOR} or later, found {version.stdout.strip()!r}"
    )

    installed = npm("ci", "--no-audit", "--no-fund")
    assert installed.returncode == 0, f"npm ci failed:\n{installed.stdout}\n{installed.stderr}"

    tested = npm("test")
    report = f"{tested.stdout[-20000:]}\n{tested.stderr[-5000:]}"
    assert tested.returncode == 0, f"npm test failed:\n{report}"
    # The runner's summary: every test passed, and there were tests.
    passed = re.search(r"^# pass (\d+)$", tested.stdout, re.M)
    failed = re.search(r"^# fail (\d+)$", tested.stdout, re.M)
    assert passed and failed, f"no node --test summary:\n{report}"
    assert int(failed.group(1)) == 0, report
    assert int(passed.group(1)) >= 25, report
