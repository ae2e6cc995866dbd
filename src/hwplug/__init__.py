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
from hwplug.core.resolve import Change, Resolution

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
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


def resolve(
    config: EngineConfig | None = None, *, platform: Platform | str | None = None
) -> Resolution:
    """Resolve ``config`` for ``platform`` (default: the current platform).

    The caller's config is never mutated. ``platform`` may be a
    :class:`~hwplug.core.platform.Platform`, a platform name or a profile
    (``"h100:8"``). Every installed extension plugin's hooks take part.
    Deterministic: same input, same output.

    :raises ConfigError: the config cannot run on the platform.
    :raises PluginError: the platform or a plugin misbehaved.
    """
    from hwplug.core import resolve as pipeline
    from hwplug.core.config import EngineConfig
    from hwplug.plugins import manager

    if config is None:
        config = EngineConfig()
    if platform is None:
        plat = manager.get_platform()
    elif isinstance(platform, str):
        plat = manager.platform_from_spec(platform)
    else:
        from hwplug.core.platform import Platform

        if not isinstance(platform, Platform):
            raise ConfigError(
                "resolve(platform=...) takes a Platform, a platform name or a profile, "
                f"got {type(platform).__name__}"
            )
        plat = platform
    pm = manager.get_plugin_manager()
    from hwplug.attention import available_backends

    return pipeline.resolve(
        config, plat, pm.hook, describe=pm.describe, attention_backends=available_backends()
    )


def _piecewise_backend(compilation: Any, engine_config: Any) -> Any:
    from hwplug.compilation.piecewise import PiecewiseBackend

    return PiecewiseBackend(compilation, engine_config, platform=get_platform())


def _wire() -> None:
    """Hand core the collaborators it takes: the current platform and the compile backend."""
    from hwplug.core import collaborators

    collaborators.provide(
        platform=get_platform,
        piecewise_backend=_piecewise_backend,
        attention_backends=_attention_plugin_results,
        attention_version=_attention_plugins_version,
    )


def _attention_plugin_results() -> list[tuple[str, str, object]]:
    from hwplug.plugins.manager import get_plugin_manager

    return get_plugin_manager().attention_backend_results()


def _attention_plugins_version() -> object:
    from hwplug.plugins.manager import get_plugin_manager

    manager = get_plugin_manager()
    return (id(manager), manager.generation)


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


_wire()
