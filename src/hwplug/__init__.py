"""hwplug: a pluggable hardware-platform layer for PyTorch inference engines.

``import hwplug`` is cheap and never imports torch; ``hwplug.current_platform``
is resolved on first access (once per process, thread-safe) by asking every
installed platform plugin whether its device is present.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwplug._version import __version__
from hwplug.core import session as _core_session
from hwplug.core.errors import ConfigError, PluginError
from hwplug.core.hookspecs import HOOK_API_VERSION, hookimpl, hookspec
from hwplug.core.resolve import Change, Resolution

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform
    from hwplug.plugins.current import use_platform
    from hwplug.plugins.session import Session

__all__ = [
    "HOOK_API_VERSION",
    "Change",
    "ConfigError",
    "PluginError",
    "Resolution",
    "Session",
    "__version__",
    "current_platform",
    "default_session",
    "get_platform",
    "hookimpl",
    "hookspec",
    "resolve",
    "use_platform",
]


def get_platform() -> Platform:
    """The current platform of the default session (a :func:`use_platform` override,
    else the detected one)."""
    # lazy: the plugin machinery (pluggy, entry points) loads on first use
    from hwplug.plugins.current import get_platform as _get

    return _get()


def default_session() -> Session:
    """The process's default :class:`Session`: what the module-level functions use."""
    # lazy: the plugin machinery (pluggy, entry points) loads on first use
    from hwplug.plugins.current import default_session as _default

    return _default()


def resolve(
    config: EngineConfig | None = None, *, platform: Platform | str | None = None
) -> Resolution:
    """Resolve ``config`` for ``platform`` (default: the current platform).

    The caller's config is never mutated. ``platform`` may be a
    :class:`~hwplug.core.platform.Platform`, a platform name or a profile
    (``"h100:8"``). Every installed extension plugin's hooks take part (the
    default session's; :meth:`Session.resolve` for another session).
    Deterministic: same input, same output.

    :raises ConfigError: the config cannot run on the platform.
    :raises PluginError: the platform or a plugin misbehaved.
    """
    return default_session().resolve(config, platform=platform)


def __getattr__(name: str) -> Any:
    # PEP 562: resolve lazily so that plugins can import hwplug before selection runs.
    if name == "current_platform":
        return get_platform()
    if name == "use_platform":
        # lazy: the plugin machinery (pluggy, entry points) loads on first use
        from hwplug.plugins.current import use_platform as _use

        return _use
    if name == "Session":
        # lazy: the plugin machinery (pluggy, entry points) loads on first use
        from hwplug.plugins.session import Session as _Session

        return _Session
    raise AttributeError(f"module 'hwplug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Session", "current_platform", "use_platform"})


# Lower layers (custom ops, the attention op, init_backend, the conformance kit)
# use the default session when they are handed none.
_core_session.set_default(default_session)
