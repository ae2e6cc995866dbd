"""The names plugin code and tools import from ``hwplug.plugins.manager`` (SPEC 1).

The work lives by concern: :mod:`hwplug.plugins.plugin_manager` (the pluggy
plugin manager), :mod:`hwplug.plugins.loading` (entry points, the
allow-list, validation, failures), :mod:`hwplug.plugins.selection` (platform
classes, probes, the choice), :mod:`hwplug.plugins.session` (a session: one
plugin manager, its selection and what derives from them) and
:mod:`hwplug.plugins.current` (the default session, ``use_platform``).
"""

from __future__ import annotations

from hwplug.plugins.current import (
    default_session,
    get_platform,
    get_plugin_manager,
    platform_from_spec,
    reset,
    select_platform,
    use_platform,
)
from hwplug.plugins.loading import (
    BUILTIN_DISTRIBUTION,
    ENTRY_POINT_GROUPS,
    PLATFORMS_GROUP,
    PLUGINS_GROUP,
    PluginFailure,
    PluginInfo,
    PluginWarning,
)
from hwplug.plugins.plugin_manager import HwplugPluginManager
from hwplug.plugins.selection import Candidate, PlatformEntry, Selection
from hwplug.plugins.session import Session

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "ENTRY_POINT_GROUPS",
    "PLATFORMS_GROUP",
    "PLUGINS_GROUP",
    "Candidate",
    "HwplugPluginManager",
    "PlatformEntry",
    "PluginFailure",
    "PluginInfo",
    "PluginWarning",
    "Selection",
    "Session",
    "default_session",
    "get_platform",
    "get_plugin_manager",
    "platform_from_spec",
    "reset",
    "select_platform",
    "use_platform",
]
