"""The current platform: the process's plugin manager and selection, and ``use_platform``.

The plugin manager and the platform selection are built once per process, on
first use, even when many threads ask at once. :class:`use_platform`
overrides the current platform for a block or a function in the current
thread or asyncio task only (a :mod:`contextvars` variable): other threads
keep seeing theirs. A child process started with ``fork`` inherits the
override; one started with ``spawn`` (or any new interpreter) does not: set
``HWPLUG_SIMULATE`` or ``HWPLUG_PLATFORM`` in its environment instead.

After ``fork`` the child gets a fresh lock, so a fork made while another
thread was selecting the platform cannot deadlock the child.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from hwplug.core.errors import ConfigError
from hwplug.core.platform import Platform

if TYPE_CHECKING:
    from hwplug.plugins.manager import HwplugPluginManager
    from hwplug.plugins.selection import Selection

__all__ = [
    "get_platform",
    "get_plugin_manager",
    "platform_from_spec",
    "reset",
    "select_platform",
    "use_platform",
]

_lock = threading.RLock()
_manager: HwplugPluginManager | None = None
_selection: Selection | None = None
_override: contextvars.ContextVar[tuple[Platform, ...]] = contextvars.ContextVar(
    "hwplug_platform_override", default=()
)


def _after_fork_in_child() -> None:
    # The lock may have been held by a thread that does not exist in the child.
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def get_plugin_manager() -> HwplugPluginManager:
    """The process's plugin manager, built (and entry points loaded) on first use."""
    global _manager
    manager = _manager
    if manager is not None:
        return manager
    from hwplug.plugins.manager import HwplugPluginManager

    with _lock:
        if _manager is None:
            manager = HwplugPluginManager()
            manager.load_entrypoints()
            _manager = manager
        return _manager


def select_platform() -> Selection:
    """The platform selection of this process (computed once, thread-safe)."""
    global _selection
    selection = _selection
    if selection is not None:
        return selection
    with _lock:
        if _selection is None:
            _selection = get_plugin_manager().select()
        return _selection


def get_platform() -> Platform:
    """The current platform: this context's :class:`use_platform` override, else the selection."""
    override = _override.get()
    if override:
        return override[-1]
    return select_platform().platform


def platform_from_spec(spec: str) -> Platform:
    """A platform by name or by profile (see :meth:`HwplugPluginManager.platform_from_spec`)."""
    return get_plugin_manager().platform_from_spec(spec)


def reset() -> None:
    """Forget the plugin manager, the selection and this context's overrides.

    For tests and for a changed environment (``HWPLUG_*`` variables).
    """
    global _manager, _selection
    with _lock:
        _manager = None
        _selection = None
    _override.set(())


class use_platform(contextlib.ContextDecorator):
    """Make a platform current for a block or a function, then restore the previous one.

    ``target`` is a :class:`~hwplug.core.platform.Platform` instance or class, a
    platform name (``"cuda"``: the real one when present, else its
    representative profile) or a profile (``"h100"``, ``"h100:8"``). The
    override holds in the current thread or asyncio task only. As a context
    manager it yields the platform::

        with hwplug.use_platform("mi300x") as platform:
            assert hwplug.current_platform is platform
    """

    def __init__(self, target: Platform | type[Platform] | str) -> None:
        if not isinstance(target, Platform | str) and not (
            isinstance(target, type) and issubclass(target, Platform)
        ):
            raise ConfigError(
                "use_platform() takes a Platform, a Platform subclass, a platform name or a "
                f"profile, got {type(target).__name__}"
            )
        self.target = target
        # Tokens per thread: a decorated function may run in several threads at once.
        self._local = threading.local()

    def _platform(self) -> Platform:
        target = self.target
        if isinstance(target, Platform):
            return target
        if isinstance(target, str):
            return platform_from_spec(target)
        devices = target.detect()
        if devices:
            return target(devices)
        profile = target.representative()
        if profile is None:
            return target(())
        return target.simulate(profile)

    def _tokens(self) -> list[contextvars.Token[tuple[Platform, ...]]]:
        tokens: list[contextvars.Token[tuple[Platform, ...]]] | None = getattr(
            self._local, "tokens", None
        )
        if tokens is None:
            tokens = self._local.tokens = []
        return tokens

    def __enter__(self) -> Platform:
        platform = self._platform()
        self._tokens().append(_override.set((*_override.get(), platform)))
        return platform

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        token = self._tokens().pop()
        try:
            _override.reset(token)
        except ValueError:
            # Exited in another context than the one it was entered in (a
            # generator resumed elsewhere): drop the innermost override there.
            _override.set(_override.get()[:-1])
