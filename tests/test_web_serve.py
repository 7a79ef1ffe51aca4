"""The dashboard as ``delaywheel serve`` runs it: --web-port, its log lines, the
refusal and the warning of an open dashboard, TLS and its Secure cookie."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import ClientSession, TCPConnector
from serverproc import ServerProcess
from webkit import dashboard_url

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore
from delaywheel.web.site import Dashboard


@pytest.mark.process
def test_web_insecure_serves_beyond_loopback_and_says_so() -> None:
    proc = ServerProcess("--web-port", "0", "--web-host", "0.0.0.0", "--web-insecure")
    try:
        url = dashboard_url(proc).replace("0.0.0.0", "127.0.0.1")
        warnings = [line for line in proc.log if "--web-insecure" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], proc.log_text()
        assert "anyone who can reach it" in warnings[0]
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200 and "Overview" in reply.read().decode()
    finally:
        assert proc.stop() == 0


@pytest.mark.process
def test_an_open_dashboard_beyond_loopback_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--store", "memory://", "--port", "0",
         "--web-port", "0", "--web-host", "0.0.0.0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--web-insecure" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.process
def test_the_dashboard_is_off_by_default_and_jinja_not_imported() -> None:
    probe = (
        "import sys, delaywheel.app; "
        "print('jinja2' in sys.modules, 'delaywheel.web.site' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr
    proc = ServerProcess()
    try:
        assert not any("dashboard on" in line for line in proc.log)
    finally:
        proc.stop()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "web.pem", directory / "web.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_under_tls_the_cookie_is_secure_and_host_only(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)

    async def main() -> None:
        settings = Settings(
            port=0, store_url="memory://", token="tok", web_port=0,
            tls_cert=str(cert), tls_key=str(key),
        )  # fmt: skip
        store = MemoryStore("memory://")
        await store.open()
        server = Server(settings, Engine(store, now_s=time.time()))
        dashboard = Dashboard(server)
        host, port = await dashboard.start("127.0.0.1", 0)
        try:
            async with ClientSession(connector=TCPConnector(ssl=False)) as http:
                url = f"https://{host}:{port}"
                reply = await http.post(
                    f"{url}/login", data={"token": "tok"}, allow_redirects=False
                )
                assert reply.status == 303
                cookie = reply.headers["Set-Cookie"]
                assert cookie.startswith("__Host-delaywheel=")
                for flag in ("Secure", "HttpOnly", "SameSite=Strict", "Path=/"):
                    assert flag in cookie, cookie
                assert "Domain" not in cookie
        finally:
            await dashboard.stop()
            await store.close()

    asyncio.run(main())
