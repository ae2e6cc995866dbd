"""Loading plugins: entry points, the allow-list, validation and failures.

Installed packages are found through two entry-point groups:

``hwplug.platforms``
    modules (or objects) that implement ``hwplug_platforms()`` and add
    platforms; hwplug's own built-in platforms are registered this way too.
``hwplug.plugins``
    extensions that only adjust configurations (or add attention backends).

The built-in platforms always load first, so a third-party plugin cannot take
a built-in's place: one registered under a built-in's name is an error naming
both distributions. ``HWPLUG_PLUGINS`` (comma-separated, unset = all, empty =
none) limits the third-party plugins by entry-point name or distribution name.

Every plugin is validated with pluggy's own checks when it is registered
(hook names and signatures); one that fails to import (even with
``sys.exit``), provides no hook implementation, or implements an unknown hook
is reported by name and skipped (an error with ``HWPLUG_STRICT=1``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pkgutil
import types
from collections.abc import Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy

from hwplug._version import __version__
from hwplug.core.errors import PluginError, brief

if TYPE_CHECKING:
    from hwplug.plugins.plugin_manager import HwplugPluginManager

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "ENTRY_POINT_GROUPS",
    "PLATFORMS_GROUP",
    "PLUGINS_GROUP",
    "PluginFailure",
    "PluginInfo",
    "PluginWarning",
    "allow_list",
    "builtin_plugins",
    "load_builtins",
    "load_entrypoints",
    "validate_plugin",
]

logger = logging.getLogger("hwplug.plugins")

PLATFORMS_GROUP = "hwplug.platforms"
PLUGINS_GROUP = "hwplug.plugins"
ENTRY_POINT_GROUPS = (PLATFORMS_GROUP, PLUGINS_GROUP)
BUILTIN_DISTRIBUTION = "hwplug"
_BUILTIN_PACKAGE = "hwplug.platforms"
ALLOW_ENV = "HWPLUG_PLUGINS"


class PluginWarning(UserWarning):
    """A plugin failed and was skipped (``HWPLUG_STRICT`` is off)."""


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """A registered plugin and where it came from."""

    name: str
    group: str
    distribution: str
    version: str
    value: str
    builtin: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PluginFailure:
    """A plugin that failed at some stage (``load``, ``hwplug_platforms``, ``detect``...)."""

    plugin: str
    distribution: str
    stage: str
    error: str

    def message(self) -> str:
        return (
            f"plugin {self.plugin!r} from distribution {self.distribution!r} failed in "
            f"{self.stage}: {self.error}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _dist_name(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "(unknown)", ""
    return dist.metadata["Name"] or "(unknown)", dist.version or ""


def allow_list(env: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The names in ``HWPLUG_PLUGINS`` (None when unset: every plugin is allowed)."""
    raw = (os.environ if env is None else env).get(ALLOW_ENV)
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _allowed(allow: frozenset[str], ep_name: str, dist: str) -> str | None:
    """The allow-list entry that admits a plugin, by entry-point or distribution name."""
    for entry in allow:
        if entry == ep_name or _normalise(entry) == _normalise(dist):
            return entry
    return None


# --------------------------------------------------------------------------- built-ins


def builtin_plugins() -> list[tuple[str, str]]:
    """``(name, module)`` of hwplug's built-in platform plugins, in name order.

    Read from hwplug's own ``hwplug.platforms`` entry points; from a source
    tree without package metadata, every platform folder of ``hwplug.platforms``
    (a package that implements ``hwplug_platforms``) is one.
    """
    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=PLATFORMS_GROUP):
        dist, _version = _dist_name(ep)
        if _normalise(dist) == BUILTIN_DISTRIBUTION:
            found.setdefault(ep.name, ep.value)
    if not found:
        package = importlib.import_module(_BUILTIN_PACKAGE)
        for info in pkgutil.iter_modules(package.__path__):
            module_name = f"{_BUILTIN_PACKAGE}.{info.name}"
            if info.ispkg and callable(
                getattr(importlib.import_module(module_name), "hwplug_platforms", None)
            ):
                found[info.name] = module_name
    return sorted(found.items())


def load_builtins(pm: HwplugPluginManager) -> None:
    """Register hwplug's built-in platform plugins (a failure here is a bug: it raises)."""
    for name, module_name in builtin_plugins():
        if pm.has_plugin(name):
            continue
        pm.register_plugin(
            importlib.import_module(module_name),
            name,
            group=PLATFORMS_GROUP,
            distribution=BUILTIN_DISTRIBUTION,
            version=__version__,
            value=module_name,
            builtin=True,
        )


# --------------------------------------------------------------------------- third parties


def load_entrypoints(pm: HwplugPluginManager, env: Mapping[str, str] | None = None) -> None:
    """Load the built-in platforms, then every allowed third-party entry point."""
    load_builtins(pm)
    allow = allow_list(env)
    matched: set[str] = set()
    skipped: list[str] = []
    for group in ENTRY_POINT_GROUPS:
        for ep in sorted(metadata.entry_points(group=group), key=lambda e: (e.name, e.value)):
            dist, version = _dist_name(ep)
            if _normalise(dist) == BUILTIN_DISTRIBUTION:
                continue
            if allow is not None:
                entry = _allowed(allow, ep.name, dist)
                if entry is None:
                    skipped.append(f"{ep.name} ({dist})")
                    logger.debug("plugin %r (%s) not in %s; skipped", ep.name, dist, ALLOW_ENV)
                    continue
                matched.add(entry)
            _load_one(pm, ep, group, dist, version)
    if allow:
        for entry in sorted(allow - matched):
            pm.warn(
                f"{ALLOW_ENV} names {entry!r}, which matches no installed plugin (entry-point "
                f"or distribution name); installed third-party plugins: "
                f"{', '.join(skipped) or 'none'}"
            )


def _load_one(
    pm: HwplugPluginManager, ep: metadata.EntryPoint, group: str, dist: str, version: str
) -> None:
    info = pm.plugin_info.get(ep.name)
    if info is not None:
        if info.distribution == dist and info.value == ep.value:
            return  # the same distribution seen twice on sys.path

        raise PluginError(
            f"plugin name {ep.name!r} is claimed twice: by distribution {info.distribution!r} "
            f"({info.value}) and by distribution {dist!r} ({ep.value}); a third-party plugin "
            "cannot replace another (or a built-in); uninstall one, or rename its entry point"
        )
    try:
        obj = ep.load()
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # SystemExit too: a plugin must not end the process
        pm.fail(ep.name, dist, "load", exc)
        return
    pm.register_plugin(
        obj, ep.name, group=group, distribution=dist, version=version, value=ep.value
    )


def validate_plugin(pm: pluggy.PluginManager, name: str, plugin: object) -> str | None:
    """What is wrong with the just-registered ``plugin``, or None.

    pluggy checks hook signatures when registering; this adds pluggy's
    ``check_pending`` (an implementation of a hook that has no specification,
    such as a misspelled name) and rejects objects with no implementation at
    all (an entry point that resolves to the wrong object).
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        return str(exc)
    if not pm.get_hookcallers(plugin):
        kind = "module" if isinstance(plugin, types.ModuleType) else type(plugin).__name__
        return (
            f"the entry point resolves to a {kind} ({_short(plugin)}) that implements no hwplug "
            "hook; point it at a module or class with @hwplug.hookimpl functions "
            "(hwplug_platforms, hwplug_check_and_update_config, ...)"
        )
    return None


def _short(obj: object) -> str:
    return brief(obj, 60)
