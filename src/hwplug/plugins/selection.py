"""Selecting the platform: the platform classes plugins provide, their probes, the choice.

``hwplug_platforms`` is called as pluggy would (by :mod:`hwplug.core.hookcall`, so
``tryfirst``, ``trylast`` and wrappers apply); each implementation's result is
checked on its own, so a plugin that raises or returns garbage is named and
skipped while the others go on. Platform classes are validated before they
take part: a name that is not lower case, a priority that is not an integer,
profiles that are not a dict of devices. A platform or profile name claimed twice is a
:class:`~hwplug.PluginError` naming both distributions.

Selection asks every platform's ``detect()`` (torch-free); the present
platform with the highest priority wins. ``HWPLUG_SIMULATE`` (a profile) and
``HWPLUG_PLATFORM`` (a name) choose instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hwplug.core.errors import ConfigError, PluginError, brief, error_line
from hwplug.core.hookcall import call_hook
from hwplug.core.names import is_name
from hwplug.core.platform import DeviceInfo, Platform, parse_profile_spec

if TYPE_CHECKING:
    from pluggy import HookImpl

    from hwplug.plugins.plugin_manager import HwplugPluginManager

__all__ = [
    "Candidate",
    "PlatformEntry",
    "Selection",
    "detect",
    "known_profiles",
    "platform_entries",
    "platform_entry",
    "platform_from_spec",
    "select",
    "simulate",
]

logger = logging.getLogger("hwplug.plugins")

PLATFORM_ENV = "HWPLUG_PLATFORM"
ALLOW_ENV = "HWPLUG_PLUGINS"
SIMULATE_ENV = "HWPLUG_SIMULATE"

_STRING_ATTRIBUTES = ("device_type", "dist_backend", "ray_device_key", "device_control_env_var")


@dataclasses.dataclass(frozen=True)
class PlatformEntry:
    """A platform class with the plugin and distribution that provide it."""

    cls: type[Platform]
    plugin: str
    distribution: str

    def describe(self) -> str:
        return (
            f"platform {self.cls.name!r} of plugin {self.plugin!r} "
            f"(distribution {self.distribution})"
        )


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


# --------------------------------------------------------------------------- the classes


@dataclasses.dataclass(frozen=True)
class _Tagged:
    """One ``hwplug_platforms`` implementation's outcome, labelled with its plugin."""

    plugin: str
    result: object = None
    error: BaseException | None = None


def _tagged(impl: HookImpl, call: Callable[[], Any]) -> Any:
    """Run one implementation; a plain one's outcome comes back labelled with its plugin."""
    if impl.wrapper or impl.hookwrapper:
        return call()
    try:
        return _Tagged(impl.plugin_name, result=call())
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        return _Tagged(impl.plugin_name, error=exc)


def call_each(pm: HwplugPluginManager, hook_name: str) -> list[_Tagged]:
    """Call a collecting hook as pluggy would, each implementation's outcome labelled
    with its plugin (an implementation that raises yields its error, not the call's)."""
    outcomes = call_hook(getattr(pm.hook, hook_name), {}, _tagged)
    return [item for item in outcomes if isinstance(item, _Tagged)]


def _class_problem(item: object) -> str | None:
    """Why ``item`` cannot be used as a platform class, or None."""
    if not (isinstance(item, type) and issubclass(item, Platform)):
        return f"returned {brief(item, 60)}, which is not a Platform subclass"
    name = item.name
    if not isinstance(name, str) or not name:
        return f"platform class {item.__qualname__} has no name"
    if not is_name(name):
        return (
            f"platform class {item.__qualname__} is named {name!r}; platform names are lower "
            f"case (letters, digits, '_', '-', '.'), as in {name.lower()!r}"
        )
    if isinstance(item.priority, bool) or not isinstance(item.priority, int):
        return (
            f"platform {name!r}: priority must be an integer (built-ins use 10, vendors 50), "
            f"got {brief(item.priority, 40)}"
        )
    for attr in _STRING_ATTRIBUTES:
        if not isinstance(getattr(item, attr), str):
            return (
                f"platform {name!r}: {attr} must be a string, got {brief(getattr(item, attr), 40)}"
            )
    try:
        profiles = item.profiles()
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        return f"platform {name!r}: profiles() raised {error_line(exc)}"
    if not isinstance(profiles, dict) or not all(
        isinstance(k, str) and isinstance(v, DeviceInfo) for k, v in profiles.items()
    ):
        return (
            f"platform {name!r}: profiles() must return a dict of profile name -> DeviceInfo, "
            f"got {brief(profiles, 60)}"
        )
    bad = [k for k in profiles if not is_name(k)]
    if bad:
        return (
            f"platform {name!r}: profile names must be lower case, got {', '.join(map(repr, bad))}"
        )
    return None


