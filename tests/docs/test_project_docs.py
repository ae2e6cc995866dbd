"""The maintainer's documents exist, the site links them, and the release check works."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _nav_pages() -> list[str]:
    config = yaml.safe_load(
        (REPO / "mkdocs.yml").read_text().replace("!!python/name:", "python-name ")
    )
    pages: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config["nav"])
    return pages


def test_the_project_documents_exist_and_the_site_links_them() -> None:
    for name in ("CHANGELOG.md", "CONTRIBUTING.md", ".pre-commit-config.yaml"):
        assert (REPO / name).is_file(), name
    pages = _nav_pages()
    for page in ("changelog.md", "contributing.md", "versioning.md"):
        assert page in pages, page
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and "Keep a Changelog" in changelog
    assert "deprecated_hookspec" in (REPO / "docs" / "versioning.md").read_text()


def test_pre_commit_runs_what_make_test_runs() -> None:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff", "ruff-format", "mypy", "import-contracts"} <= hooks


def _release_check() -> object:
    spec = importlib.util.spec_from_file_location(
        "release_check", REPO / "scripts" / "release_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_release_check_finds_what_a_broken_wheel_lacks(tmp_path: Path) -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    wheel, sdist = next(out.glob("*.whl")), next(out.glob("*.tar.gz"))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    check = _release_check().check_metadata  # type: ignore[attr-defined]
    assert check(wheel, sdist, project) == []
    broken = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(("entry_points.txt", ".c")):
                dst.writestr(item, src.read(item.filename))
    problems = check(broken, sdist, project)
    assert "the wheel has no [hwplug.platforms] entry points" in problems
    assert "the wheel does not install the `hwplug` command" in problems
    assert "the wheel lacks hwplug/kernels/csrc/paged_decode.c (built at first use)" in problems
    shutil.rmtree(out)
