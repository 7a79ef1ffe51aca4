"""docs/layout.md against the code: every module named, and every name a file.

The tree in docs/layout.md ("## The tree") is read as text: each line is its
names (separated by one space, each a ``.py`` file or a ``dir/``), then two
spaces or more, then what they hold; the indent (two spaces a level) says
which directory a name is in. Every module of ``delaywheel/`` and
``client/delaywheel_client/`` must be named there (a package's
``__init__.py`` may be, and is otherwise its directory's line), and every
name there must exist. Paths in backquotes anywhere on the page
(``store/base.py``, ``tests/test_store.py``) must exist too, read from the
repository or from ``delaywheel/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
PACKAGES = ("delaywheel", "client/delaywheel_client")
_GAP = re.compile(r" {2,}")
_QUOTED_PATH = re.compile(r"`([\w.-]+/[\w./-]+\.py)`")  # with a directory: a bare name is ambiguous


def tree_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of the code block under "## The tree"."""
    lines = text.splitlines()
    start = lines.index("## The tree")
    fence = next(n for n in range(start, len(lines)) if lines[n].startswith("```"))
    found = []
    for number in range(fence + 1, len(lines)):
        if lines[number].startswith("```"):
            return found
        if lines[number].strip():
            found.append((number + 1, lines[number]))
    raise AssertionError(f"{LAYOUT}: the tree's code block never ends")


def named_paths(text: str) -> dict[str, int]:
    """Every path the tree names (relative to the repository) and its line."""
    named: dict[str, int] = {}
    parents: list[tuple[int, str]] = []  # (indent, directory) of the enclosing lines
    for number, line in tree_lines(text):
        indent = len(line) - len(line.lstrip(" "))
        names = _GAP.split(line.strip(), maxsplit=1)[0].split(" ")
        while parents and parents[-1][0] >= indent:
            parents.pop()
        parent = parents[-1][1] if parents else ""
        for name in names:
            if not (name.endswith(".py") or name.endswith("/")):
                raise AssertionError(
                    f"docs/layout.md:{number}: {name!r} is neither a module nor a directory"
                    " (a line is its names, then two spaces or more, then what they hold)"
                )
            named[parent + name.rstrip("/")] = number
        if len(names) == 1 and names[0].endswith("/"):
            parents.append((indent, parent + names[0]))
    return named


def modules() -> set[str]:
    """Every module of the server and the client a reader must find in the tree."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }


def test_every_module_is_in_the_tree() -> None:
    named = named_paths(LAYOUT.read_text())
    missing = sorted(modules() - named.keys())
    assert not missing, "modules missing from docs/layout.md's tree:\n" + "\n".join(missing)


def test_every_name_in_the_tree_exists() -> None:
    named = named_paths(LAYOUT.read_text())
    gone = [
        f"docs/layout.md:{n}: {path}" for path, n in named.items() if not (ROOT / path).exists()
    ]
    assert not gone, "names in docs/layout.md's tree that do not exist:\n" + "\n".join(gone)


def test_every_quoted_path_on_the_page_exists() -> None:
    text = LAYOUT.read_text()
    gone = [
        path
        for path in sorted(set(_QUOTED_PATH.findall(text)))
        if not ((ROOT / path).is_file() or (ROOT / "delaywheel" / path).is_file())
    ]
    assert not gone, "paths docs/layout.md quotes that are not files:\n" + "\n".join(gone)


SAMPLE = """## The tree

```
delaywheel/            the server
  app.py               start-up
  store/               stores
    memory.py sqlite.py  two of them; allow.py is only mentioned
  web/                 the dashboard
    templates/ static/  not modules
    site.py            the app
client/delaywheel_client/  the client
  protocol.py          the codec
tests/                 the tests
```
"""


def test_the_reader_sees_each_form_of_line() -> None:
    """The checks above are only as good as this reader."""
    assert named_paths(SAMPLE) == {
        "delaywheel": 4,
        "delaywheel/app.py": 5,
        "delaywheel/store": 6,
        "delaywheel/store/memory.py": 7,
        "delaywheel/store/sqlite.py": 7,
        "delaywheel/web": 8,
        "delaywheel/web/templates": 9,
        "delaywheel/web/static": 9,
        "delaywheel/web/site.py": 10,
        "client/delaywheel_client": 11,
        "client/delaywheel_client/protocol.py": 12,
        "tests": 13,
    }
    with pytest.raises(AssertionError, match="'RequestError:' is neither"):
        named_paths(SAMPLE.replace("  app.py               start-up", "  RequestError: start-up"))
