"""Hook specifications for hwplug plugins.

A plugin is any module or object registered with hwplug's pluggy
``PluginManager`` (project name ``"hwplug"``) that implements some of the hooks
below with the :data:`hookimpl` marker. Installed packages are found through
the ``hwplug.platforms`` and ``hwplug.plugins`` entry-point groups.

Every hook is called with keyword arguments; an implementation may accept
any subset of the documented parameters (pluggy passes only those it names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform
    from hwplug.core.resolve import ChangeLog

__all__ = [
    "HOOK_API_VERSION",
    "PROJECT_NAME",
    "HwplugHookDeprecationWarning",
    "deprecated_hookspec",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "hwplug"
"""The pluggy project name shared by the markers and the plugin manager."""

HOOK_API_VERSION = (1, 1)
"""Version of the hook API as ``(major, minor)``.

The major part changes when a hook is removed or its arguments change
incompatibly; the minor part when a hook or an argument is added. A plugin can
check ``hwplug.core.hookspecs.HOOK_API_VERSION[0] == 1`` before registering.
"""

_F = TypeVar("_F", bound=Callable[..., object])

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marker for hook specifications (used by hwplug itself)."""

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marker for hook implementations: ``@hwplug.hookimpl``."""


class HwplugHookDeprecationWarning(DeprecationWarning):
    """Warned when a plugin implements a hook (or hook argument) that is deprecated."""


def deprecated_hookspec(message: str, **kwargs: Any) -> Callable[[_F], _F]:
    """A :data:`hookspec` marker whose implementations warn with ``message``.

    Built on pluggy's ``warn_on_impl``: when a hook changes, its old spec is kept
    with this marker for one minor release, so plugins get a warning naming the
    replacement before the old hook goes away.
    """
    return hookspec(warn_on_impl=HwplugHookDeprecationWarning(message), **kwargs)


# ---------------------------------------------------------------------------
# Platform discovery hooks
# ---------------------------------------------------------------------------


@hookspec
def hwplug_platforms() -> list[type[Platform]]:  # type: ignore[empty-body]
    """Return the platform classes this plugin provides.

    Every implementation is called and the results are collected; there is no
    first-result short cut. Each class must subclass
    :class:`hwplug.core.platform.Platform` and carry a unique ``name``. Selection
    then asks each class's ``detect()`` whether its device is present.

    :returns: A list (possibly empty) of ``Platform`` subclasses.

    Honoured when the plugin manager first selects a platform
    (``hwplug.current_platform``, ``hwplug.get_platform()``, ``hwplug info``).
    """


@hookspec
def hwplug_attention_backends() -> list[type]:  # type: ignore[empty-body]
    """Return the attention-backend classes this plugin provides.

    Every implementation is called and the results are collected; there is no
    first-result short cut. Each class must subclass
    ``AttentionBackend`` (of ``hwplug.attention``) with a unique lower-case
    ``name``; a name claimed twice is a :class:`hwplug.PluginError` naming
    both. A platform names the backends it prefers in
    ``Platform.attention_backends(config)``; users choose one with
    ``attention.backend``. A package that only adds backends registers under
    the ``hwplug.plugins`` entry-point group.

    :returns: A list (possibly empty) of ``AttentionBackend`` subclasses.

    Honoured by ``available_backends`` and ``get_backend`` of ``hwplug.attention``,
    and by :func:`hwplug.resolve`,
    which chooses or checks ``attention.backend`` among them.
    """


# ---------------------------------------------------------------------------
# Configuration resolution hooks
# ---------------------------------------------------------------------------


@hookspec
def hwplug_check_and_update_config(
    config: EngineConfig, platform: Platform, changes: ChangeLog
) -> None:
    """Adjust an engine configuration for the active platform.

    Every implementation is called (no first-result short cut), in pluggy's
    order: ``tryfirst``/``trylast`` and ``wrapper=True`` implementations order
    the extensions among themselves. All run after the active platform's own
    ``Platform.check_and_update_config``.

    Change fields only through ``changes.record(path, new, reason)``, which sets
    the field and logs the change attributed to this plugin. Fill values the
    user left unset; raise :class:`hwplug.ConfigError` rather than overriding
    an explicit choice.

    :param config: The working copy of the ``EngineConfig`` being resolved
        (never the caller's object).
    :param platform: The active :class:`~hwplug.core.platform.Platform`.
    :param changes: The change log; ``changes.was_set(path)`` tells whether
        the user set a field explicitly.

    Honoured by :func:`hwplug.resolve`, step 4 of the pipeline.
    """


@hookspec
def hwplug_verify_config(config: EngineConfig, platform: Platform) -> None:
    """Have the last word on a resolved configuration.

    Every implementation is called, after the platform's own verification. Do
    not change the configuration here: raise :class:`hwplug.ConfigError` for
    combinations that cannot run, naming the option, the device and what
    would work.

    :param config: The fully resolved ``EngineConfig``.
    :param platform: The active platform.

    Honoured by :func:`hwplug.resolve`, step 6 of the pipeline.
    """
