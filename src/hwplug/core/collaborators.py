"""What core is handed by the package face, instead of importing it.

Core knows no way to find the current platform or the compile backend:
``hwplug/__init__.py`` installs them here when hwplug is imported
(``hwplug.get_platform`` and the piecewise backend of :mod:`hwplug.compilation`).
Code that passes a platform explicitly never needs them. Importing this
module is free: nothing here imports pydantic or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwplug.core.platform import Platform

__all__ = [
    "attention_plugin_results",
    "attention_plugins_version",
    "current_platform",
    "piecewise_backend",
    "provide",
]

_platform_source: list[Callable[[], Platform]] = []
_piecewise_factory: list[Callable[[Any, Any], Any]] = []
_attention_source: list[Callable[[], list[tuple[str, str, object]]]] = []
_attention_version: list[Callable[[], object]] = []


def provide(
    *,
    platform: Callable[[], Platform] | None = None,
    piecewise_backend: Callable[[Any, Any], Any] | None = None,
    attention_backends: Callable[[], list[tuple[str, str, object]]] | None = None,
    attention_version: Callable[[], object] | None = None,
) -> None:
    """Install the current-platform source, the level-3 compile backend factory, the
    source of the plugins' ``hwplug_attention_backends`` results and what tells
    whether those results may have changed (a value that changes with the plugins)."""
    if platform is not None:
        _platform_source[:] = [platform]
    if piecewise_backend is not None:
        _piecewise_factory[:] = [piecewise_backend]
    if attention_backends is not None:
        _attention_source[:] = [attention_backends]
    if attention_version is not None:
        _attention_version[:] = [attention_version]


def attention_plugin_results() -> list[tuple[str, str, object]]:
    """``(plugin, distribution, result)`` of every ``hwplug_attention_backends()``
    implementation; empty when no plugin manager was installed."""
    return _attention_source[0]() if _attention_source else []


def attention_plugins_version() -> object:
    """A value that changes whenever the plugins (and so the attention backends they
    add) may have changed; cheap to ask on every call."""
    return _attention_version[0]() if _attention_version else None


def current_platform(purpose: str) -> Platform:
    """The platform the face says is current.

    :raises RuntimeError: nothing was installed (core used without hwplug's face),
        naming ``purpose`` and how to pass a platform instead.
    """
    if not _platform_source:
        raise RuntimeError(
            f"{purpose} needs a platform: pass one explicitly, or import hwplug (whose "
            "current platform is then used)"
        )
    return _platform_source[0]()


def piecewise_backend(compilation_config: Any, engine_config: Any) -> Any:
    """Build the level-3 compile backend through the installed factory.

    :raises RuntimeError: none is installed.
    """
    if not _piecewise_factory:
        raise RuntimeError("no piecewise compile backend is installed; import hwplug first")
    return _piecewise_factory[0](compilation_config, engine_config)
