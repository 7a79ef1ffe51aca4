"""Two distributions: delaywheel (server and CLI) and delaywheel-client (client/).

Each ships every package of its tree (an editable install hides a miss), the
server depends on the client at the same version, and the client needs msgpack
alone. tests/test_container.py builds the wheels and installs them for real.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import delaywheel_client
import pytest

import delaywheel

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"


def _pyproject(directory: Path) -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11
    config: dict[str, Any] = tomllib.loads((directory / "pyproject.toml").read_text())
    return config


def _packages_under(directory: Path, top: str) -> set[str]:
    return {
        ".".join(init.parent.relative_to(directory).parts)
        for init in (directory / top).rglob("__init__.py")
    }


def test_the_server_distribution_finds_its_packages_and_not_the_clients() -> None:
    """pyproject.toml lets setuptools find the packages (a new one needs no line):
    what it finds is every package under delaywheel/ and nothing else."""
    from setuptools import find_namespace_packages

    setuptools_config = _pyproject(ROOT)["tool"]["setuptools"]
    find = setuptools_config["packages"]["find"]
    shipped = set(find_namespace_packages(where=str(ROOT), include=find["include"]))
    found = _packages_under(ROOT, "delaywheel")
    assert found <= shipped, f"not found by setuptools: {sorted(found - shipped)}"
    assert all(name.split(".")[0] == "delaywheel" for name in shipped), shipped
    assert "package-dir" not in setuptools_config  # no client/ mapped in


def test_the_client_distribution_lists_its_packages() -> None:
    config = _pyproject(CLIENT)
    assert config["project"]["name"] == "delaywheel-client"
    listed = set(config["tool"]["setuptools"]["packages"])
    found = _packages_under(CLIENT, "delaywheel_client")
    assert found == listed, f"client/pyproject.toml packages {sorted(listed)}, tree {sorted(found)}"
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["delaywheel_client"]
    assert (CLIENT / "delaywheel_client/py.typed").exists()
    assert (CLIENT / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()


def test_the_server_depends_on_the_client_at_its_own_version() -> None:
    server, client = _pyproject(ROOT)["project"], _pyproject(CLIENT)["project"]
    version = server["version"]
    assert client["version"] == version
    assert delaywheel.__version__ == version
    assert delaywheel_client.__version__ == version
    assert f"delaywheel-client=={version}" in server["dependencies"]


def test_the_client_needs_msgpack_alone_and_imports_nothing_of_the_server() -> None:
    assert [dep.split(">")[0] for dep in _pyproject(CLIENT)["project"]["dependencies"]] == [
        "msgpack"
    ]
    for source in (CLIENT / "delaywheel_client").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), str(source))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            tops = {name.split(".")[0] for name in names}
            assert "delaywheel" not in tops, f"{source.relative_to(ROOT)}:{node.lineno}"
