"""schedule_next over the wire: an in-process server on a real port, spoken to by
AsyncClient (docs/protocol.md, docs/schedules.md)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from delaywheel_client import AsyncClient
from delaywheel_client.errors import DelaywheelError

from delaywheel.config import Settings
from delaywheel.engine.engine import Engine
from delaywheel.net.server import Server
from delaywheel.store.memory import MemoryStore


async def _ask(*calls: tuple[Any, ...]) -> list[Any]:
    """Each ``(schedule, n?)`` sent as schedule_next; a result or the error raised."""
    config = Settings(port=0, store_url="memory://", tick_s=0.05)
    store = MemoryStore("memory://")
    await store.open()
    engine = Engine(store, now_s=time.time(), tick_s=config.tick_s, limits=config.limits)
    server = Server(config, engine)
    address = await server.start()
    out: list[Any] = []
    try:
        async with await AsyncClient.connect(*address) as dw:
            for params in calls:
                try:
                    out.append(await dw.schedule_next(*params))
                except DelaywheelError as error:
                    out.append(error)
    finally:
        await server.stop()
        await store.close()
    return out


def test_schedule_next_previews_a_spec_from_now() -> None:
    before = time.time()
    cron, every, default = asyncio.run(
        _ask(
            ({"cron": "30 1 * * *", "tz": "Europe/London"}, 3),
            ({"every": 600, "anchor": 60}, 2),
            ({"cron": "*/5 * * * *"},),
        )
    )
    assert cron["description"].startswith("At 01:30 every day (Europe/London")
    assert len(cron["times"]) == 3
    first = cron["times"][0]
    assert before < first["utc"] <= before + 86_400 + 3600
    assert first["local"][11:19] == "01:30:00"
    assert [t["utc"] % 600 for t in every["times"]] == [60, 60]
    assert every["times"][1]["utc"] - every["times"][0]["utc"] == 600
    assert len(default["times"]) == 5  # n defaults to 5


@pytest.mark.parametrize(
    ("params", "code", "needle"),
    [
        (({"cron": "0 25 * * *"}, 1), "bad_request", "bad hour field '25' at position 3"),
        (({"cron": "0 1 * * *", "tz": "Local"}, 1), "bad_request", "IANA zone name"),
        (({"every": 0.01}, 1), "bad_request", "every must be at least the tick (0.05 s)"),
        (({"every": 60, "topic": "t"}, 1), "bad_request", "unknown field 'topic'"),
        (({"every": 60}, 1001), "bad_request", "n must be an int from 1 to 1000"),
        ((5, 1), "bad_request", "a schedule id or a spec map"),
        (("nightly", 1), "not_found", "no schedule 'nightly'"),
    ],
)
def test_schedule_next_refusals_name_the_value(
    params: tuple[Any, ...], code: str, needle: str
) -> None:
    (error,) = asyncio.run(_ask(params))
    assert isinstance(error, DelaywheelError)
    assert error.code == code and needle in error.message
