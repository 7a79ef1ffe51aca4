"""The overview's charts, drawn on the server as SVG from the producer's ring.

Four charts: tasks by state (ready, delayed, dead), rates (added, fired,
acked per second), deliveries by outcome (delivered, failed per second) and
lateness (p50, p99 in seconds). Each over a range the page picks: the last
5 minutes, the last hour, or everything the ring holds (it starts empty at
the server's start and keeps an hour).

A chart has at most ``MAX_POINTS`` points: a longer range groups its 1 s
samples into buckets of ``step`` seconds (the last count of a bucket, the
mean of its rates, the worst of its lateness). The time axis is fixed to the
range, newest at the right ("now"), so a young server's line starts partway
across instead of being stretched. A missing value (lateness while nothing
fired) is a gap in the line, never a zero.

The page hands ``dash.js`` each series' points (``data-values``) and the
bucket (``data-step``, ``data-kind``): it goes on from them live, and draws
the hover values. Without JavaScript, each chart's numbers are in a table
under it (``rows``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from delaywheel.web.live import Ring, chart_values

MAX_POINTS = 300
TABLE_ROWS = 10
# The SVG's box, in its own units (the page scales it to the column's width).
WIDTH, HEIGHT = 480, 180
LEFT, RIGHT, TOP, BOTTOM = 66, 10, 10, 24
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
# For the template, which writes it on each chart (data-box) for dash.js.
BOX = {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": RIGHT, "top": TOP, "bottom": BOTTOM}

RANGES = {"5m": 300, "1h": 3600, "all": None}  # seconds; None: what the ring holds
RANGE_LABELS = {"5m": "5 min", "1h": "1 hour", "all": "all kept"}


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    unit: str  # "tasks", "/s" or "s": how the axis and the values read
    series: tuple[str, ...]
    kind: str  # how a bucket of samples becomes one point: last, mean or max


SPECS = (
    Spec("states", "Tasks by state", "tasks", ("ready", "delayed", "dead"), "last"),
    Spec("rates", "Rates", "/s", ("added", "fired", "acked"), "mean"),
    Spec("deliveries", "Deliveries by outcome", "/s", ("delivered", "failed"), "mean"),
    Spec("lateness", "Lateness of fired tasks", "s", ("p50", "p99"), "max"),
)


@dataclass
class Line:
    name: str
    values: list[float]  # one a point; NaN: no value
    path: str  # the SVG path (M/L, a new M after a gap)
    data: str  # values for dash.js: "" for a gap


@dataclass
class Tick:
    at: float  # in the SVG's units
    label: str


@dataclass
class Row:
    ago: str
    values: list[str]


@dataclass
class Chart:
    spec: Spec
    step: int  # seconds a point covers
    span_s: int  # the time axis, seconds
    lines: list[Line]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    top: float  # the value at the top of the y axis
    rows: list[Row]
    latest: list[str]  # each series' newest value, for the legend


def nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1 for 0)."""
    if not value > 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * power >= value * (1 - 1e-9):
            return float(m * power)
    return float(10 * power)


def number(value: float, unit: str) -> str:
    """A value as an axis or a table shows it, with its unit."""
    if value != value:
        return "none"
    if unit == "s":
        if value == 0:
            return "0 s"
        return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"
    if abs(value) >= 10_000:
        text = f"{value / 1000:.3g}k"
    elif value == int(value):
        text = f"{int(value)}"
    else:
        text = f"{value:.3g}"
    return text + ("/s" if unit == "/s" else "")


def ago(seconds: float) -> str:
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"{seconds:g} s ago"
    if seconds < 3600:
        return f"{seconds / 60:g} min ago"
    return f"{seconds / 3600:g} h ago"


