"""hwplug: a pluggable hardware-platform layer for PyTorch inference engines.

``import hwplug`` is cheap and never imports torch; ``hwplug.current_platform``
is resolved on first access (once per process, thread-safe) by asking every
installed platform plugin whether its device is present.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwplug._version import __version__
from hwplug.core.errors import ConfigError, PluginError
from hwplug.core.hookspecs import HOOK_API_VERSION, hookimpl, hookspec
from hwplug.core.resolve import Change, Resolution, resolve

if TYPE_CHECKING:
    from hwplug.core.platform import Platform
    from hwplug.plugins.manager import use_platform

__all__ = [
    "HOOK_API_VERSION",
    "Change",
    "ConfigError",
    "PluginError",
    "Resolution",
    "__version__",
    "current_platform",
    "get_platform",
    "hookimpl",
    "hookspec",
    "resolve",
    "use_platform",
]


def get_platform() -> Platform:
    """The current platform (a :func:`use_platform` override, else the detected one)."""
    from hwplug.plugins.manager import get_platform as _get

    return _get()


def __getattr__(name: str) -> Any:
    # PEP 562: resolve lazily so that plugins can import hwplug before selection runs.
    if name == "current_platform":
        return get_platform()
    if name == "use_platform":
        from hwplug.plugins.manager import use_platform as _use

        return _use
    raise AttributeError(f"module 'hwplug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"current_platform", "use_platform"})
