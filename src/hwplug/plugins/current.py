"""The default session: what the package face's module-level functions use.

The default :class:`~hwplug.plugins.session.Session` is built on first use,
once per process, even when many threads ask at once; :func:`reset` forgets
it (for tests and a changed environment). :class:`use_platform` overrides the
current platform of a session (default: the default session) for a block or
a function in the current thread or asyncio task only (a
:mod:`contextvars` variable): other threads keep seeing theirs. A child
process started with ``fork`` inherits the override; one started with
``spawn`` (or any new interpreter) does not: set ``HWPLUG_SIMULATE`` or
``HWPLUG_PLATFORM`` in its environment instead.

After ``fork`` the child gets fresh locks, so a fork made while another
thread was selecting the platform cannot deadlock the child.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from hwplug.core.platform import Platform
from hwplug.plugins.session import PlatformOverride, Session

if TYPE_CHECKING:
    from hwplug.plugins.plugin_manager import HwplugPluginManager
    from hwplug.plugins.selection import Selection

__all__ = [
    "default_session",
    "get_platform",
    "get_plugin_manager",
    "platform_from_spec",
    "reset",
    "select_platform",
    "use_platform",
]

_lock = threading.RLock()
_default: Session | None = None


def _after_fork_in_child() -> None:
    # The locks may have been held by a thread that does not exist in the child.
    global _lock
    _lock = threading.RLock()
    if _default is not None:
        _default._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def default_session() -> Session:
    """The process's default session (built on first use, thread-safe)."""
    global _default
    session = _default
    if session is not None:
        return session
    with _lock:
        if _default is None:
            _default = Session()
        return _default


def get_plugin_manager() -> HwplugPluginManager:
    """The default session's plugin manager, built (and entry points loaded) on first use."""
    return default_session().plugin_manager


def select_platform() -> Selection:
    """The default session's platform selection (computed once, thread-safe)."""
    return default_session().selection


def get_platform() -> Platform:
    """The current platform: this context's :class:`use_platform` override, else the selection."""
    return default_session().platform


def platform_from_spec(spec: str) -> Platform:
    """A platform by name or by profile, from the default session's plugins."""
    return default_session().platform_from_spec(spec)


def reset() -> None:
    """Forget the default session: its plugin manager, selection and overrides.

    For tests and for a changed environment (``HWPLUG_*`` variables).
    """
    global _default
    with _lock:
        _default = None


class use_platform(PlatformOverride):
    """Make a platform current for a block or a function, then restore the previous one.

    ``target`` is a :class:`~hwplug.core.platform.Platform` instance or class, a
    platform name (``"cuda"``: the real one when present, else its
    representative profile) or a profile (``"h100"``, ``"h100:8"``). The
    override holds in the current thread or asyncio task only, in the default
    session (or ``session``). As a context manager it yields the platform::

        with hwplug.use_platform("mi300x") as platform:
            assert hwplug.current_platform is platform
    """

    def __init__(
        self, target: Platform | type[Platform] | str, *, session: Session | None = None
    ) -> None:
        super().__init__(target, session=session if session is not None else default_session)
