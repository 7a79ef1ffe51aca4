"""Micro-benchmarks for delaywheel: ``python -m bench [--json] [SECTION ...]``.

Measurement only: a section reports figures (rates, latencies, bytes) with the
target each is meant to meet printed beside it. Nothing here asserts on timing
and the exit status says nothing about whether a target was met.

A section is a module ``bench/<name>.py`` whose ``run(quick: bool = False) ->
Report`` measures and returns its figures without printing them (progress
notes go to stderr via ``progress``); ``quick`` asks for tiny counts, a smoke
run that still starts the real servers. ``bench/__main__.py`` lists the
sections and renders each ``Report`` as a table, or as JSON with ``--json``.
This module holds what the sections share: the report types, the renderers
and small timing helpers.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Figure", "Report", "Target", "paused_gc", "progress", "render_table", "to_json"]


@dataclass(frozen=True)
class Target:
    """What a figure should be: ``value op target`` (op is ``>=``, ``<=`` or ``<``)."""

    op: str
    value: float

    def __post_init__(self) -> None:
        if self.op not in (">=", "<=", "<", ">"):
            raise ValueError(f"unknown target operator {self.op!r}")


@dataclass(frozen=True)
class Figure:
    """One measured number.

    ``key`` is the stable machine name (used in JSON); ``label`` is for people.
    ``runs`` holds every repeat when ``value`` is the best (or median) of several.
    """

    key: str
    label: str
    value: float
    unit: str
    target: Target | None = None
    runs: tuple[float, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Report:
    """A section's results: what was measured (``params``) and the figures."""

    section: str
    title: str
    figures: list[Figure]
    params: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0


def progress(message: str) -> None:
    """A progress note on stderr (stdout carries only the results)."""
    print(f"  .. {message}", file=sys.stderr, flush=True)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Collect, then keep the cyclic GC off inside the block (as ``timeit`` does).

    With a million live objects a full collection takes tens of milliseconds;
    pausing it keeps that out of figures that are about the code under test.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# -- rendering --------------------------------------------------------------------


def format_number(value: float) -> str:
    """Thousands separators for big numbers, a few digits for small ones."""
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_compact(value: float) -> str:
    """A short form for the runs column: 1.38M, 612k, 6.9k, 42.8."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.2f}M"
    if magnitude >= 1e4:
        return f"{value / 1e3:.0f}k"
    if magnitude >= 1e3:
        return f"{value / 1e3:.1f}k"
    return format_number(value)


def _describe_target(target: Target | None, unit: str) -> str:
    if target is None:
        return ""
    return f"{target.op} {format_number(target.value)} {unit}".rstrip()


def render_table(report: Report) -> str:
    """The report as an aligned plain-text table (every run shown when there were several)."""
    header = ("figure", "value", "unit", "target", "runs", "notes")
    rows = [header]
    for fig in report.figures:
        runs = " ".join(format_compact(run) for run in fig.runs) if len(fig.runs) > 1 else ""
        rows.append(
            (
                fig.label,
                format_number(fig.value),
                fig.unit,
                _describe_target(fig.target, fig.unit),
                runs,
                fig.note,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    aligns = ["<", ">", "<", "<", "<", "<"]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            f"{cell:{align}{width}}" for cell, align, width in zip(row, aligns, widths, strict=True)
        ]
        # the value and its unit read as one: "1,234 /s"
        return ("  " + "  ".join([cells[0], f"{cells[1]} {cells[2]}", *cells[3:]])).rstrip()

    body = [line(row) for row in rows]
    out = [f"[{report.section}] {report.title}", body[0]]
    out.append("  " + "-" * (max(len(text) for text in body) - 2))
    out += body[1:]
    out.append(f"  ({report.section}: {report.elapsed_s:.1f} s)")
    return "\n".join(out)


def to_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON-ready data."""
    return {
        "title": report.title,
        "params": report.params,
        "elapsed_s": round(report.elapsed_s, 3),
        "figures": {
            fig.key: {
                "label": fig.label,
                "value": fig.value,
                "unit": fig.unit,
                "target": (
                    None if fig.target is None else {"op": fig.target.op, "value": fig.target.value}
                ),
                "runs": list(fig.runs),
                "note": fig.note,
            }
            for fig in report.figures
        },
    }


# Section name -> module exposing ``run(quick: bool = False) -> Report``. Runs in this order.
SECTIONS: dict[str, str] = {
    "compare": "bench.compare",
    "fire": "bench.fire",
    "lateness": "bench.lateness",
    "wheel": "bench.wheel",
    "journal": "bench.journal",
    "horizon": "bench.horizon",
    "recovery": "bench.recovery",
    "deliveries": "bench.deliveries",
    "connections": "bench.connections",
    "dashboard": "bench.dashboard",
    "schedules": "bench.schedules",
    "ha": "bench.ha",
    "http_api": "bench.http_api",
}


def run_section(name: str, quick: bool = False) -> Report:
    """Run one section; ``quick`` asks for tiny counts (a smoke run, not figures to quote).

    A section whose ``run()`` takes no ``quick`` yet runs in full, with a note saying so.
    """
    module = importlib.import_module(SECTIONS[name])
    started = time.perf_counter()
    report: Report
    if not quick:
        report = module.run()
    elif "quick" in inspect.signature(module.run).parameters:
        report = module.run(quick=True)
    else:
        progress(f"section {name} has no quick mode: it runs in full")
        report = module.run()
    if not report.elapsed_s:
        elapsed = time.perf_counter() - started
        report = Report(report.section, report.title, report.figures, report.params, elapsed)
    return report