def platform_entries(pm: HwplugPluginManager) -> dict[str, PlatformEntry]:
    """Every valid platform class the registered plugins provide, by platform name.

    :raises PluginError: a platform name, or a profile name, claimed twice.
    """
    entries: dict[str, PlatformEntry] = {}
    profiles: dict[str, PlatformEntry] = {}
    outcomes = call_each(pm, "hwplug_platforms")
    # Built-ins first, then third parties, each in name order: deterministic.
    outcomes.sort(key=lambda t: (not pm.is_builtin(t.plugin), t.plugin))
    for outcome in outcomes:
        plugin = outcome.plugin
        dist = pm.distribution_of(plugin) or "(unregistered)"
        pm.trace(f"hwplug_platforms: plugin {plugin}")
        if outcome.error is not None:
            pm.fail(plugin, dist, "hwplug_platforms", outcome.error)
            continue
        result = outcome.result
        if result is None:
            continue
        if not isinstance(result, list | tuple):
            pm.fail(
                plugin,
                dist,
                "hwplug_platforms",
                f"returned {type(result).__name__}, expected a list of Platform subclasses",
            )
            continue
        for item in result:
            problem = _class_problem(item)
            if problem is not None:
                pm.fail(plugin, dist, "hwplug_platforms", problem)
                continue
            assert isinstance(item, type)
            assert issubclass(item, Platform)
            entry = PlatformEntry(item, plugin, dist)
            existing = entries.get(item.name)
            if existing is not None:
                if existing.cls is item:
                    continue
                raise PluginError(
                    f"platform name {item.name!r} is claimed twice: by plugin "
                    f"{existing.plugin!r} (distribution {existing.distribution!r}) and by "
                    f"plugin {plugin!r} (distribution {dist!r}); uninstall one, or exclude "
                    "it with HWPLUG_PLUGINS"
                )
            for profile in item.profiles():
                other = profiles.get(profile)
                if other is not None:
                    raise PluginError(
                        f"device profile {profile!r} is claimed twice: by {other.describe()} "
                        f"and by {entry.describe()}; profile names must be unique across "
                        "platforms (rename one, or exclude a plugin with HWPLUG_PLUGINS)"
                    )
                profiles[profile] = entry
            entries[item.name] = entry
    return entries


def known_profiles(pm: HwplugPluginManager) -> dict[str, tuple[str, DeviceInfo]]:
    """Every simulated profile: profile name -> (platform name, device)."""
    found: dict[str, tuple[str, DeviceInfo]] = {}
    for name, entry in sorted(pm.platform_entries().items()):
        for profile, device in entry.cls.profiles().items():
            found[profile] = (name, device)
    return found


# --------------------------------------------------------------------------- probing


def detect(pm: HwplugPluginManager, entry: PlatformEntry) -> Candidate:
    """Ask one platform class whether its devices are present (a failure is reported)."""
    cls = entry.cls
    try:
        pm.trace(f"{cls.name}.detect(): plugin {entry.plugin}")
        devices = cls.detect()
        if not isinstance(devices, list | tuple) or not all(
            isinstance(d, DeviceInfo) for d in devices
        ):
            raise TypeError(
                f"detect() returned {brief(devices, 60)}, expected a list of DeviceInfo"
            )
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        pm.fail(entry.plugin, entry.distribution, f"{cls.name}.detect()", exc)
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


def _start(entry: PlatformEntry, make: Callable[[], Platform]) -> Platform:
    """Make a platform instance; the plugin's failure becomes a PluginError naming it."""
    try:
        platform = make()
    except ConfigError:
        raise
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        raise PluginError(f"{entry.describe()} failed to start: {error_line(exc)}") from exc
    if not isinstance(platform, Platform):
        raise PluginError(
            f"{entry.describe()} failed to start: got {brief(platform, 60)}, not a Platform"
        )
    return platform


def instantiate(entry: PlatformEntry, devices: tuple[DeviceInfo, ...]) -> Platform:
    """``entry.cls(devices)``, with a failure named."""
    return _start(entry, lambda: entry.cls(devices))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'h100'?)`` for a near miss among ``choices``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def simulate(pm: HwplugPluginManager, spec: str) -> Platform:
    """The platform simulating profile ``spec`` (``"h100"`` or ``"h100:8"``)."""
    profile, _count = parse_profile_spec(spec)
    known = pm.known_profiles()
    if profile not in known:
        raise ConfigError(
            f"unknown device profile {profile!r}{did_you_mean(profile, known)}; known "
            f"profiles: {', '.join(sorted(known))}"
        )
    entry = pm.platform_entries()[known[profile][0]]
    return _start(entry, lambda: entry.cls.simulate(spec))


