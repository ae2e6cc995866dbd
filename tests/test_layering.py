"""Layering checks import-linter's contracts cannot express.

import-linter (``make test``) checks the layers between packages. These tests
check, with its own graph library, that only the tools import the package
face (``hwplug/__init__.py``), that no two subpackages import each other
through any chain (TYPE_CHECKING imports included), and that every
function-local import of an hwplug module says why it is local.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import grimp

import hwplug

SOURCE = Path(hwplug.__file__).parent

# Modules that may use the face: the tools that serve users (the command line,
# the matrix, the pytest plugin).
ALLOWED = {"hwplug.cli", "hwplug.matrix", "hwplug.__main__", "hwplug.plugins.pytest_plugin"}


def test_only_the_tools_import_the_package_face() -> None:
    graph = grimp.build_graph(
        "hwplug", include_external_packages=False, exclude_type_checking_imports=True
    )
    importers = graph.find_modules_that_directly_import("hwplug")
    assert not importers - ALLOWED, sorted(importers - ALLOWED)


def test_core_imports_nothing_above_it() -> None:
    graph = grimp.build_graph(
        "hwplug", include_external_packages=False, exclude_type_checking_imports=True
    )
    for upper in ("hwplug.platforms", "hwplug.plugins", "hwplug.compilation", "hwplug.attention"):
        chains = graph.find_shortest_chains(importer="hwplug.core", imported=upper)
        assert not chains, (upper, sorted(chains))


def _subpackages() -> list[str]:
    return sorted(
        f"hwplug.{path.name}" for path in SOURCE.iterdir() if (path / "__init__.py").is_file()
    )


def test_no_two_subpackages_import_each_other() -> None:
    # TYPE_CHECKING imports count: a cycle hidden behind them is still a cycle.
    graph = grimp.build_graph(
        "hwplug", include_external_packages=False, exclude_type_checking_imports=False
    )
    packages = _subpackages()
    assert {"hwplug.core", "hwplug.plugins", "hwplug.conformance"} <= set(packages)
    cycles = [
        (a, b)
        for a, b in itertools.combinations(packages, 2)
        if graph.chain_exists(importer=a, imported=b, as_packages=True)
        and graph.chain_exists(importer=b, imported=a, as_packages=True)
    ]
    assert not cycles, cycles


def _local_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, commented) for each function-local import of an hwplug module."""
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            if module.startswith(("hwplug", ".")):
                # The comment may stand above a group of such imports.
                above = node.lineno - 2
                while above >= 0 and lines[above].strip().startswith(("from hwplug", "import")):
                    above -= 1
                commented = "#" in lines[node.lineno - 1] or (
                    above >= 0 and lines[above].strip().startswith("#")
                )
                found.append((node.lineno, module, commented))
    return found


def test_every_function_local_import_of_hwplug_says_why() -> None:
    silent = [
        f"{path.relative_to(SOURCE.parent)}:{line} {module}"
        for path in sorted(SOURCE.rglob("*.py"))
        for line, module, commented in _local_imports(path)
        if not commented
    ]
    assert not silent, silent
