"""Plugin discovery, platform selection and the current platform.

Installed packages are found through two entry-point groups:

``hwplug.platforms``
    modules (or objects) that implement ``hwplug_platforms()`` and add
    platforms; hwplug's own built-in platforms are registered this way too.
``hwplug.plugins``
    extensions that only adjust configurations.

Environment variables (read when the plugin manager is first built):

``HWPLUG_PLUGINS``
    comma-separated allow-list of third-party entry-point names; unset means
    all, empty means none. Built-in platforms always load.
``HWPLUG_PLATFORM``
    force the platform by name.
``HWPLUG_SIMULATE``
    simulate a device profile (``h100``, ``h100:8``); implies its platform and
    never touches hardware.
``HWPLUG_STRICT``
    ``1``: a failing plugin is a :class:`~hwplug.PluginError`; otherwise a
    warning naming it, and the rest go on.
``HWPLUG_TRACE``
    ``1``: log every hook call (logger ``hwplug.trace``, to stderr).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from importlib import metadata
from types import TracebackType
from typing import Any, TypeVar

import pluggy

from hwplug.core import hookspecs
from hwplug.core.errors import ConfigError, PluginError, error_line
from hwplug.core.platform import DeviceInfo, Platform, parse_profile_spec

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "ENTRY_POINT_GROUPS",
    "Candidate",
    "HwplugPluginManager",
    "PlatformEntry",
    "PluginFailure",
    "PluginInfo",
    "PluginWarning",
    "Selection",
    "get_platform",
    "get_plugin_manager",
    "platform_from_spec",
    "reset",
    "select_platform",
    "use_platform",
]

logger = logging.getLogger("hwplug.plugins")

PLATFORMS_GROUP = "hwplug.platforms"
PLUGINS_GROUP = "hwplug.plugins"
ENTRY_POINT_GROUPS = (PLATFORMS_GROUP, PLUGINS_GROUP)
BUILTIN_DISTRIBUTION = "hwplug"
BUILTIN_MODULES = {
    "cuda": "hwplug.platforms.cuda",
    "rocm": "hwplug.platforms.rocm",
    "cpu": "hwplug.platforms.cpu",
    "hpu": "hwplug.platforms.hpu",
    "xpu": "hwplug.platforms.xpu",
}
_TRUE = {"1", "true", "yes", "on"}


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
    """A plugin that failed at some stage (``load``, ``hwplug_platforms``, ``detect``)."""

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


@dataclasses.dataclass(frozen=True)
class PlatformEntry:
    """A platform class with the plugin and distribution that provide it."""

    cls: type[Platform]
    plugin: str
    distribution: str


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A platform considered during selection and what its probe found."""

    name: str
    plugin: str
    distribution: str
    priority: int
    probed: bool
    present: bool
    devices: tuple[DeviceInfo, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "plugin": self.plugin,
            "distribution": self.distribution,
            "priority": self.priority,
            "probed": self.probed,
            "present": self.present,
            "devices": [d.to_dict() for d in self.devices],
            "error": self.error,
        }


@dataclasses.dataclass(frozen=True)
class Selection:
    """The selected platform, every candidate, and why the choice was made."""

    platform: Platform
    candidates: tuple[Candidate, ...]
    reason: str


