"""The container pieces, checked without a Docker engine (our CI machines have none).

- docker-compose-run-sample.yml is valid compose (`docker-compose config`, which
  needs no engine), and refuses to start without a token.
- Its delaywheel service, as compose resolves it, runs for real: the image's
  CMD with the service's environment, from this venv, against a private
  redis-server started with the redis service's own flags. Only the store's
  host:port and the port binding change. The healthcheck (the Dockerfile's and
  the service's) passes against it and fails once it is gone, and a task goes
  through with the token.
- The optional RabbitMQ and NATS block, uncommented, is valid compose too, and
  the server takes the brokers it names.
- The two distributions `make build` makes, built from a copy of the tree and
  installed by file into fresh venvs that hold nothing else of ours: the
  server (with [fast], as the image installs it) serves and answers ping; the
  client alone imports with msgpack as its only company, and delaywheel does not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import RedisServer, free_port
from delaywheel_client import Client, errors
from serverproc import LISTENING, START_TIMEOUT_S, ServerProcess
from services import need_program

from delaywheel import __version__

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose-run-sample.yml"
DOCKERFILE = ROOT / "Dockerfile"
VENV_BIN = Path(sys.executable).parent
VERSION = __version__  # tests/test_packaging.py checks it against both pyproject.toml files

# What the compose file needs from its environment; the rest have defaults.
COMPOSE_ENV = {"DELAYWHEEL_TOKEN": "container-test-token", "RABBITMQ_PASSWORD": "rabbit-pass"}
CONTAINER_PORT = 3450  # the server's default, EXPOSEd and published by the sample
OUR_VARIABLES = ("DELAYWHEEL_", "RABBITMQ_", "COMPOSE_", "PYTHON", "VIRTUAL_ENV")
OPTIONAL_START, OPTIONAL_END = "# >>> optional", "# <<< optional"
COMMAND_TIMEOUT_S = 60
PIP_TIMEOUT_S = 240  # a fresh venv's dependencies, from the index (or its mirror)


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without our settings or Python's search paths, plus ``extra``."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith(OUR_VARIABLES)}
    return {**kept, **extra}


def _run(argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; a failure fails the test, saying what could not be done and why."""
    kwargs.setdefault("timeout", COMMAND_TIMEOUT_S)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        pytest.fail(f"{what} failed (exit {done.returncode}): {shlex.join(argv)}\n{tail}")
    return done


# -- compose ------------------------------------------------------------------------------


def _compose(file: Path, *args: str) -> list[str]:
    exe = need_program("docker-compose", "docker-compose")  # skips without it (fails in CI)
    return [exe, "--project-directory", str(ROOT), "-f", str(file), *args]


def _resolved(file: Path) -> dict[str, Any]:
    """The file as compose resolves it: variables filled in, defaults applied."""
    done = _run(_compose(file, "config"), "docker-compose config", env=_clean_env(**COMPOSE_ENV))
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def _argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else list(command)


def _dockerfile_instruction(name: str) -> str:
    """The arguments of the Dockerfile's last ``name`` instruction, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found = re.findall(rf"^{name}\s+(.*)$", joined, re.MULTILINE)
    assert found, f"no {name} in the Dockerfile"
    return str(found[-1])


def _dockerfile_cmd() -> list[str]:
    cmd: list[str] = json.loads(_dockerfile_instruction("CMD"))
    return cmd


def _dockerfile_healthcheck() -> list[str]:
    check: list[str] = json.loads(_dockerfile_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
    return check


def _ours(argv: list[str]) -> list[str]:
    """``delaywheel ...`` as this venv's delaywheel."""
    assert argv[0] == "delaywheel", argv
    return [str(VENV_BIN / "delaywheel"), *argv[1:]]


def _uncomment_optional(text: str) -> tuple[str, int]:
    """The file with its optional blocks uncommented (their ``##`` lines are prose)."""
    lines, inside, blocks = [], False, 0
    for line in text.splitlines(keepends=True):
        body = line.lstrip()
        if body.startswith((OPTIONAL_START, OPTIONAL_END)):
            inside = body.startswith(OPTIONAL_START)
            blocks += inside
            continue
        if inside and not body.startswith("##"):
            assert body.startswith("# "), f"not a commented-out line in an optional block: {line!r}"
            line = line[: len(line) - len(body)] + body[2:]
        lines.append(line)
    assert not inside, "an optional block is not closed"
    return "".join(lines), blocks