def platform_entry(pm: HwplugPluginManager, name: str) -> PlatformEntry:
    """The entry of platform ``name`` (any case, spaces around ignored).

    :raises ConfigError: unknown platform (a near miss suggested, the known ones listed).
    """
    entries = pm.platform_entries()
    entry = entries.get(name.strip().lower())
    if entry is None:
        raise ConfigError(
            f"unknown platform {name!r}{did_you_mean(name.strip().lower(), entries)}; known "
            f"platforms: {', '.join(sorted(entries))}"
        )
    return entry


def platform_from_spec(pm: HwplugPluginManager, spec: str) -> Platform:
    """A platform by name (detected, else its representative profile) or by profile."""
    if not isinstance(spec, str):
        raise ConfigError(f"a platform name or profile must be a string, got {brief(spec, 40)}")
    text = spec.strip().lower()
    entries = pm.platform_entries()
    if text in entries:
        entry = entries[text]
        candidate = pm.detect(entry)
        if candidate.present:
            return instantiate(entry, candidate.devices)
        profile = entry.cls.representative()
        if profile is None:
            raise ConfigError(f"platform {text!r} has no device here and no profile to simulate")
        return _start(entry, lambda: entry.cls.simulate(profile))
    name, _ = parse_profile_spec(text)
    if name in entries:
        raise ConfigError(f"{spec!r}: a device count needs a profile name, as in 'h100:8'")
    if name not in pm.known_profiles():
        hint = did_you_mean(name, [*entries, *pm.known_profiles()])
        raise ConfigError(
            f"unknown platform or profile {spec!r}{hint}; platforms: "
            f"{', '.join(sorted(entries))}; profiles: {', '.join(sorted(pm.known_profiles()))}"
        )
    return simulate(pm, text)


# --------------------------------------------------------------------------- the choice


def select(pm: HwplugPluginManager, env: Mapping[str, str] | None = None) -> Selection:
    """Choose the platform from the environment and the probes."""
    environ = os.environ if env is None else env
    entries = pm.platform_entries()
    forced = environ.get(PLATFORM_ENV, "").strip().lower()
    spec = environ.get(SIMULATE_ENV, "").strip()
    if spec:
        try:
            platform = simulate(pm, spec)
        except ConfigError as exc:
            raise ConfigError(f"{SIMULATE_ENV}={spec}: {exc}") from None
        if forced and forced != platform.name:
            raise ConfigError(
                f"{SIMULATE_ENV}={spec} is a {platform.name} profile but "
                f"{PLATFORM_ENV}={forced}; unset one of them"
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
        return Selection(platform, candidates, f"{SIMULATE_ENV}={spec}")
    if forced:
        try:
            entry = platform_entry(pm, forced)
        except ConfigError as exc:
            raise ConfigError(f"{PLATFORM_ENV}={forced}: {exc}") from None
        candidate = pm.detect(entry)
        if not candidate.present:
            why = f" ({candidate.error})" if candidate.error else ""
            profile_names = sorted(entry.cls.profiles())
            hint = (
                f"; to simulate it, set {SIMULATE_ENV} to one of: {', '.join(profile_names)}"
                if profile_names
                else ""
            )
            raise ConfigError(
                f"{PLATFORM_ENV}={forced}: no {forced} device was detected{why}{hint}"
            )
        others = tuple(
            Candidate(n, e.plugin, e.distribution, e.cls.priority, False, False)
            for n, e in sorted(entries.items())
            if n != forced
        )
        platform = instantiate(entry, candidate.devices)
        return Selection(platform, (candidate, *others), f"{PLATFORM_ENV}={forced}")
    candidates = tuple(pm.detect(entries[n]) for n in sorted(entries))
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
            f"platforms {names} are both present with priority {best}, and hwplug will not "
            f"guess between them; for this process set {PLATFORM_ENV} to one of: "
            f"{', '.join(c.name for c in winners)}; for good, put {PLATFORM_ENV} (or "
            f"{ALLOW_ENV} without the other's plugin) in the deployment's environment, "
            "uninstall one of the distributions, or have a vendor pick a priority no other "
            "installed platform uses (see 'hwplug plugins', and 'Choose a priority' in the "
            "vendor guide)"
        )
    chosen = winners[0]
    also = [c.name for c in present if c is not chosen]
    reason = f"highest priority ({best}) among present platforms" + (
        f" (also present: {', '.join(also)})" if also else ""
    )
    platform = instantiate(entries[chosen.name], chosen.devices)
    return Selection(platform, candidates, reason)
