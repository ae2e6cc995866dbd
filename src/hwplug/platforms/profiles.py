"""Simulated device profiles of the built-in platforms, gathered from their folders.

Each built-in platform keeps its profiles in ``hwplug/platforms/<name>/profiles.py``:
a :class:`~hwplug.core.platform.DeviceInfo` per real device, with the name,
memory and compute capability or ISA generation the device itself reports.
``HWPLUG_SIMULATE=h100:8`` (or ``use_platform("h100:8")``) runs every rule
against such a device without the hardware. This module gathers them for
look-ups by profile name; the plugin manager answers the same question for
every installed platform, vendor platforms included.

Nothing here imports torch.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

import hwplug.platforms as package
from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceInfo, parse_profile_spec

__all__ = ["PROFILES", "all_profiles", "find_profile"]


@functools.cache
def _gather() -> dict[str, dict[str, DeviceInfo]]:
    found: dict[str, dict[str, DeviceInfo]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            continue
        try:
            module = importlib.import_module(f"{package.__name__}.{info.name}.profiles")
        except ModuleNotFoundError:
            continue
        found[info.name] = dict(module.PROFILES)
    return found


PROFILES: dict[str, dict[str, DeviceInfo]] = _gather()
"""Simulated devices by platform name, then profile name."""


def all_profiles() -> dict[str, str]:
    """Every profile name mapped to the name of its platform."""
    return {profile: platform for platform, table in PROFILES.items() for profile in table}


def find_profile(name: str) -> tuple[str, DeviceInfo]:
    """The platform name and device of profile ``name``.

    ``name`` is case-insensitive; a device count suffix (``"h100:8"``) is
    accepted and ignored here (see ``parse_profile_spec``). An unknown name
    raises :class:`~hwplug.core.errors.ConfigError` listing every known profile.
    """
    if not isinstance(name, str):
        raise ConfigError(f"device profile must be a string such as 'h100', got {name!r}")
    profile, _count = parse_profile_spec(name)
    for platform, table in PROFILES.items():
        if profile in table:
            return platform, table[profile]
    known = ", ".join(sorted(all_profiles()))
    raise ConfigError(f"unknown device profile {profile!r}; known profiles: {known}")
