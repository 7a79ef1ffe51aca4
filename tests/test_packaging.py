"""The distribution ships every package in the tree (an editable install hides a miss)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "delaywheel").rglob("__init__.py")
    }
    found |= {"delaywheel_client"}
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
    assert config["package-dir"]["delaywheel_client"] == "client/delaywheel_client"
    assert (ROOT / "client/delaywheel_client/__init__.py").exists()
