"""Fixtures shared by the core tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from hwplug.plugins import manager


@pytest.fixture
def registered() -> Iterator[Callable[[object, str], None]]:
    """``registered(plugin, name)``: a plugin on the process's plugin manager for one test."""
    pm = manager.get_plugin_manager()
    names: list[str] = []

    def register(plugin: object, name: str) -> None:
        pm.register(plugin, name=name)
        names.append(name)

    yield register
    for name in names:
        pm.unregister(name=name)
