"""TLS end to end: real servers with ``--tls-cert``/``--tls-key`` (and ``--tls-client-ca``),
the blocking and asyncio clients, the CLI, and plain-text peers on a TLS port.

The certificates are made here with the ``openssl`` command line: a private CA, a server
certificate for 127.0.0.1 and localhost, a client certificate from that CA, and a second
CA with a client certificate of its own, which the servers do not trust.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from apicalls import api_url
from click.testing import CliRunner, Result
from clusternodes import PARTITIONS, SETTLE_TIMEOUT_S, node
from delaywheel_client import AsyncClient, Client, ConnectionFailed
from delaywheel_client.partitions import partition_of
from serverproc import ServerProcess
from waiting import wait_until

from delaywheel.cli import main

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


# -- certificates ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA nobody trusts, and a client certificate it signed
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN=delaywheel test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _make_leaf(
    directory: Path, name: str, ca: tuple[Path, Path], extensions: list[str]
) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    ext_file = directory / f"{name}.ext"
    base = ["basicConstraints=CA:FALSE", "subjectKeyIdentifier=hash"]
    ext_file.write_text("\n".join([*base, "authorityKeyIdentifier=keyid", *extensions]) + "\n")
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key, "-out", csr, "-subj", f"/CN={name}",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-CAserial", directory / f"{ca[0].stem}.srl", "-out", cert, "-days", "2",
        "-extfile", ext_file,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("tls")
    ca = _make_ca(directory, "ca")
    server = _make_leaf(
        directory,
        "server",
        ca,
        ["subjectAltName=IP:127.0.0.1,DNS:localhost", "extendedKeyUsage=serverAuth"],
    )
    client = _make_leaf(directory, "client", ca, ["extendedKeyUsage=clientAuth"])
    other_ca = _make_ca(directory, "other-ca")
    stranger = _make_leaf(directory, "stranger", other_ca, ["extendedKeyUsage=clientAuth"])
    return Certs(ca[0], *server, *client, other_ca[0], *stranger)


# -- servers ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[ServerProcess]:
    # A short --message-timeout: it also bounds a TLS handshake.
    args = ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    server = ServerProcess(*args, "--message-timeout", "2")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mtls_server(certs: Certs) -> Iterator[ServerProcess]:
    server = ServerProcess(
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
        "--tls-client-ca", str(certs.ca),
    )  # fmt: skip
    yield server
    server.stop()


# The listener's warning about a client that does not speak TLS (net/listener.py).
PLAIN_LINE = "sent plain text to this TLS port"


def assert_quiet(server: ServerProcess) -> None:
    """Failed handshakes left nothing in the server's log: no traceback, error or
    warning, but the one line about plain-text clients (PLAIN_LINE)."""
    text = server.log_text()
    served = text[text.index("delaywheel listening on") :].splitlines()[1:]
    loud = [line for line in served if "ERROR" in line or "WARNING" in line]
    assert not [line for line in loud if PLAIN_LINE not in line], text
    assert "Traceback" not in text, text


def cli(server: ServerProcess, *args: str, env: dict[str, str] | None = None) -> Result:
    address = f"{server.host}:{server.port}"
    return CliRunner().invoke(main, ["--server", address, *args], env=env)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- a TLS server and the clients ------------------------------------------------------------------


def test_the_log_line_says_tls_and_stats_too(tls_server: ServerProcess, certs: Certs) -> None:
    assert f"delaywheel listening on {tls_server.host}:{tls_server.port} (TLS)" in (
        tls_server.log_text()
    )
    with Client(*tls_server.address, tls_ca=certs.ca) as dw:
        assert dw.stats()["tls"] is True


def test_plain_server_stats_say_no_tls(server: ServerProcess) -> None:
    with Client(*server.address) as dw:
        assert dw.stats()["tls"] is False


def test_client_with_the_ca_does_the_work(tls_server: ServerProcess, certs: Certs) -> None:
    with Client(*tls_server.address, tls_ca=str(certs.ca)) as dw:
        assert dw.ping() == "pong"
        added = dw.add("tls-blocking", {"order": 42}, id="tls-1")
        task = dw.get("tls-1")
        assert task is not None and task["body"] == {"order": 42}
        reserved = dw.reserve("tls-blocking", timeout=5)
        assert reserved is not None and reserved["id"] == added["id"]
        assert dw.ack("tls-1") is True
        assert dw.get("tls-1") is None


def test_a_pipeline_larger_than_a_tls_record(tls_server: ServerProcess, certs: Certs) -> None:
    with Client(*tls_server.address, tls_ca=certs.ca) as dw:
        with dw.pipeline() as pipe:  # ~0.6 MB: many TLS records, several write chunks
            for n in range(2000):
                pipe.add("tls-pipeline", b"x" * 300, delay=3600, id=f"tls-pipe-{n}")
        assert len(pipe.results) == 2000
        page = dw.list(topic="tls-pipeline", limit=1000)
        assert len(page["tasks"]) == 1000 and page["tasks"][0]["body"] == b"x" * 300


def test_async_client_with_the_ca(tls_server: ServerProcess, certs: Certs) -> None:
    async def scenario() -> None:
        async with await AsyncClient.connect(*tls_server.address, tls_ca=certs.ca) as dw:
            await dw.add("tls-async", "hello", id="tls-async-1")
            got = await asyncio.gather(*(dw.get("tls-async-1") for _ in range(50)))
            assert all(task is not None and task["body"] == "hello" for task in got)
            reserved = await dw.reserve("tls-async", timeout=5)
            assert reserved is not None and reserved["id"] == "tls-async-1"
            assert await dw.ack("tls-async-1") is True

    asyncio.run(scenario())


def test_the_host_name_is_checked(tls_server: ServerProcess, certs: Certs) -> None:
    port = tls_server.port
    with Client("localhost", port, tls_ca=certs.ca) as dw:  # the DNS name in the certificate
        assert dw.ping() == "pong"
    other_name = Client("127.0.0.1", port, tls_ca=certs.ca, server_hostname="queue.example.com")
    with other_name, pytest.raises(ConnectionFailed, match="did not verify: Hostname mismatch"):
        other_name.ping()


def test_a_client_without_the_ca_is_refused(tls_server: ServerProcess, certs: Certs) -> None:
    system_cas_only = Client(*tls_server.address, tls=True, retries=0)
    with system_cas_only, pytest.raises(ConnectionFailed, match="did not verify: unable to get"):
        system_cas_only.ping()

    async def scenario() -> None:
        with pytest.raises(ConnectionFailed, match="certificate did not verify"):
            await AsyncClient.connect(*tls_server.address, tls=True)

    asyncio.run(scenario())
    assert_quiet(tls_server)


def test_a_refused_certificate_is_not_retried(certs: Certs) -> None:
    """Connecting again would fail the same way: one handshake, then the error. Counted on
    a TLS listener of the test's own, since the server cannot see failed handshakes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    accepted: list[int] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def handshake() -> None:
            while True:
                conn, peer = listener.accept()
                accepted.append(peer[1])
                if peer[1] == sentinel_port[0]:
                    conn.close()
                    return
                with conn, suppress(OSError):  # ssl.SSLError: the client's alert
                    context.wrap_socket(conn, server_side=True).close()

        sentinel_port = [0]
        thread = threading.Thread(target=handshake, daemon=True)
        thread.start()
        dw = Client(*listener.getsockname()[:2], tls=True, retries=3)
        with dw, pytest.raises(ConnectionFailed, match="did not verify"):
            dw.ping()
        # Connections are accepted in order: once this one is, every earlier one was.
        with socket.socket() as sentinel:
            sentinel.bind(("127.0.0.1", 0))
            sentinel_port[0] = sentinel.getsockname()[1]
            sentinel.connect(listener.getsockname())
            thread.join(10)
    assert len(accepted) == 2  # the client's one attempt, and the sentinel


