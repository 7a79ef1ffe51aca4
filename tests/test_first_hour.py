"""What a new user meets in the first hour: the README's and the guides' commands
as pasted, and a checkout that `make run` leaves clean."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USER_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _serve_lines(page: Path) -> list[str]:
    """Every `delaywheel serve ...` command in ``page``'s sh blocks."""
    blocks = re.findall(r"```sh\n(.*?)```", page.read_text(), re.DOTALL)
    blocks = [re.sub(r"\\\n\s*", " ", block) for block in blocks]  # continued lines joined
    return [
        line.split("#", 1)[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("delaywheel serve")
    ]


def test_every_serve_example_names_its_store() -> None:
    """A reader coming from the SQLite quick start must not switch, silently, to
    whatever Redis listens on 6379: each pasted `serve` says which store."""
    found = {page.name: _serve_lines(page) for page in USER_PAGES}
    assert found["README.md"], "the README shows how to serve"
    for name, lines in found.items():
        for line in lines:
            words = shlex.split(line.replace("&", ""))
            assert "--store" in words or any(w.startswith("--store=") for w in words), (
                f"{name}: {line}"
            )


def test_the_sqlite_lock_file_is_ignored_by_git(tmp_path: Path) -> None:
    """`make run` serves sqlite:///delaywheel.db, which keeps delaywheel.db.lock
    beside the file (store/sqlite.py): `git status` must not show it."""
    for name in ("delaywheel.db", "delaywheel.db-wal", "delaywheel.db.lock"):
        done = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "--no-index", "-q", name],
            check=False,
        )
        assert done.returncode == 0, f"{name} is not ignored"


# Words of the project's own history: a user reading the docs was never in
# its sessions and has no issue tracker to look "issue 16" up in.
HISTORY = re.compile(
    r"\bissue \d+|issue's|where the issue is silent|state of the work|not built yet"
    r"|this session|the session's (start|end)|end of the session|last session|this stop",
    re.IGNORECASE,
)


def test_user_docs_speak_of_no_project_history() -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in USER_PAGES
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if HISTORY.search(line)
    ]
    assert found == []


# A test a page names as the measure of a claim: `test_...` (not a module's
# `test_....py`).
NAMED_TEST = re.compile(r"\b(test_\w+)\b(?!\.py)")


def test_every_test_the_docs_name_exists() -> None:
    defined = {
        found
        for module in (ROOT / "tests").glob("*.py")
        for found in re.findall(r"^(?:async )?def (test_\w+)", module.read_text(), re.M)
    }
    named = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in USER_PAGES
        for name in NAMED_TEST.findall(page.read_text())
        if name not in defined
    }
    assert named == set()
