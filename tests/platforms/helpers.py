"""Helpers every platform test module shares: resolve on a profile, pick one change."""

from __future__ import annotations

from collections.abc import Callable

import hwplug
from hwplug.core.config import EngineConfig
from hwplug.core.platform import Platform

Resolver = Callable[..., hwplug.Resolution]


def resolver(default_profile: str | None = None) -> Resolver:
    """``resolve(profile=default_profile, **sections)``: an ``EngineConfig`` of the given
    sections resolved on a simulated profile (a name, or a Platform instance)."""

    def resolve(profile: str | Platform | None = None, **sections: object) -> hwplug.Resolution:
        target = profile if profile is not None else default_profile
        if target is None:
            raise TypeError("resolve() needs a profile")
        return hwplug.resolve(EngineConfig(**sections), platform=target)  # type: ignore[arg-type]

    return resolve


def change(res: hwplug.Resolution, path: str) -> hwplug.Change:
    """The one change made to ``path`` (fails if there is none or several)."""
    (found,) = res.changes_to(path)
    return found