def bucketed(values: list[float], step: int, kind: str) -> list[float]:
    """``values`` grouped by ``step`` (the newest bucket may be short), one value each."""
    if step <= 1:
        return values
    out: list[float] = []
    first = len(values) % step  # a short bucket is the oldest: the newest are whole
    starts = ([0] if first else []) + list(range(first, len(values), step))
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(values)
        part = [v for v in values[start:end] if v == v]
        if not part:
            out.append(math.nan)
        elif kind == "last":
            out.append(part[-1])
        elif kind == "max":
            out.append(max(part))
        else:
            out.append(sum(part) / len(part))
    return out


TICK_STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1200, 1800)


def time_ticks(span_s: int) -> list[Tick]:
    """The time axis' ticks, every round number of seconds or minutes, at most 6
    intervals: "-5 min" (a minus sign) ... "now", in how long ago (the axis
    slides with the clock)."""
    every = next((t for t in TICK_STEPS_S if span_s / t <= 6), TICK_STEPS_S[-1])
    ticks = []
    for back in range(0, span_s + 1, every):
        label = (
            "now" if back == 0 else "\u2212" + (f"{back // 60} min" if back >= 60 else f"{back} s")
        )
        ticks.append(Tick(LEFT + PLOT_W * (1 - back / span_s), label))
    return ticks[::-1]


def x_of(index: int, count: int, slots: int) -> float:
    """The x of point ``index`` of ``count``, the newest at the right of ``slots`` places."""
    place = slots - count + index
    return LEFT + PLOT_W * (place / max(slots - 1, 1))


def y_of(value: float, top: float) -> float:
    return TOP + PLOT_H - value / top * PLOT_H


def path_of(values: list[float], slots: int, top: float) -> str:
    parts, pen_down = [], False
    for i, v in enumerate(values):
        if v != v:
            pen_down = False
            continue
        parts.append(
            f"{'L' if pen_down else 'M'}{x_of(i, len(values), slots):.1f},{y_of(v, top):.1f}"
        )
        pen_down = True
    return " ".join(parts)


def build(ring: Ring, spec: Spec, range_name: str) -> Chart:
    span = RANGES[range_name]
    held = ring.count
    span_s = max(held, 60) if span is None else span
    step = max(1, math.ceil(span_s / MAX_POINTS))
    slots = math.ceil(span_s / step)
    raw = {name: ring.series(name, last=min(span_s, held)) for name in spec.series}
    series = {name: bucketed(values, step, spec.kind) for name, values in raw.items()}
    finite = [v for values in series.values() for v in values if v == v]
    top = nice_top(max(finite, default=0.0))
    lines = [
        Line(name, values, path_of(values, slots, top), chart_values(values))
        for name, values in series.items()
    ]
    y_ticks = [Tick(y_of(top * f, top), number(top * f, spec.unit)) for f in (0, 0.5, 1)]
    x_ticks = time_ticks(span_s)
    return Chart(
        spec, step, span_s, lines, y_ticks, x_ticks, top, rows(raw, spec), latest(series, spec)
    )


def rows(raw: dict[str, list[float]], spec: Spec) -> list[Row]:
    """The numbers without JavaScript: up to ``TABLE_ROWS`` buckets, newest first."""
    held = max((len(v) for v in raw.values()), default=0)
    if not held:
        return []
    step = max(1, math.ceil(held / TABLE_ROWS))
    columns = [bucketed(raw[name], step, spec.kind) for name in spec.series]
    n = len(columns[0])
    out = []
    for i in reversed(range(n)):
        newest_ago = (n - 1 - i) * step
        label = "now" if newest_ago == 0 else ago(newest_ago)
        if step > 1:
            label = f"{ago(newest_ago + step)} to {label}"
        out.append(Row(label, [number(col[i], spec.unit) for col in columns]))
    return out


def latest(series: dict[str, list[float]], spec: Spec) -> list[str]:
    return [number(values[-1], spec.unit) if values else "none" for values in series.values()]


def charts(ring: Ring, range_name: str) -> list[Chart]:
    return [build(ring, spec, range_name) for spec in SPECS]