def test_a_tls_client_on_a_plain_server_says_so(server: ServerProcess, certs: Certs) -> None:
    dw = Client(*server.address, tls_ca=certs.ca)
    with dw, pytest.raises(ConnectionFailed, match="did not answer in TLS"):
        dw.ping()


def test_an_unloadable_ca_names_the_file(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ValueError, match=r"tls_ca '.*missing\.pem': No such file"):
        Client("127.0.0.1", 1, tls_ca=tmp_path / "missing.pem")
    with pytest.raises(ValueError, match=r"tls_ca '.*server\.key': no certificate"):
        Client("127.0.0.1", 1, tls_ca=certs.server_key)
    with pytest.raises(ValueError, match="key values mismatch"):
        Client("127.0.0.1", 1, tls_cert=certs.client_cert, tls_key=certs.server_key)
    with pytest.raises(ValueError, match="tls_key needs tls_cert"):
        Client("127.0.0.1", 1, tls_key=certs.client_key)


# -- plain text on a TLS port ----------------------------------------------------------------------


def test_a_plain_text_client_gets_no_answer(tls_server: ServerProcess, certs: Certs) -> None:
    with Client(*tls_server.address, tls_ca=certs.ca) as dw:
        for msgid in (0, 1):  # 1 makes the bytes look like the start of an SSLv2 hello
            with socket.create_connection(tls_server.address, timeout=5) as raw:
                raw.sendall(msgpack.packb([0, msgid, "ping", []]))
                raw.settimeout(0.5)
                try:
                    answer = raw.recv(100)
                except TimeoutError:
                    answer = b""  # nothing within the short wait: no answer either
                assert answer == b""
                assert dw.ping() == "pong"  # everyone else is served meanwhile
                # Closed at the latest after --message-timeout (2 s), the handshake's bound.
                raw.settimeout(10)
                assert raw.recv(100) == b""
        plain = Client(*tls_server.address, retries=0)
        with plain, pytest.raises(ConnectionFailed, match="closed the connection"):
            plain.ping()
        assert dw.ping() == "pong"
    # The first is logged: one line (then at most one every 10 s), naming the peer.
    wait_until(lambda: PLAIN_LINE in tls_server.log_text(), 10, "the plain-text line")
    assert "127.0.0.1:" in next(x for x in tls_server.log_text().splitlines() if PLAIN_LINE in x)
    assert_quiet(tls_server)


