"""Run the micro-benchmarks: ``python -m bench [--json] [SECTION ...]``.

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
JSON document ``{"python": ..., "platform": ..., "sections": {name: ...}}``.
Progress notes go to stderr. The exit status is 0 whatever the figures are:
this is measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
from concurrent.futures import ProcessPoolExecutor

from bench import SECTIONS, Report, render_table, run_section, to_json


def run_isolated(name: str) -> Report:
    """``run_section`` in a fresh interpreter (spawned, not forked: no inherited heap)."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
        return pool.submit(run_section, name).result()


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
    if not args.json:
        print(f"delaywheel bench: {python} on {machine}", flush=True)

    results: dict[str, object] = {}
    for name in names:
        print(f"[{name}] running", file=sys.stderr, flush=True)
        report = run_isolated(name)
        if args.json:
            results[name] = to_json(report)
        else:
            print()
            print(render_table(report), flush=True)

    if args.json:
        doc = {"python": python, "platform": machine, "sections": results}
        print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
