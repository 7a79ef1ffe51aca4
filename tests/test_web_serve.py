"""The dashboard as ``delaywheel serve`` runs it: --web-port, its log lines, the
refusal and the warning of an open dashboard, TLS and its Secure cookie."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import ClientSession, CookieJar, TCPConnector
from delaywheel_client import Client
from serverproc import ServerProcess
from webkit import CSRF_FIELD, dashboard_url

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


@pytest.mark.process
@pytest.mark.slow
def test_a_bulk_kick_of_10000_in_batches_of_500_survives_a_kill_and_restart(
    tmp_path: Path,
) -> None:
    """Each batch is durable before the next and before the job says so: killed
    (-9) the moment the job page says finished, the server restarts with all
    10,000 kicked, none dead."""
    total = 10_000
    proc = ServerProcess(
        "--token", "tok", "--web-port", "0", store=f"sqlite:///{tmp_path / 'tasks.db'}"
    )
    try:
        with Client(*proc.address, token="tok") as dw:
            for start in range(0, total, 1000):
                dw.add_many(
                    {"topic": "bulk", "id": f"k{n}", "max_attempts": 1}
                    for n in range(start, start + 1000)
                )
                with dw.pipeline() as pipe:
                    for _ in range(1000):
                        pipe.reserve("bulk")
                reserved = [task["id"] for task in pipe.results]
                with dw.pipeline() as pipe:
                    for task_id in reserved:  # the last attempt given back: dead
                        pipe.release(task_id)
            assert dw.stats()["states"]["dead"] == total
        seen = asyncio.run(_kick_all(dashboard_url(proc), total))
        proc.kill()
        # Progress moves a batch at a time: every figure the page showed is a
        # multiple of 500.
        assert seen[-1] == total and all(done % 500 == 0 for done in seen), seen
        proc.start()
        with Client(*proc.address, token="tok") as dw:
            states = dw.stats()["states"]
            assert (states["dead"], states["ready"]) == (0, total), states
            assert dw.get("k9999")["state"] == "ready"  # type: ignore[index]
    finally:
        proc.stop()


JOB_STATUS = re.compile(r'data-finished="(yes|no)">(\d+) of (\d+) done')


async def _kick_all(url: str, total: int) -> list[int]:
    """Sign in, kick the topic's every dead task, follow the job to its end;
    the done counts its page showed on the way."""
    async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as http:  # an IP's cookie
        await http.post(f"{url}login", data={"token": "tok"})
        page = await (await http.get(f"{url}dead")).text()
        csrf = CSRF_FIELD.search(page)
        assert csrf is not None, page
        form = {"csrf": csrf.group(1), "topic": "bulk", "confirm": str(total)}
        form["confirm_topic"] = "bulk"  # past 1,000 the topic's name is typed too
        headers = {"Origin": url.rstrip("/"), "Sec-Fetch-Site": "same-origin"}
        reply = await http.post(
            f"{url}dead/kick", data=form, headers=headers, allow_redirects=False
        )
        assert reply.status == 303, await reply.text()
        job = url.rstrip("/") + reply.headers["Location"]
        seen: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            status = await (await http.get(job)).text()
            found = JOB_STATUS.search(status)
            assert found is not None, status
            seen.append(int(found.group(2)))
            if found.group(1) == "yes":
                return seen
            await asyncio.sleep(0.01)
        raise AssertionError(f"the job did not finish: {seen[-5:]}")