# -- mutual TLS ------------------------------------------------------------------------------------


def test_mutual_tls_needs_a_client_certificate(mtls_server: ServerProcess, certs: Certs) -> None:
    assert "(TLS, client certificates required)" in mtls_server.log_text()
    no_cert = Client(*mtls_server.address, tls_ca=certs.ca, retries=0)
    with no_cert, pytest.raises(ConnectionFailed, match=r"before any reply .*--tls-client-ca"):
        no_cert.ping()
    stranger = Client(
        *mtls_server.address,
        tls_ca=certs.ca,
        tls_cert=certs.stranger_cert,  # signed by a CA the server does not trust
        tls_key=certs.stranger_key,
        retries=0,
    )
    with stranger, pytest.raises(ConnectionFailed, match="before any reply"):
        stranger.ping()
    mine = Client(
        *mtls_server.address, tls_ca=certs.ca, tls_cert=certs.client_cert, tls_key=certs.client_key
    )
    with mine as dw:
        dw.add("mtls", 1, id="mtls-1")
        reserved = dw.reserve("mtls", timeout=5)
        assert reserved is not None and reserved["id"] == "mtls-1"
        assert dw.ack("mtls-1") is True
    assert_quiet(mtls_server)


def test_a_reset_before_any_reply_gets_the_same_hint_as_a_close() -> None:
    # What a TLS server does to a plain client, or an mTLS one to a client
    # without a certificate, may reach the client as RST instead of FIN (the
    # server closed with the request unread). A peer that resets at once:
    listener = socket.create_server(("127.0.0.1", 0))
    address = listener.getsockname()[:2]

    def reset_each() -> None:
        with suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.recv(100)  # the request has arrived
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                conn.close()

    threading.Thread(target=reset_each, daemon=True).start()
    try:
        hint = "before any reply (is the server using TLS? try --tls"
        with Client(*address, retries=0) as plain, pytest.raises(ConnectionFailed) as caught:
            plain.ping()
        assert "the server reset the connection during ping " + hint in str(caught.value)

        async def ping_async() -> None:
            async with AsyncClient(*address, retries=0) as aio:
                await aio.ping()

        with pytest.raises(ConnectionFailed) as caught_async:
            asyncio.run(ping_async())
        assert "the server reset the connection " + hint in str(caught_async.value)
    finally:
        listener.close()


