"""Run the micro-benchmarks: ``python -m bench [--json] [--quick] [SECTION ...]``.

With no SECTION named, every section in ``SECTIONS`` runs, in that order
(``make bench`` does this), each in a fresh interpreter: what one section
leaves in the heap (a million wheel entries, freed but fragmenting it) must
not slow the next. ``--list`` prints the section names.

Adding a section: write ``bench/<name>.py`` with a docstring saying what it
measures and how, and a ``run() -> bench.Report`` that measures and returns its
figures (see ``bench/__init__.py``); then add ``"<name>": "bench.<name>"`` to
``SECTIONS`` in ``bench/__init__.py``. Sections are imported only when they run, so one section's
imports cost nothing to the others.

Figures go to stdout, as one table per section or, with ``--json``, as a single
JSON document ``{"python": ..., "platform": ..., "sections": {name: ...}}``
(the machine, the date, and per section its params and each figure's value,
unit, runs, target and note; a ratio is a figure of its own, unit "x").
Either way the same document is saved as ``bench/results/<UTC time>.json``
(``--results DIR`` saves it elsewhere, ``--no-results`` not at all). Progress
notes go to stderr. The exit status is 0 whatever the figures are: this is
measurement, not a test.

``--quick`` runs every section with tiny counts, still against real servers:
a smoke run of the harness (``tests/test_bench_quick.py``), not figures to
quote. A section's ``run`` takes ``quick``; one that does not yet runs in full.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import SECTIONS, Report, render_table, run_section, to_json

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def run_isolated(name: str, quick: bool = False) -> Report:
    """``run_section`` in a fresh interpreter (spawned, not forked: no inherited heap)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(run_section, name, quick).result()


def save(doc: dict[str, Any], directory: Path, when: datetime) -> Path:
    """Write ``doc`` as ``<directory>/<UTC time>.json`` (no colons: any file system takes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{when.strftime('%Y-%m-%dT%H-%M-%SZ')}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="delaywheel micro-benchmarks (measurement only, no pass/fail).",
    )
    parser.add_argument(
        "sections",
        nargs="*",
        metavar="SECTION",
        help=f"sections to run (default: all of {', '.join(SECTIONS)})",
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument(
        "--quick", action="store_true", help="tiny counts: a smoke run of every section"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS_DIR,
        metavar="DIR",
        help="where the JSON of the run is saved (default: bench/results)",
    )
    parser.add_argument("--no-results", action="store_true", help="do not save the JSON")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    args = parser.parse_args(argv)

    if args.list:
        print("\n".join(SECTIONS))
        return 0
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    names = list(dict.fromkeys(args.sections)) or list(SECTIONS)

    python = f"{platform.python_implementation()} {platform.python_version()}"
    machine = f"{platform.system()} {platform.machine()}"
    when = datetime.now(timezone.utc)
    if not args.json:
        print(f"delaywheel bench: {python} on {machine}", flush=True)

    results: dict[str, object] = {}
    for name in names:
        print(f"[{name}] running", file=sys.stderr, flush=True)
        report = run_isolated(name, args.quick)
        results[name] = to_json(report)
        if not args.json:
            print()
            print(render_table(report), flush=True)

    doc = {
        "python": python,
        "platform": machine,
        "platform_detail": platform.platform(),
        "cpus": os.cpu_count(),
        "date": when.isoformat(timespec="seconds"),
        "quick": args.quick,
        "sections": results,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    if not args.no_results:
        path = save(doc, args.results, when)
        print(f"results saved to {path}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
