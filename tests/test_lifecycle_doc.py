"""docs/protocol.md's lifecycle against the engine's one transition table.

The drawing is for reading; the table under it ("Every transition") is
generated from ``delaywheel.engine.task.TRANSITIONS`` by ``render`` below and
must match it exactly, so the page cannot drift from what the engine allows.
The drawing is held to the table too: every state and event it must show.
"""

from __future__ import annotations

import re
from pathlib import Path

from delaywheel.engine.task import STATES, TRANSITIONS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
BEGIN = (
    "<!-- transitions: generated from delaywheel/engine/task.py,"
    " see tests/test_lifecycle_doc.py -->"
)
END = "<!-- /transitions -->"
# What the drawing calls an event that the table names for the engine.
DRAWN_AS = {
    "due": "due",
    "reserve": "reserve",
    "ack": "ack",
    "release": "release",
    "expire": "TTR expired",
    "kick": "kick",
    "deliver": "due",
    "delivered": "2xx / confirmed",
    "fail": "failed",
    "add": "add",
    "update": "update",
    "delete": "delete",
    "lapse": "retention over",
}
# Events the drawing leaves to the text under it.
NOT_DRAWN = {"touch"}
ORDER = ("new", *STATES, "gone")


def render() -> str:
    rows = sorted(TRANSITIONS.items(), key=lambda item: (ORDER.index(item[0][0]), item[0][1]))
    lines = ["| from | event | to |", "|---|---|---|"]
    for (state, event), targets in rows:
        to = ", ".join(f"`{name}`" for name in sorted(targets, key=ORDER.index))
        lines.append(f"| `{state}` | `{event}` | {to} |")
    return "\n".join(lines)


def _section() -> str:
    text = PAGE.read_text()
    return text[text.index("## Lifecycle") :].split("\n## ", 1)[0]


def test_the_table_of_transitions_is_the_engines() -> None:
    section = _section()
    assert BEGIN in section and END in section, f"docs/protocol.md needs {BEGIN} ... {END}"
    shown = section[section.index(BEGIN) + len(BEGIN) : section.index(END)].strip()
    assert shown == render(), "paste this between the markers:\n" + render()


def test_the_drawing_shows_every_state_and_event() -> None:
    drawing = re.search(r"```\n(.*?)```", _section(), re.S)
    assert drawing is not None
    text = drawing.group(1)
    for state in STATES:
        assert state in text, f"the drawing lacks the state {state!r}"
    events = {event for _, event in TRANSITIONS} - NOT_DRAWN
    assert set(DRAWN_AS) == events, "DRAWN_AS must name every event of the table"
    for event in sorted(events):
        assert DRAWN_AS[event] in text, f"the drawing lacks the event {event!r}"