def test_mutual_tls_async(mtls_server: ServerProcess, certs: Certs) -> None:
    async def scenario() -> None:
        async with AsyncClient(*mtls_server.address, tls_ca=certs.ca, retries=0) as refused:
            with pytest.raises(ConnectionFailed, match="before any reply"):
                await refused.ping()
        async with await AsyncClient.connect(
            *mtls_server.address,
            tls_ca=certs.ca,
            tls_cert=certs.client_cert,
            tls_key=certs.client_key,
        ) as dw:
            assert await dw.ping() == "pong"

    asyncio.run(scenario())


def test_mutual_tls_under_tls_1_2(mtls_server: ServerProcess, certs: Certs) -> None:
    """Under TLS 1.2 the server checks the client's certificate within the handshake."""
    context = ssl.create_default_context(cafile=certs.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    refused = Client(*mtls_server.address, tls=context)
    with refused, pytest.raises(ConnectionFailed, match=r"handshake failed: .*--tls-client-ca"):
        refused.ping()
    context.load_cert_chain(certs.client_cert, certs.client_key)
    with Client(*mtls_server.address, tls=context) as dw:
        assert dw.ping() == "pong"
        assert dw.stats()["tls"] is True


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_with_tls_and_the_ca(tls_server: ServerProcess, certs: Certs) -> None:
    tls = ["--tls", "--tls-ca", str(certs.ca)]
    added = cli(tls_server, *tls, "--json", "add", "--topic", "tls-cli", "--body", "hi")
    assert added.exit_code == 0, added.output
    task_id = json.loads(added.stdout)["id"]
    got = cli(tls_server, *tls, "--json", "get", task_id)
    assert json.loads(got.stdout)["body"] == "hi"
    reserved = cli(tls_server, *tls, "--json", "reserve", "tls-cli", "--timeout", "5")
    assert json.loads(reserved.stdout)["id"] == task_id
    assert cli(tls_server, *tls, "ack", task_id).exit_code == 0
    # The same from the environment.
    env = {"DELAYWHEEL_TLS": "1", "DELAYWHEEL_TLS_CA": str(certs.ca)}
    assert cli(tls_server, "ping", env=env).exit_code == 0


def test_cli_refused_certificate_is_one_line_exit_3(
    tls_server: ServerProcess, certs: Certs
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "delaywheel", "--server", f"{tls_server.host}:{tls_server.port}",
         "--tls", "ping"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 3
    assert "certificate did not verify" in one_line(done.stderr)


def test_cli_bad_ca_file_is_a_usage_error(tls_server: ServerProcess, certs: Certs) -> None:
    result = cli(tls_server, "--tls-ca", str(certs.server_key), "ping")
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith(f"--tls-ca '{certs.server_key}': no certificate")


def test_cli_mutual_tls(mtls_server: ServerProcess, certs: Certs) -> None:
    tls = ["--tls-ca", str(certs.ca)]  # implies --tls
    refused = cli(mtls_server, *tls, "ping")
    assert refused.exit_code == 3 and "before any reply" in one_line(refused.stderr)
    env = {"DELAYWHEEL_TLS_CLIENT_CERT": str(certs.client_cert),
           "DELAYWHEEL_TLS_CLIENT_KEY": str(certs.client_key)}  # fmt: skip
    assert cli(mtls_server, *tls, "ping", env=env).exit_code == 0
    mine = ["--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
    assert cli(mtls_server, *tls, *mine, "stats").exit_code == 0


# -- serve's checks --------------------------------------------------------------------------------


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delaywheel", "serve", "--port", "0", "--store", "memory://", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip


@pytest.mark.process
def test_serve_with_a_bad_cert_path_is_a_usage_error(tmp_path: Path, certs: Certs) -> None:
    missing = tmp_path / "nope.pem"
    done = serve("--tls-cert", str(missing), "--tls-key", str(certs.server_key))
    assert done.returncode == 2
    assert f"tls cert '{missing}': No such file or directory" in one_line(done.stderr)


SERVER_PAIR = ("--tls-cert", "{server_cert}", "--tls-key", "{server_key}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tls-cert", "{server_cert}"), "tls cert needs a tls key too"),
        (("--tls-client-ca", "{ca}"), "tls client ca needs a tls cert and key"),
        (("--tls-cert", "{server_key}", "--tls-key", "{server_key}"), "holds no PEM certificate"),
        (("--tls-cert", "{server_cert}", "--tls-key", "{server_cert}"), "holds no PEM private key"),
        (("--tls-cert", "{server_cert}", "--tls-key", "{client_key}"), "key values mismatch"),
        ((*SERVER_PAIR, "--tls-client-ca", "{dir}"), "Is a directory"),
        ((*SERVER_PAIR, "--tls-client-ca", "{server_key}"), "holds no PEM certificate"),
    ],
)
@pytest.mark.process
def test_serve_tls_checks(certs: Certs, args: tuple[str, ...], message: str) -> None:
    paths = {name: str(getattr(certs, name)) for name in ("server_cert", "server_key", "ca")}
    paths |= {"client_key": str(certs.client_key), "dir": str(certs.ca.parent)}
    done = serve(*(arg.format(**paths) for arg in args))
    assert done.returncode == 2
    assert message in one_line(done.stderr)