def _dist_name(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "(unknown)", ""
    return dist.metadata["Name"] or "(unknown)", dist.version or ""


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _env_allow_list() -> frozenset[str] | None:
    raw = os.environ.get("HWPLUG_PLUGINS")
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


class HwplugPluginManager(pluggy.PluginManager):
    """A pluggy ``PluginManager`` for project ``"hwplug"`` that knows where plugins came from.

    Plugin failures are collected in :attr:`failures`; with ``strict`` they
    raise :class:`~hwplug.PluginError` instead.
    """

    def __init__(self, *, strict: bool | None = None, trace: bool | None = None) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.strict = (
            os.environ.get("HWPLUG_STRICT", "").strip().lower() in _TRUE
            if strict is None
            else strict
        )
        self.plugin_info: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []
        self._platforms: dict[str, PlatformEntry] | None = None
        if trace if trace is not None else os.environ.get("HWPLUG_TRACE", "") in _TRUE:
            self._enable_trace()

    # -- tracing --------------------------------------------------------------
    def _enable_trace(self) -> None:
        trace_logger = logging.getLogger("hwplug.trace")
        if not trace_logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("hwplug-trace: %(message)s"))
            trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.DEBUG)
        self.trace.root.setwriter(lambda text: trace_logger.debug(text.rstrip("\n")))
        self.enable_tracing()

    # -- failures -------------------------------------------------------------
    def fail(self, plugin: str, distribution: str, stage: str, exc: BaseException | str) -> None:
        """Report a failing plugin: a warning, or a PluginError in strict mode."""
        error = exc if isinstance(exc, str) else error_line(exc)
        failure = PluginFailure(plugin, distribution, stage, error)
        self.failures.append(failure)
        if self.strict:
            raise PluginError(failure.message() + " (HWPLUG_STRICT=1)")
        logger.warning("%s; skipping it", failure.message())
        warnings.warn(failure.message() + "; skipping it", PluginWarning, stacklevel=3)

    def distribution_of(self, plugin_name: str) -> str | None:
        """The distribution that installed ``plugin_name``, if known."""
        info = self.plugin_info.get(plugin_name)
        return info.distribution if info else None

    # -- loading ----------------------------------------------------------------
    def register_plugin(
        self,
        plugin: object,
        name: str,
        *,
        group: str,
        distribution: str,
        version: str = "",
        value: str = "",
        builtin: bool = False,
    ) -> None:
        """Register ``plugin`` under ``name``, reporting a failure instead of raising."""
        if self.has_plugin(name):
            other = self.distribution_of(name) or "(unknown)"
            self.fail(
                name,
                distribution,
                "register",
                f"the plugin name {name!r} is already taken by distribution {other!r}",
            )
            return
        try:
            self.register(plugin, name=name)
        except Exception as exc:
            self.fail(name, distribution, "register", exc)
            return
        self.plugin_info[name] = PluginInfo(name, group, distribution, version, value, builtin)
        self._platforms = None

    def load_entrypoints(self) -> None:
        """Load the built-in platforms and every allowed third-party entry point."""
        allow = _env_allow_list()
        seen_builtin = False
        for group in ENTRY_POINT_GROUPS:
            for ep in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
                dist, version = _dist_name(ep)
                builtin = _normalise(dist) == BUILTIN_DISTRIBUTION
                if not builtin and allow is not None and ep.name not in allow:
                    logger.debug("plugin %r (%s) not in HWPLUG_PLUGINS; skipped", ep.name, dist)
                    continue
                if builtin and self.has_plugin(ep.name):
                    continue  # the same distribution seen twice on sys.path
                seen_builtin = seen_builtin or builtin
                try:
                    obj = ep.load()
                except Exception as exc:
                    self.fail(ep.name, dist, "load", exc)
                    continue
                self.register_plugin(
                    obj,
                    ep.name,
                    group=group,
                    distribution=dist,
                    version=version,
                    value=ep.value,
                    builtin=builtin,
                )
        if not seen_builtin:
            # Running from a source tree without installed metadata.
            self._register_builtin_modules()

    def _register_builtin_modules(self) -> None:
        from hwplug import __version__

        for name, module_name in BUILTIN_MODULES.items():
            if self.has_plugin(name):
                continue
            module = importlib.import_module(module_name)
            self.register_plugin(
                module,
                name,
                group=PLATFORMS_GROUP,
                distribution=BUILTIN_DISTRIBUTION,
                version=__version__,
                value=module_name,
                builtin=True,
            )

    # -- platforms ----------------------------------------------------------------
    def platform_entries(self) -> dict[str, PlatformEntry]:
        """Every platform class provided by the registered plugins, by platform name.

        A platform name claimed twice is a :class:`~hwplug.PluginError` naming
        both distributions.
        """
        if self._platforms is not None:
            return self._platforms
        entries: dict[str, PlatformEntry] = {}
        # Built-ins first, then third parties, each in name order: deterministic.
        impls = sorted(
            self.hook.hwplug_platforms.get_hookimpls(),
            key=lambda impl: (
                not self.plugin_info.get(impl.plugin_name, _NO_INFO).builtin,
                impl.plugin_name,
            ),
        )
        for impl in impls:
            plugin = impl.plugin_name
            dist = self.distribution_of(plugin) or "(unregistered)"
            # Called per implementation so a failure is pinned on its plugin;
            # traced by hand since this bypasses the hook caller.
            self.trace("hwplug_platforms", f"[plugin {plugin}]")
            try:
                result = impl.function()
            except Exception as exc:
                self.fail(plugin, dist, "hwplug_platforms", exc)
                continue
            classes = self._check_platforms_result(plugin, dist, result)
            for cls in classes:
                existing = entries.get(cls.name)
                if existing is not None and existing.cls is not cls:
                    raise PluginError(
                        f"platform name {cls.name!r} is claimed twice: by plugin "
                        f"{existing.plugin!r} (distribution {existing.distribution!r}) and by "
                        f"plugin {plugin!r} (distribution {dist!r}); uninstall one, or exclude "
                        "it with HWPLUG_PLUGINS"
                    )
                entries[cls.name] = PlatformEntry(cls, plugin, dist)
        self._platforms = entries
        return entries

    def _check_platforms_result(
        self, plugin: str, dist: str, result: object
    ) -> list[type[Platform]]:
        if result is None:
            return []
        if not isinstance(result, list | tuple):
            self.fail(
                plugin,
                dist,
                "hwplug_platforms",
                f"returned {type(result).__name__}, expected a list of Platform subclasses",
            )
            return []
        good: list[type[Platform]] = []
        for item in result:
            if not (isinstance(item, type) and issubclass(item, Platform)):
                self.fail(
                    plugin,
                    dist,
                    "hwplug_platforms",
                    f"returned {item!r}, which is not a Platform subclass",
                )
                continue
            if not isinstance(item.name, str) or not item.name:
                self.fail(
                    plugin,
                    dist,
                    "hwplug_platforms",
                    f"platform class {item.__qualname__} has no name",
                )
                continue
            good.append(item)
        return good

    def known_profiles(self) -> dict[str, tuple[str, DeviceInfo]]:
        """Every simulated profile: profile name -> (platform name, device)."""
        found: dict[str, tuple[str, DeviceInfo]] = {}
        for name, entry in sorted(self.platform_entries().items()):
            try:
                profiles = entry.cls.profiles()
            except Exception as exc:
                self.fail(entry.plugin, entry.distribution, "profiles", exc)
                continue
            for profile, device in profiles.items():
                found.setdefault(profile, (name, device))
        return found

    def detect(self, entry: PlatformEntry) -> Candidate:
        """Ask one platform class whether its devices are present."""
        cls = entry.cls
        try:
            self.trace(f"{cls.name}.detect()", f"[plugin {entry.plugin}]")
            devices = cls.detect()
            if not isinstance(devices, list | tuple) or not all(
                isinstance(d, DeviceInfo) for d in devices
            ):
                raise TypeError(f"detect() returned {devices!r}, expected a list of DeviceInfo")
        except Exception as exc:
            self.fail(entry.plugin, entry.distribution, f"{cls.name}.detect()", exc)
            return Candidate(
                cls.name,
                entry.plugin,
                entry.distribution,
                cls.priority,
                True,
                False,
                error=error_line(exc),
            )
        logger.debug("detect %s: %d device(s)", cls.name, len(devices))
        return Candidate(
            cls.name,
            entry.plugin,
            entry.distribution,
            cls.priority,
            True,
            bool(devices),
            tuple(devices),
        )

    # -- selection ------------------------------------------------------------------
    def select(self) -> Selection:
        """Choose the platform from the environment and the probes."""
        entries = self.platform_entries()
        forced = os.environ.get("HWPLUG_PLATFORM", "").strip().lower()
        simulate = os.environ.get("HWPLUG_SIMULATE", "").strip()
        if simulate:
            platform = self.simulate(simulate)
            if forced and forced != platform.name:
                raise ConfigError(
                    f"HWPLUG_SIMULATE={simulate} is a {platform.name} profile but "
                    f"HWPLUG_PLATFORM={forced}; unset one of them"
                )
            candidates = tuple(
                Candidate(
                    n,
                    e.plugin,
                    e.distribution,
                    e.cls.priority,
                    False,
                    n == platform.name,
                    platform.devices if n == platform.name else (),
                )
                for n, e in sorted(entries.items())
            )
            return Selection(platform, candidates, f"HWPLUG_SIMULATE={simulate}")
        if forced:
            entry = self._entry(forced)
            candidate = self.detect(entry)
            if not candidate.present:
                why = f" ({candidate.error})" if candidate.error else ""
                profiles = sorted(entry.cls.profiles())
                hint = (
                    f"; to simulate it, set HWPLUG_SIMULATE to one of: {', '.join(profiles)}"
                    if profiles
                    else ""
                )
                raise ConfigError(
                    f"HWPLUG_PLATFORM={forced}: no {forced} device was detected{why}{hint}"
                )
            others = tuple(
                Candidate(n, e.plugin, e.distribution, e.cls.priority, False, False)
                for n, e in sorted(entries.items())
                if n != forced
            )
            platform = entry.cls(candidate.devices)
            return Selection(platform, (candidate, *others), f"HWPLUG_PLATFORM={forced}")
        candidates = tuple(self.detect(entries[n]) for n in sorted(entries))
        present = [c for c in candidates if c.present]
        if not present:
            raise PluginError(
                "no platform detected, not even the CPU; is the cpu platform excluded? "
                f"candidates: {', '.join(c.name for c in candidates) or 'none'}"
            )
        best = max(c.priority for c in present)
        winners = sorted((c for c in present if c.priority == best), key=lambda c: c.name)
        if len(winners) > 1:
            names = " and ".join(f"{c.name!r} ({c.distribution})" for c in winners)
            raise PluginError(
                f"platforms {names} are both present with priority {best}; set "
                f"HWPLUG_PLATFORM to one of: {', '.join(c.name for c in winners)}"
            )
        chosen = winners[0]
        also = [c.name for c in present if c is not chosen]
        reason = f"highest priority ({best}) among present platforms" + (
            f" (also present: {', '.join(also)})" if also else ""
        )
        platform = entries[chosen.name].cls(chosen.devices)
        return Selection(platform, candidates, reason)

    def _entry(self, name: str) -> PlatformEntry:
        entries = self.platform_entries()
        entry = entries.get(name.strip().lower())
        if entry is None:
            raise ConfigError(
                f"unknown platform {name!r}; known platforms: {', '.join(sorted(entries))}"
            )
        return entry

    def simulate(self, spec: str) -> Platform:
        """The platform simulating profile ``spec`` (``"h100"`` or ``"h100:8"``)."""
        profile, _count = parse_profile_spec(spec)
        known = self.known_profiles()
        if profile not in known:
            raise ConfigError(
                f"unknown device profile {profile!r}; known profiles: {', '.join(sorted(known))}"
            )
        return self.platform_entries()[known[profile][0]].cls.simulate(spec)

    def platform_from_spec(self, spec: str) -> Platform:
        """A platform by name (detected, else its representative profile) or by profile."""
        text = spec.strip().lower()
        entries = self.platform_entries()
        if text in entries:
            entry = entries[text]
            candidate = self.detect(entry)
            if candidate.present:
                return entry.cls(candidate.devices)
            profile = entry.cls.representative()
            if profile is None:
                raise ConfigError(
                    f"platform {text!r} has no device here and no profile to simulate"
                )
            return entry.cls.simulate(profile)
        name, _ = parse_profile_spec(text)
        if name in entries:
            raise ConfigError(f"{spec!r}: a device count needs a profile name, as in 'h100:8'")
        if name not in self.known_profiles():
            raise ConfigError(
                f"unknown platform or profile {spec!r}; platforms: {', '.join(sorted(entries))}; "
                f"profiles: {', '.join(sorted(self.known_profiles()))}"
            )
        return self.simulate(text)


