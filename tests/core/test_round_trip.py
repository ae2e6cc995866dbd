"""A resolved config survives to_dict/from_dict exactly, and resolving it again changes nothing."""

from __future__ import annotations

import pytest

import hwplug
from hwplug.core.config import EngineConfig
from hwplug.plugins.manager import get_plugin_manager

PROFILES = sorted(get_plugin_manager().known_profiles())


@pytest.mark.parametrize("profile", PROFILES)
def test_a_resolved_config_round_trips_through_a_dict(profile: str) -> None:
    resolved = hwplug.resolve(platform=profile).config
    assert EngineConfig.from_dict(resolved.to_dict()) == resolved
    assert EngineConfig.from_dict(resolved.to_dict()).compute_hash() == resolved.compute_hash()


@pytest.mark.parametrize("profile", PROFILES)
def test_resolving_a_resolved_config_records_nothing(profile: str) -> None:
    first = hwplug.resolve(platform=profile)
    again = hwplug.resolve(EngineConfig.from_dict(first.config.to_dict()), platform=profile)
    assert again.config == first.config
    assert again.changes == []
