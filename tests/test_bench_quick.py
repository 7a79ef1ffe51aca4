"""The bench harness end to end, in quick mode: real servers, tiny counts.

``python -m bench --quick --json --results DIR SECTION ...`` (``SECTIONS``)
runs in a subprocess (as ``make bench`` would, each section in its own
interpreter); the test checks the JSON it prints and saves: every compare
figure there with a positive value, the beanstalkd and Redis figures there
when those are installed and the skip message in their place when not; the
fire, lateness, journal, horizon and recovery figures there, finite and positive (the
lateness section's early count an int, 0 allowed); the deliveries figures
likewise (the rate-limited topic's too: its arrivals per 100 ms in order, its
most in 1 s carrying the limit's bound), those of RabbitMQ and NATS too: that
test is marked ``brokers``, so it runs only when both answer
(tests/services.py skips it otherwise, and in CI, where .ci/run starts them,
fails it).
Nothing about the figures' size is asserted: this is the harness's test,
not the server's.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# One run of the bench for the module, about a minute; it starts servers (and
# redis-server and beanstalkd when installed), and its deliveries section
# talks to RabbitMQ and NATS.
pytestmark = [pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
# the sections with a quick mode that is quick
SECTIONS = (
    "compare",
    "fire",
    "lateness",
    "wheel",
    "journal",
    "horizon",
    "recovery",
    "deliveries",
    "connections",
    "schedules",
    "ha",
    "http_api",
)
RUN_TIMEOUT_S = 300.0  # slow CI machines get room

ALWAYS = {
    "echo_ping_rate",
    "echo_cpu_us",
    "ping_rate",
    "ping_cpu_us",
    "ping_cpu_vs_echo",
    "get_rate",
    "get_cpu_us",
    "get_cpu_vs_echo",
    "add_memory_rate",
    "add_memory_vs_echo",
    "add_many_memory_rate",
    "pipeline_memory_rate",
    "reserve_ack_rate",
    "reserve_vs_echo",
    "add8_memory_rate",
    "add8_sqlite_rate",
    "memory_added_bytes",
    "memory_added_sqlite_bytes",
    "memory_loaded_bytes",
}
WITH_REDIS = {
    "add_redis_rate",
    "add_many_redis_rate",
    "add_many_redis_vs_memory",
    "add8_redis_rate",
}
WITH_BEANSTALKD = {
    "bs_put_rate",
    "add_memory_vs_bs",
    "bs_binlog_put_rate",
    "add_many_memory_vs_bs",
    "bs_put_batches_rate",
    "pipeline_memory_vs_bs",
    "bs_reserve_delete_rate",
    "reserve_vs_bs",
    "bs8_put_rate",
    "add8_memory_vs_bs",
    "bs8_binlog_put_rate",
    "add8_sqlite_vs_bs_binlog",
    "bs_memory_bytes",
    "memory_added_vs_bs",
    "memory_added_sqlite_vs_bs",
    "memory_loaded_vs_bs",
}
WITH_BOTH = {"add_redis_vs_bs_binlog", "add8_redis_vs_bs_binlog"}

# The deliveries section: each destination's rate and server CPU per delivery.
DELIVERIES_ALWAYS = {
    "http_rate",
    "http_cpu_us",
    "http_slow_rate",
    "http_slow_cpu_us",
    "burst_lateness_p50_ms",
    "burst_lateness_p99_ms",
    "burst_lateness_max_ms",
    "burst_http_rate",
}
DELIVERIES_WITH_REDIS = {
    "redis_list_rate",
    "redis_list_cpu_us",
    "redis_stream_rate",
    "redis_stream_cpu_us",
}
DELIVERIES_WITH_RABBITMQ = {"amqp_rate", "amqp_cpu_us"}
DELIVERIES_WITH_NATS = {"nats_rate", "nats_cpu_us"}
# The rate-limited topic (500/s, its default burst 10): the rate at the sink, arrivals per
# 100 ms, and the most in any 1 s against the contract's rate x 1 s + burst.
DELIVERIES_LIMITED = {
    "limited_rate",
    "limited_window_min",
    "limited_window_p5",
    "limited_window_p50",
    "limited_window_p95",
    "limited_window_max",
    "limited_1s_max",
}


def beanstalkd_usable() -> bool:
    return (
        shutil.which("beanstalkd") is not None
        and importlib.util.find_spec("greenstalk") is not None
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Path]]:
    results = tmp_path_factory.mktemp("results")
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json", "--results", str(results), *SECTIONS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc, sorted(results.glob("*.json"))


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_run_is_saved_as_printed(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    doc, saved = quick_run
    assert len(saved) == 1
    assert json.loads(saved[0].read_text()) == doc
    assert doc["quick"] is True
    assert doc["cpus"] >= 1
    assert doc["python"] and doc["platform"] and doc["date"]
    assert set(doc["sections"]) == set(SECTIONS)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_every_compare_figure_is_there_and_positive(
    quick_run: tuple[dict[str, Any], list[Path]],
) -> None:
    compare = quick_run[0]["sections"]["compare"]
    figures: dict[str, Any] = compare["figures"]
    skipped: list[str] = compare["params"]["skipped"]
    expected = set(ALWAYS)
    redis = shutil.which("redis-server") is not None
    beanstalkd = beanstalkd_usable()
    if redis:
        expected |= WITH_REDIS
    else:
        assert any("redis-server" in message for message in skipped), skipped
    if beanstalkd:
        expected |= WITH_BEANSTALKD
    else:
        assert any("beanstalkd figures skipped" in message for message in skipped), skipped
    if redis and beanstalkd:
        expected |= WITH_BOTH
        assert skipped == []
    assert set(figures) == expected
    for key, figure in figures.items():
        value = figure["value"]
        assert math.isfinite(value) and value > 0, (key, value)
        if figure["unit"] != "x":
            # a median of alternating rounds lists every round (memory is measured once)
            assert len(figure["runs"]) in (0, compare["params"]["rounds"]), key


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_ratios_carry_their_targets(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    figures = quick_run[0]["sections"]["compare"]["figures"]
    ratios = {key: figure for key, figure in figures.items() if figure["unit"] == "x"}
    assert "add_memory_vs_echo" in ratios
    if beanstalkd_usable():
        assert {"add_memory_vs_bs", "reserve_vs_bs", "memory_added_vs_bs"} <= set(ratios)
    for key, figure in ratios.items():
        if key == "add8_sqlite_vs_bs_binlog":  # reported without a target
            assert figure["target"] is None
        else:
            assert figure["target"]["op"] in (">=", "<=") and figure["target"]["value"] > 0, key


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_wheel_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    wheel = quick_run[0]["sections"]["wheel"]
    assert wheel["params"]["quick"] is True
    assert wheel["figures"]["insert_rate"]["value"] > 0
    assert wheel["figures"]["fire_rate"]["value"] > 0


def stores_measured() -> list[str]:
    """The stores the journal and recovery sections run on here (Redis when installed)."""
    return ["sqlite", "redis"] if shutil.which("redis-server") is not None else ["sqlite"]


def assert_finite_positive(figures: dict[str, Any]) -> None:
    for key, figure in figures.items():
        value = figure["value"]
        assert math.isfinite(value) and value > 0, (key, value)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_journal_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    journal = quick_run[0]["sections"]["journal"]
    assert journal["params"]["quick"] is True
    figures: dict[str, Any] = journal["figures"]
    kinds = ("adds", "batch_mean", "round_trips")
    stores = ["memory", *stores_measured()]
    assert set(figures) == {f"{kind}_{store}" for kind in kinds for store in stores}
    assert_finite_positive(figures)
    for store in stores:
        assert figures[f"round_trips_{store}"]["target"] == {"op": "<=", "value": 1.0}


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_horizon_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    horizon = quick_run[0]["sections"]["horizon"]
    assert horizon["params"]["tasks"] == 2_000
    assert horizon["params"]["far_tasks"] == 0  # no lateness run: a pull takes 30 s
    figures: dict[str, Any] = horizon["figures"]
    kinds = ("fill_rate", "rss_added_mb", "restart_listening_s", "restart_serving_s")
    kinds += ("rss_restarted_mb", "stop_s")
    # quick: SQLite alone (Redis costs two more server starts)
    assert set(figures) == {f"sqlite_{kind}" for kind in kinds} | {"sqlite_file_bytes_per_task"}
    assert_finite_positive(figures)
    assert figures["sqlite_rss_added_mb"]["target"] == {"op": "<=", "value": 300.0}
    assert figures["sqlite_restart_serving_s"]["target"] == {"op": "<=", "value": 2.0}


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_recovery_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    recovery = quick_run[0]["sections"]["recovery"]
    assert recovery["params"]["quick"] is True
    figures: dict[str, Any] = recovery["figures"]
    expected: set[str] = set()
    for store in stores_measured():
        expected |= {f"recovery_{store}{mix}_s" for mix in ("", "_hour", "_ready")}
        expected |= {f"floor_{store}_s", f"recovery_{store}_vs_floor"}
        assert figures[f"recovery_{store}_vs_floor"]["target"] == {"op": "<=", "value": 2.0}
    assert set(figures) == expected
    assert_finite_positive(figures)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_fire_burst_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    fire = quick_run[0]["sections"]["fire"]
    assert fire["params"]["quick"] is True
    figures: dict[str, Any] = fire["figures"]
    assert set(figures) == {"made_ready_rate", "burst_ms", "stall_ms"}
    assert_finite_positive(figures)
    for figure in figures.values():
        assert len(figure["runs"]) == fire["params"]["runs"]
    assert figures["made_ready_rate"]["target"] == {"op": ">=", "value": 200_000}
    assert figures["stall_ms"]["target"] == {"op": "<=", "value": 20}


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_lateness_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    lateness = quick_run[0]["sections"]["lateness"]
    params = lateness["params"]
    assert params["quick"] is True
    assert params["received"] + params["missing"] == params["tasks"]
    figures: dict[str, Any] = dict(lateness["figures"])
    early = figures.pop("early")
    assert isinstance(early["value"], int) and early["value"] >= 0, early
    assert early["target"] == {"op": "<=", "value": 0}
    assert set(figures) == {
        "lateness_p50_ms",
        "lateness_p99_ms",
        "lateness_max_ms",
        "load_add_rate",
    }
    assert_finite_positive(figures)
    assert figures["lateness_p99_ms"]["target"] == {"op": "<=", "value": 15}
    assert figures["lateness_max_ms"]["target"] == {"op": "<=", "value": 50}


@pytest.mark.brokers
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_deliveries_run_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    deliveries = quick_run[0]["sections"]["deliveries"]
    params = deliveries["params"]
    assert params["quick"] is True
    skipped: list[str] = params["skipped"]
    # Both brokers answer (the brokers marker), so their figures are required.
    expected = DELIVERIES_ALWAYS | DELIVERIES_LIMITED
    expected |= DELIVERIES_WITH_RABBITMQ | DELIVERIES_WITH_NATS
    if shutil.which("redis-server") is not None:
        expected |= DELIVERIES_WITH_REDIS
    else:
        assert any("redis-server" in message for message in skipped), skipped
    figures: dict[str, Any] = dict(deliveries["figures"])
    early = figures.pop("burst_early")
    assert isinstance(early["value"], int) and early["value"] >= 0, early
    assert early["target"] == {"op": "<=", "value": 0}
    assert set(figures) == expected
    # a stall of 100 ms at the server or the sink leaves a window empty: 0 allowed
    fewest = figures["limited_window_min"]["value"]
    assert isinstance(fewest, int) and fewest >= 0, fewest
    assert_finite_positive({k: v for k, v in figures.items() if k != "limited_window_min"})
    # every destination measured says how many of its attempts failed
    assert set(params["failed"]) == {
        key.removesuffix("_rate")
        for key in expected
        if key.endswith("_rate") and key != "burst_http_rate"
    }
    assert params["burst_received"] + params["burst_missing"] == params["burst_queue"]
    # every window's count within the min..max the run saw, in order
    windows = [figures[f"limited_window_{name}"]["value"] for name in ("min", "p5", "p50")]
    windows += [figures[f"limited_window_{name}"]["value"] for name in ("p95", "max")]
    assert windows == sorted(windows), windows
    assert "burst 10" in figures["limited_rate"]["note"]
    # the lateness targets of the lateness section, and the rate limit's bound
    # over 1 s (rate 500 x 1 s + burst 10); rates and CPU carry none
    targets = {
        "burst_lateness_p99_ms": {"op": "<=", "value": 15},
        "burst_lateness_max_ms": {"op": "<=", "value": 50},
        "limited_1s_max": {"op": "<=", "value": 510},
    }
    for key, figure in figures.items():
        assert figure["target"] == targets.get(key), key


# The connections section: each server's figures, under its prefix (dw, redis, bs).
CONNECTIONS_FIGURES = (
    "idle_bytes",
    "blocked_bytes",
    "answer_1000_ms",
    "answer_5000_ms",
    "accept_rate",
)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_connections_run_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    """delaywheel's figures, Redis's and beanstalkd's when installed, side by side."""
    connections = quick_run[0]["sections"]["connections"]
    params = connections["params"]
    assert params["quick"] is True
    skipped: list[str] = params["skipped"]
    servers = ["dw"]
    if shutil.which("redis-server") is not None:
        servers.append("redis")
    else:
        assert any("redis-server" in message for message in skipped), skipped
    if beanstalkd_usable():
        servers.append("bs")
    else:
        assert any("beanstalkd figures skipped" in message for message in skipped), skipped
    figures: dict[str, Any] = connections["figures"]
    expected = {f"{server}_{name}" for server in servers for name in CONNECTIONS_FIGURES}
    assert set(figures) == expected
    assert_finite_positive(figures)
    for key, figure in figures.items():
        if key.endswith(("_ms", "_rate")):  # a median of rounds lists every round
            assert len(figure["runs"]) == params["rounds"], key
    # delaywheel's carry the bounds; the others are for comparison
    targets = {
        "dw_idle_bytes": {"op": "<=", "value": 8192},
        "dw_blocked_bytes": {"op": "<=", "value": 8192},
        "dw_answer_1000_ms": {"op": "<=", "value": 1000},
        "dw_answer_5000_ms": {"op": "<=", "value": 1000},
    }
    for key, figure in figures.items():
        assert figure["target"] == targets.get(key), key


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_schedules_run_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    """The schedules section: add rate, memory per schedule and the fire p99
    against the tick, every schedule fired once with none missed or skipped."""
    section = quick_run[0]["sections"]["schedules"]
    assert section["params"]["quick"] is True
    figures: dict[str, Any] = section["figures"]
    assert set(figures) == {"add_rate", "bytes_per_schedule", "fire_p99_ms"}
    assert_finite_positive(figures)
    assert figures["fire_p99_ms"]["target"] == {"op": "<=", "value": 1000.0}
    assert "missed 0, skipped 0" in figures["fire_p99_ms"]["note"]


def test_http_api_runs_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    """The http_api section: HTTP adds one at a time and from 8 connections, the
    native adds beside them, and the two ratios."""
    section = quick_run[0]["sections"]["http_api"]
    assert section["params"]["quick"] is True
    figures: dict[str, Any] = section["figures"]
    rates = {f"{kind}_{n}_rate" for kind in ("http", "native") for n in ("one", "8")}
    assert set(figures) == rates | {"http_vs_native_one", "http_vs_native_8"}
    assert_finite_positive(figures)
    assert all("server CPU" in figures[key]["note"] for key in rates)


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_ha_run_quick(quick_run: tuple[dict[str, Any], list[Path]]) -> None:
    """The ha section: the replicas ratio, the takeover and the two-node ratio."""
    section = quick_run[0]["sections"]["ha"]
    assert section["params"]["quick"] is True
    figures: dict[str, Any] = section["figures"]
    assert set(figures) == {
        "add_replicas0", "add_replicas1", "replicas_ratio", "takeover_first_s",
        "nodes1_rate", "nodes2_rate", "nodes_ratio",
    }  # fmt: skip
    assert_finite_positive(figures)
    assert figures["takeover_first_s"]["target"] == {"op": "<=", "value": 6.0}