_NO_INFO = PluginInfo("", "", "", "", "", False)

# ---------------------------------------------------------------------------
# Process-wide state: the plugin manager, the selection, overrides
# ---------------------------------------------------------------------------

_lock = threading.RLock()
_manager: HwplugPluginManager | None = None
_selection: Selection | None = None
_overrides: list[Platform] = []


def get_plugin_manager() -> HwplugPluginManager:
    """The process's plugin manager, built (and entry points loaded) on first use."""
    global _manager
    manager = _manager
    if manager is not None:
        return manager
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
    """The current platform: an active :func:`use_platform` override, else the selection."""
    if _overrides:
        return _overrides[-1]
    return select_platform().platform


def platform_from_spec(spec: str) -> Platform:
    """A platform by name or by profile (see :meth:`HwplugPluginManager.platform_from_spec`)."""
    return get_plugin_manager().platform_from_spec(spec)


def reset() -> None:
    """Forget the plugin manager, the selection and overrides (tests, environment changes)."""
    global _manager, _selection
    with _lock:
        _manager = None
        _selection = None
        _overrides.clear()


_F = TypeVar("_F", bound=Callable[..., Any])


class use_platform(contextlib.ContextDecorator):
    """Make a platform current for a block or a function, then restore the previous one.

    ``target`` is a :class:`~hwplug.core.platform.Platform` instance or class, a
    platform name (``"cuda"``: the real one when present, else its
    representative profile) or a profile (``"h100"``, ``"h100:8"``). As a
    context manager it yields the platform::

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
        # Per thread: a decorated function may run in several threads at once.
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

    def __enter__(self) -> Platform:
        platform = self._platform()
        with _lock:
            _overrides.append(platform)
        self._stack().append(platform)
        return platform

    def _stack(self) -> list[Platform]:
        stack: list[Platform] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        platform = self._stack().pop()
        with _lock:
            # Remove this block's entry even if blocks exit out of order (threads).
            for i in range(len(_overrides) - 1, -1, -1):
                if _overrides[i] is platform:
                    del _overrides[i]
                    break