@pytest.mark.process
def test_serve_takes_the_tls_files_from_the_environment(tmp_path: Path, certs: Certs) -> None:
    missing = tmp_path / "nope.key"
    env = {**os.environ, "DELAYWHEEL_TLS_CERT": str(certs.server_cert),
           "DELAYWHEEL_TLS_KEY": str(missing)}  # fmt: skip
    done = serve(env=env)
    assert done.returncode == 2
    assert f"tls key '{missing}': No such file or directory" in one_line(done.stderr)


@pytest.mark.process
def test_the_http_api_speaks_tls_too(certs: Certs) -> None:
    """--tls-cert and --tls-key apply to --api-port: HTTPS, the same certificate."""
    server = ServerProcess(
        "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key), "--api-port", "0"
    )  # fmt: skip
    try:
        url = api_url(server)
        assert url.startswith("https://")
        port = int(url.split(":")[2].split("/")[0])
        context = ssl.create_default_context(cafile=str(certs.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        conn.request("POST", "/v1/tasks", body=json.dumps({"topic": "tls", "body": "secret"}))
        reply = conn.getresponse()
        assert reply.status == 201, reply.read()
        task_id = json.loads(reply.read())["id"]
        conn.close()
        with Client(*server.address, tls_ca=certs.ca) as dw:
            assert dw.get(task_id)["body"] == "secret"
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            plain.request("GET", "/v1/stats")
            plain.getresponse()
        plain.close()
    finally:
        server.stop()


@pytest.mark.process
@pytest.mark.redis
@pytest.mark.slow
def test_http_api_nodes_forward_to_each_other_over_tls(certs: Certs, redis_url: str) -> None:
    """Two TLS nodes: the one that does not own a task forwards over TLS, trusting the
    certificate they share."""
    tls = ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    nodes = [node(redis_url, name, *tls, "--api-port", "0") for name in ("a", "b")]
    try:

        def both_serve() -> bool:
            served = []
            for proc in nodes:
                with Client(*proc.address, tls_ca=certs.ca) as dw:
                    served.append({p["partition"] for p in dw.stats()["partitions"]})
            return all(served) and sum(map(len, served)) == PARTITIONS

        wait_until(both_serve, SETTLE_TIMEOUT_S, "two TLS nodes sharing the partitions")
        with Client(*nodes[1].address, tls_ca=certs.ca) as dw:
            theirs = {p["partition"] for p in dw.stats()["partitions"]}
        task_id = next(
            f"tls-{n}" for n in range(1000) if partition_of(f"tls-{n}", PARTITIONS) in theirs
        )
        url = api_url(nodes[0])
        port = int(url.split(":")[2].split("/")[0])
        context = ssl.create_default_context(cafile=str(certs.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
        conn.request("POST", "/v1/tasks", body=json.dumps({"id": task_id, "topic": "tls"}))
        reply = conn.getresponse()
        assert reply.status == 201, reply.read()
        reply.read()
        conn.request("GET", f"/v1/tasks/{task_id}")
        got = conn.getresponse()
        assert got.status == 200 and json.loads(got.read())["id"] == task_id
        conn.close()
    finally:
        for proc in nodes:
            proc.stop()
