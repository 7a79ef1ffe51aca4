"""The curl examples of docs/http.md and the README, run as pasted against a real server.

Every ``sh`` block of docs/http.md runs, in order, in one bash with ``set -e``: a
``curl -f`` that gets an error fails the test. The page's ``export DW=...`` and ``serve``
lines stand for the server the test starts (its URL and token in their place). The
README's "from curl" block runs as pasted but for the port, which is the test server's.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from apicalls import api_url
from serverproc import ServerProcess, free_port

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "change-me"


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", page.read_text(), re.DOTALL)


def _run(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_guides_curl_examples_run(tmp_path: Path) -> None:
    proc = ServerProcess("--api-port", "0", "--token", TOKEN)
    try:
        kept = []
        for block in _blocks(ROOT / "docs" / "http.md"):
            lines = [
                line
                for line in block.splitlines()
                if not line.startswith(("delaywheel serve", "export DW="))
            ]
            kept.append("\n".join(lines))
        script = "\n".join(kept)
        assert script.count("curl ") >= 25  # every resource has its example
        env = {"PATH": "/usr/bin:/bin", "DW": api_url(proc), "TOKEN": TOKEN}
        done = _run(script, tmp_path, env)
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert '"state": "reserved"' in out and '"acked": true' in out
        assert '"code": "bad_request"' in out and "-5" in out  # the error example's problem
        assert json.loads((tmp_path / "openapi.json").read_text())["openapi"] == "3.1.0"
    finally:
        proc.stop()


def test_the_readmes_curl_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    (block,) = [b for b in _blocks(ROOT / "README.md") if "curl" in b and "/v1/" in b]
    port = re.search(r"--api-port (\d+)", block)
    assert port, block
    api_port = free_port()
    proc = ServerProcess("--api-port", str(api_port))
    try:
        script = "\n".join(
            line for line in block.splitlines() if not line.startswith("delaywheel serve")
        ).replace(f":{port.group(1)}/", f":{api_port}/")
        done = _run(script, tmp_path, {"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert '"state": "reserved"' in done.stdout and '"acked": true' in done.stdout
        assert "from curl" in readme.lower()
    finally:
        proc.stop()
