"""The package face (``hwplug/__init__.py``) is imported only by the tools on top of it.

import-linter (``make test``) checks the layers between packages; it cannot
single out the root module itself, so this test does, with import-linter's
own graph library.
"""

from __future__ import annotations

import grimp

# Modules that may use the face: the tools that serve users (the command line,
# the matrix, the pytest plugin, the conformance kit).
ALLOWED = {"hwplug.cli", "hwplug.matrix", "hwplug.__main__", "hwplug.plugins.pytest_plugin"}
ALLOWED_PACKAGES = ("hwplug.conformance",)


def test_only_the_tools_import_the_package_face() -> None:
    graph = grimp.build_graph(
        "hwplug", include_external_packages=False, exclude_type_checking_imports=True
    )
    importers = graph.find_modules_that_directly_import("hwplug")
    wrong = {m for m in importers - ALLOWED if not m.startswith(ALLOWED_PACKAGES)}
    assert not wrong, sorted(wrong)


def test_core_imports_nothing_above_it() -> None:
    graph = grimp.build_graph(
        "hwplug", include_external_packages=False, exclude_type_checking_imports=True
    )
    for upper in ("hwplug.platforms", "hwplug.plugins", "hwplug.compilation", "hwplug.attention"):
        chains = graph.find_shortest_chains(importer="hwplug.core", imported=upper)
        assert not chains, (upper, sorted(chains))