class Served:
    """A server started from an exact command line; stopped on leaving the ``with``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        self.log: list[str] = []
        self.host, self.port = "", 0
        self._listening = threading.Event()
        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{shlex.join(argv)} did not start:\n" + "\n".join(self.log))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                match = LISTENING.search(line)
                if match and not self._listening.is_set():
                    self.host, self.port = match.group(1), int(match.group(2))
                    self._listening.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _container_env(service: Mapping[str, Any], store_at: str) -> dict[str, str]:
    """The service's environment, its Redis moved to ``store_at`` (host:port) and
    its port to a free one: the two things a container's network decides."""
    env = {key: str(value) for key, value in service["environment"].items()}
    store = urllib.parse.urlsplit(env["DELAYWHEEL_STORE"])
    assert (store.scheme, store.hostname, store.port) == ("redis", "redis", 6379), store
    env["DELAYWHEEL_STORE"] = store._replace(netloc=store_at).geturl()
    assert "DELAYWHEEL_PORT" not in env  # the server listens on its default, 3450
    return _clean_env(**env, DELAYWHEEL_PORT="0")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _resolved(COMPOSE_FILE)


@pytest.fixture(scope="module")
def compose_redis(
    compose: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A private redis-server started with the redis service's own flags, standing
    in for it (the store URL keeps the service's database 0: each test flushes it)."""
    argv = _argv(compose["services"]["redis"]["command"])
    assert argv[0] == "redis-server"
    redis = RedisServer(tmp_path_factory.mktemp("compose-redis"), extra_args=argv[1:])
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


def _stand_in(redis: RedisServer) -> str:
    """``host:port`` of ``redis``, flushed, to put in the service's store URL."""
    with redis.client() as client:
        client.flushdb()
    return f"127.0.0.1:{redis.port}"


def test_the_compose_sample_is_valid_and_wants_a_token() -> None:
    check = _compose(COMPOSE_FILE, "config", "-q")
    _run(check, "docker-compose config -q", env=_clean_env(**COMPOSE_ENV))
    without = subprocess.run(
        check,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    assert without.returncode != 0
    assert "set DELAYWHEEL_TOKEN" in without.stderr


def test_the_compose_service_runs_as_configured(
    compose: dict[str, Any], compose_redis: RedisServer, tmp_path: Path
) -> None:
    services = compose["services"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    service = services["delaywheel"]
    assert service["depends_on"] == {"redis": {"condition": "service_healthy"}}
    assert service["ports"] == [f"127.0.0.1:{CONTAINER_PORT}:{CONTAINER_PORT}/tcp"]
    assert f"EXPOSE {CONTAINER_PORT}" in DOCKERFILE.read_text()
    assert service["restart"] == "unless-stopped"
    check = service["healthcheck"]["test"]
    assert check[0] == "CMD" and check[1:] == _dockerfile_healthcheck()
    address = f"127.0.0.1:{CONTAINER_PORT}"
    assert address in check

    env = _container_env(service, _stand_in(compose_redis))
    command = _ours(_argv(service.get("command") or _dockerfile_cmd()))
    with Served(command, env, tmp_path) as dw:
        assert dw.host == "0.0.0.0"  # listening beyond loopback, as a container must
        # The redis service's flags are what the server checks Redis for: no
        # durability warning about the store (its "connected" line is info).
        warnings = [line for line in dw.log if "WARNING" in line and " store redis://" in line]
        assert not warnings, dw.log
        healthcheck = _ours([f"127.0.0.1:{dw.port}" if a == address else a for a in check[1:]])
        assert "pong" in _run(healthcheck, "the healthcheck", env=env, cwd=tmp_path).stdout
        wrong = {**env, "DELAYWHEEL_TOKEN": "wrong"}
        refused = subprocess.run(healthcheck, env=wrong, capture_output=True, check=False)
        assert refused.returncode != 0, "the healthcheck does not send the token"

        with Client("127.0.0.1", dw.port) as anonymous, pytest.raises(errors.Unauthorized):
            anonymous.add("container", "no token")
        with Client("127.0.0.1", dw.port, token=env["DELAYWHEEL_TOKEN"]) as client:
            client.add("container", {"order": 42}, id="container-1")
            task = client.reserve(["container"], timeout=5)
            assert task is not None and task["body"] == {"order": 42}
            assert client.ack("container-1")
            assert client.get("container-1") is None
    gone = subprocess.run(healthcheck, env=env, capture_output=True, check=False)
    assert gone.returncode != 0, "the healthcheck passes with no server"


def test_the_optional_brokers_uncommented(compose_redis: RedisServer, tmp_path: Path) -> None:
    text, blocks = _uncomment_optional(COMPOSE_FILE.read_text())
    assert blocks == 3  # the broker setting, the two services, their volumes
    file = tmp_path / "compose-with-brokers.yml"
    file.write_text(text)
    resolved = _resolved(file)
    services = resolved["services"]
    assert "-js" in _argv(services["nats"]["command"])  # JetStream: NATS targets need it
    assert set(resolved["volumes"]) == {"redis-data", "rabbitmq-data", "nats-data"}
    service = services["delaywheel"]
    password = COMPOSE_ENV["RABBITMQ_PASSWORD"]
    assert service["environment"]["DELAYWHEEL_BROKERS"] == (
        f"jobs=amqp://delaywheel:{password}@rabbitmq:5672/,events=nats://nats:4222"
    )
    env = _container_env(service, _stand_in(compose_redis))
    # The brokers' hosts exist only on a compose network: the server starts
    # anyway and keeps trying them in the background. It is stopped only once
    # it has tried both: a SIGTERM while its first AMQP connect is in flight
    # can leave it hanging after "shutting down" (not what this test is about).
    with (
        Served(_ours(_dockerfile_cmd()), env, tmp_path) as dw,
        Client("127.0.0.1", dw.port, token=env["DELAYWHEEL_TOKEN"]) as client,
    ):
        deadline = time.monotonic() + 10
        while True:
            state = client.stats()["deliveries"]["brokers"]
            tried = [state[name]["failing_since"] is not None for name in ("jobs", "events")]
            if all(tried) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert state["jobs"]["kind"] == "amqp" and password not in state["jobs"]["url"]
    assert state["events"]["kind"] == "nats"
    assert all(tried), state


# -- the two distributions, installed alone -----------------------------------------------


SKIPPED_IN_COPY = shutil.ignore_patterns(
    ".git",
    ".venv",
    "dist",
    "build",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "*.db",
    "*.db-wal",
    "*.db-shm",
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make build` makes, built the same way (sdist, then the wheel from it)
    from a copy of the tree, so the build's leftovers stay out of the checkout."""
    src = tmp_path_factory.mktemp("src") / "delaywheel"
    shutil.copytree(ROOT, src, ignore=SKIPPED_IN_COPY)
    out = tmp_path_factory.mktemp("dist")
    said = []
    for project in (src / "client", src):
        done = _run(
            [sys.executable, "-m", "build", "--outdir", str(out), str(project)],
            f"building {project.name}",
            timeout=PIP_TIMEOUT_S,
            env=_clean_env(),
        )
        said.append(done.stdout + done.stderr)
    _build_output(out).write_text("\n".join(said))
    return out


def _build_output(dists: Path) -> Path:
    """Where what the builds printed is kept: beside the distributions' folder."""
    return dists.with_name(f"{dists.name}-build-output.txt")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_build_prints_no_package_warning(dists: Path) -> None:
    """setuptools once warned "Package would be ignored" for web/templates and
    web/static, about 100 lines on `make install`'s first run: it looked broken."""
    said = _build_output(dists).read_text()
    assert "would be ignored" not in said
    assert "is absent from the `packages` configuration" not in said


def _venv(path: Path, *requirements: str) -> Path:
    """A new venv (no system site-packages) with ``requirements``; its python."""
    _run([sys.executable, "-m", "venv", str(path)], "python -m venv", env=_clean_env())
    python = path / "bin" / "python"
    what = (
        f"pip installing {', '.join(Path(r).name for r in requirements)} into a fresh venv"
        " (the third-party dependencies come from the index or its mirror)"
    )
    _run(
        [str(python), "-m", "pip", "install", "--quiet", *requirements],
        what,
        timeout=PIP_TIMEOUT_S,
        env=_clean_env(),
        cwd=path,
    )
    return python


def _wheel(dists: Path, name: str) -> Path:
    return dists / f"{name}-{VERSION}-py3-none-any.whl"


# Which of our distributions a venv has, where from, and where their code is.
REPORT = """\
import importlib.metadata as md, importlib.util, json, sys
dists = {d.metadata["Name"]: d for d in md.distributions()}
ours = {}
for name in ("delaywheel", "delaywheel-client"):
    if name in dists:
        url = json.loads(dists[name].read_text("direct_url.json") or "{}").get("url")
        ours[name] = {"version": dists[name].version, "from": url}
found = {m: (s.origin if (s := importlib.util.find_spec(m)) else None)
         for m in ("delaywheel", "delaywheel_client", "uvloop")}
print(json.dumps({"dists": sorted(dists), "ours": ours, "modules": found,
                  "prefix": sys.prefix}))
"""


def _report(python: Path) -> dict[str, Any]:
    done = _run(
        [str(python), "-c", REPORT], "inspecting the venv", env=_clean_env(), cwd=python.parent
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.fixture(scope="module")
def server_venv(dists: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both wheels named by file, as the Dockerfile installs them: an index is
    asked only for the third-party dependencies."""
    return _venv(
        tmp_path_factory.mktemp("venv") / "server",
        str(_wheel(dists, "delaywheel_client")),
        f"{_wheel(dists, 'delaywheel')}[fast]",
    )


@pytest.fixture(scope="module")
def client_venv(dists: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(
        tmp_path_factory.mktemp("venv") / "client", str(_wheel(dists, "delaywheel_client"))
    )


def _members(archive: Path) -> list[str]:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            return wheel.namelist()
    with tarfile.open(archive) as sdist:
        return sdist.getnames()


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"{wheel.name.split('-')[0]}-{VERSION}.dist-info/METADATA")
    return re.findall(r"^Requires-Dist: (.*)$", metadata.decode(), re.MULTILINE)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_build_makes_two_distributions(dists: Path) -> None:
    assert sorted(path.name for path in dists.iterdir()) == [
        f"delaywheel-{VERSION}-py3-none-any.whl",
        f"delaywheel-{VERSION}.tar.gz",
        f"delaywheel_client-{VERSION}-py3-none-any.whl",
        f"delaywheel_client-{VERSION}.tar.gz",
    ]
    server, client = _wheel(dists, "delaywheel"), _wheel(dists, "delaywheel_client")
    assert {name.split("/")[0] for name in _members(server)} == {
        "delaywheel",
        f"delaywheel-{VERSION}.dist-info",
    }
    assert {name.split("/")[0] for name in _members(client)} == {
        "delaywheel_client",
        f"delaywheel_client-{VERSION}.dist-info",
    }
    assert "delaywheel/py.typed" in _members(server)
    assert "delaywheel_client/py.typed" in _members(client)
    assert f"delaywheel_client-{VERSION}.dist-info/licenses/LICENSE" in _members(client)
    assert f"delaywheel-client=={VERSION}" in _requires(server)
    assert _requires(client) == ["msgpack>=1.0.5"]
    sdist = _members(dists / f"delaywheel-{VERSION}.tar.gz")
    assert not [name for name in sdist if "delaywheel_client" in name or "/client/" in name]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_server_wheels_alone_serve(server_venv: Path, dists: Path, tmp_path: Path) -> None:
    report = _report(server_venv)
    assert report["prefix"] == str(server_venv.parent.parent)
    for name, wheel in (("delaywheel", "delaywheel"), ("delaywheel-client", "delaywheel_client")):
        assert report["ours"][name] == {
            "version": VERSION,
            "from": _wheel(dists, wheel).as_uri(),
        }, report
    for module in ("delaywheel", "delaywheel_client", "uvloop"):
        assert report["modules"][module].startswith(report["prefix"]), report

    bin_dir = server_venv.parent
    serve = [str(bin_dir / "delaywheel"), "serve", "--store", "memory://", "--port", "0"]
    with Served(serve, _clean_env(), tmp_path) as dw:
        ping = [str(bin_dir / "delaywheel"), "--server", f"127.0.0.1:{dw.port}", "ping"]
        assert "pong" in _run(ping, "delaywheel ping", env=_clean_env(), cwd=tmp_path).stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_client_wheel_alone_needs_msgpack_only(
    client_venv: Path, dists: Path, server: ServerProcess
) -> None:
    report = _report(client_venv)
    assert set(report["dists"]) - {"pip", "setuptools"} == {"delaywheel-client", "msgpack"}
    assert report["ours"] == {
        "delaywheel-client": {
            "version": VERSION,
            "from": _wheel(dists, "delaywheel_client").as_uri(),
        }
    }
    assert report["modules"]["delaywheel_client"].startswith(report["prefix"])
    server_import = subprocess.run(
        [str(client_venv), "-c", "import delaywheel"],
        capture_output=True,
        text=True,
        check=False,
        cwd=client_venv.parent,
        env=_clean_env(),
    )
    assert server_import.returncode != 0
    assert "No module named 'delaywheel'" in server_import.stderr
    ping = f"from delaywheel_client import Client; print(Client('127.0.0.1', {server.port}).ping())"
    done = _run(
        [str(client_venv), "-c", ping], "the client alone", env=_clean_env(), cwd=client_venv.parent
    )
    assert done.stdout.strip() == "pong"


HA_COMPOSE_FILE = ROOT / "docker-compose-ha-sample.yml"


HA_REDIS = ("redis-primary", "redis-replica-1", "redis-replica-2")
HA_SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")


def test_the_ha_compose_sample_is_valid_and_wires_sentinel() -> None:
    """A primary, two replicas, three Sentinels (quorum 2) and two nodes on them."""
    _run(_compose(HA_COMPOSE_FILE, "config", "-q"), "config -q", env=_clean_env(**COMPOSE_ENV))
    services = _resolved(HA_COMPOSE_FILE)["services"]
    assert sorted(services) == sorted([*HA_REDIS, *HA_SENTINELS, "node-1", "node-2"])
    # Two replicas of the first primary: with --replicas 1, a failover leaves
    # the promoted one a replica to confirm WAIT 1 (docs/ha.md).
    assert [services[name]["environment"].get("REPLICAOF") for name in HA_REDIS] == [
        None,
        "redis-primary",
        "redis-primary",
    ]
    for name in (*HA_REDIS, *HA_SENTINELS):
        # Each server keeps its config file on a volume of its own, for
        # Sentinel to rewrite; each has a health check the nodes wait for.
        script = " ".join(services[name]["command"])
        assert "if [ ! -f /data/" in script, name
        assert [_volume(v)[1] for v in services[name]["volumes"]] == ["/data"], name
        assert "redis-cli" in services[name]["healthcheck"]["test"], name
    for name in HA_REDIS:
        script = " ".join(services[name]["command"])
        assert "appendonly yes" in script and "maxmemory-policy noeviction" in script, name
    for name in HA_SENTINELS:
        script = " ".join(services[name]["command"])
        assert "sentinel monitor dwmaster redis-primary 6379 2" in script
        assert "sentinel down-after-milliseconds dwmaster 5000" in script
        assert "--sentinel" in script
    volumes = {_volume(services[name]["volumes"][0])[0] for name in (*HA_REDIS, *HA_SENTINELS)}
    assert len(volumes) == len(HA_REDIS) + len(HA_SENTINELS)
    seeds = ",".join(f"{name}:26379" for name in HA_SENTINELS)
    for number, name in enumerate(("node-1", "node-2"), start=1):
        environment = services[name]["environment"]
        assert environment["DELAYWHEEL_STORE"] == f"redis+sentinel://{seeds}/dwmaster/0"
        assert environment["DELAYWHEEL_TOKEN"] == COMPOSE_ENV["DELAYWHEEL_TOKEN"]
        # The HA settings are real, not commented out: a name of its own, the
        # address the host reaches it on (its published port: the header runs
        # the CLI from the host), and a replica awaited before every reply.
        assert environment["DELAYWHEEL_NODE"] == name
        assert environment["DELAYWHEEL_ADVERTISE"] == f"127.0.0.1:345{number}"
        assert environment["DELAYWHEEL_REPLICAS"] == "1"
        # A lease below the Sentinels' down-after (5 s): every node self-fences
        # on a frozen primary before the Sentinels replace it (docs/ha.md).
        assert float(environment["DELAYWHEEL_LEASE"]) < 5.0
        waits = services[name]["depends_on"]
        assert set(waits) == {"redis-primary", *HA_SENTINELS}
        assert {wait["condition"] for wait in waits.values()} == {"service_healthy"}
        assert services[name]["ports"] == [f"127.0.0.1:345{number}:3450/tcp"]
    header = HA_COMPOSE_FILE.read_text().split("\nx-", 1)[0]
    assert "--server 127.0.0.1:3451,127.0.0.1:3452" in header


def _volume(volume: str | dict[str, str]) -> tuple[str, str]:
    """(source, target) of a volume as docker-compose v1 ("src:/data:rw") or v2 shows it."""
    if isinstance(volume, dict):
        return volume["source"], volume["target"]
    source, target = volume.split(":")[:2]
    return source, target


def _ha_script(services: dict[str, Any], name: str, data: Path, ports: dict[str, int]) -> str:
    """Service ``name``'s shell script, run here: its /data is ``data``, and each
    compose name with its port 6379 or 26379 is 127.0.0.1 on a port of ``ports``."""
    # `$$` is compose's escape of `$` (docker-compose v1's config keeps it).
    script = services[name]["command"][-1].replace("$$", "$").replace("/data", str(data))
    own = ports[name]
    script = script.replace("port 26379", f"port {own}").replace("'port 6379'", f"'port {own}'")
    script = script.replace("redis-primary 6379", f"127.0.0.1 {ports['redis-primary']}")
    return script.replace("$REPLICAOF 6379", f"$REPLICAOF {ports['redis-primary']}")


@pytest.mark.slow
@pytest.mark.redis
def test_the_ha_samples_servers_keep_their_roles_across_a_failover(tmp_path: Path) -> None:
    """The sample's Redis and Sentinel scripts, run here on private ports: the
    Sentinels fail the primary over to a replica, which still has a replica
    (the other follows it), and both rewrite their config files, so a replica
    restarted from its script follows the new primary, not the dead one."""
    need_program("redis-server", "redis-server")
    services = _resolved(HA_COMPOSE_FILE)["services"]
    ports = {name: free_port() for name in (*HA_REDIS, *HA_SENTINELS)}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> None:
        data = tmp_path / name
        data.mkdir(exist_ok=True)
        environment = services[name].get("environment", {})
        env = {
            **_clean_env(),
            "ANNOUNCE": "127.0.0.1",
            **({"REPLICAOF": "127.0.0.1"} if "REPLICAOF" in environment else {}),
        }
        procs[name] = subprocess.Popen(
            ["sh", "-c", _ha_script(services, name, data, ports)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def redis(name: str) -> Any:
        import redis as redis_py

        return redis_py.Redis(port=ports[name], socket_timeout=2, decode_responses=True)

    def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}")

    try:
        for name in (*HA_REDIS, *HA_SENTINELS):
            start(name)
            wait_for(f"{name} to answer", lambda name=name: redis(name).ping())
        for name in HA_REDIS[1:]:
            wait_for(
                f"{name} to sync",
                lambda name=name: redis(name).info("replication")["master_link_status"] == "up",
            )
        primary = redis("redis-primary")
        primary.set("before-the-failover", "1")
        assert primary.wait(2, 2000) == 2
        procs["redis-primary"].kill()
        procs["redis-primary"].wait()

        def promoted() -> str | None:
            for name in HA_REDIS[1:]:
                if redis(name).info("replication")["role"] == "master":
                    return name
            return None

        wait_for("a replica to be promoted", lambda: promoted() is not None, timeout_s=40)
        new_primary = promoted()
        assert new_primary is not None
        other = next(name for name in HA_REDIS[1:] if name != new_primary)
        # The promoted primary still has a replica: WAIT 1 is confirmed.
        wait_for(
            f"{other} to follow {new_primary}",
            lambda: redis(new_primary).info("replication")["connected_slaves"] == 1,
            timeout_s=40,
        )
        redis(new_primary).set("after-the-failover", "1")
        assert redis(new_primary).wait(1, 2000) == 1
        # Sentinel rewrote both files: no replicaof in the promoted one's,
        # the new primary's port in the other's.
        promoted_conf = (tmp_path / new_primary / "redis.conf").read_text()
        assert "replicaof" not in promoted_conf
        other_conf = (tmp_path / other / "redis.conf").read_text()
        assert f"replicaof 127.0.0.1 {ports[new_primary]}" in other_conf
        # A restart from the same script keeps the role Sentinel gave it.
        procs[other].kill()
        procs[other].wait()
        start(other)
        wait_for(
            f"{other} to follow {new_primary} after its restart",
            lambda: (
                redis(other).info("replication")["master_port"] == ports[new_primary]
                and redis(other).info("replication")["master_link_status"] == "up"
            ),
        )
        assert redis(other).get("after-the-failover") == "1"
        for name in HA_SENTINELS:
            assert f"{ports[new_primary]}" in (tmp_path / name / "sentinel.conf").read_text()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
