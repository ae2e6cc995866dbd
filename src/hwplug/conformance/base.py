"""The pieces every conformance check is made of: the check, its context, its verdict."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from hwplug.core.errors import ConfigError, PluginError, error_line
from hwplug.core.session import SessionProtocol, active_session

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.platform import Platform
    from hwplug.core.resolve import Resolution

__all__ = [
    "CHECKS",
    "DEFAULT_TIMEOUT",
    "KINDS",
    "Check",
    "CheckContext",
    "CheckFailed",
    "CheckSkipped",
    "Kind",
    "check",
    "get_check",
]

Kind = Literal["rule", "runtime"]
KINDS: tuple[Kind, ...] = ("rule", "runtime")
"""Rule checks ask the platform's tables and resolution; runtime checks run kernels."""


class CheckFailed(Exception):
    """The platform breaks the contract the check protects; the message says how."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CheckSkipped(Exception):
    """The check cannot run here (no device, nothing to check); the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


CheckFunction = Callable[["Platform", "CheckContext"], None]


@dataclasses.dataclass(frozen=True)
class Check:
    """One conformance check: a stable id, a title, what it protects an engine from."""

    id: str
    title: str
    protects: str
    kind: Kind
    function: CheckFunction

    def check(self, platform: Platform, context: CheckContext) -> None:
        """Run the check; raise :class:`CheckFailed` or :class:`CheckSkipped`."""
        self.function(platform, context)


CHECKS: dict[str, Check] = {}
"""Every check by id, in the order they run."""


def check(
    id: str, title: str, *, protects: str, kind: Kind
) -> Callable[[CheckFunction], CheckFunction]:
    """Register the decorated function as check ``id``."""

    def register(function: CheckFunction) -> CheckFunction:
        if id in CHECKS:
            raise ValueError(f"conformance check id {id!r} is registered twice")
        CHECKS[id] = Check(id, title, protects, kind, function)
        return function

    return register


def get_check(id: str) -> Check:
    """The check called ``id``.

    :raises ConfigError: no such check (the message lists the ids).
    """
    try:
        return CHECKS[id.strip().upper()]
    except KeyError:
        raise ConfigError(
            f"unknown conformance check {id!r}; checks: {', '.join(CHECKS)}"
        ) from None


DEFAULT_TIMEOUT = 600.0
"""Seconds one check may run before it fails as hung (the slowest, T04 on a simulated
device under the Triton interpreter, takes about a minute on two cores)."""


class ResolutionBlocked(Exception):
    """Resolution cannot start on this platform (reported by another check)."""


@dataclasses.dataclass
class CheckContext:
    """What the checks share in one run: sizes, the seed, notes and how to resolve.

    ``examples`` is the number of generated configs per rule check; ``device``
    the torch device runtime checks use (None: they skip, ``runtime_problem``
    says why); ``timeout`` the seconds one check may run before it fails as
    hung (None: no limit); ``session`` the session whose plugins take part in
    resolution (None: the active session, :mod:`hwplug.core.session`). A
    check adds to ``notes`` what it could not cover (shown with a pass).
    """

    examples: int = 25
    seed: int = 0
    timeout: float | None = DEFAULT_TIMEOUT
    device: str | None = "cpu"
    runtime_problem: str | None = None
    resolution_problem: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    session: SessionProtocol | None = None

    def __post_init__(self) -> None:
        timeout = self.timeout
        if timeout is not None and not (
            isinstance(timeout, (int, float))
            and not isinstance(timeout, bool)
            and 0 < timeout < float("inf")
        ):
            raise ConfigError(
                f"the conformance timeout must be a positive number of seconds (or None for "
                f"no limit); got {timeout!r}"
            )

    @classmethod
    def for_platform(cls, platform: Platform, **kwargs: Any) -> CheckContext:
        """The context for ``platform``: CPU tensors when simulated or a CPU device,
        the platform's device when real and usable, else no runtime checks."""
        context = cls(**kwargs)
        context.device, context.runtime_problem = _runtime_device(platform)
        try:
            platform.has_device_graphs()
        except PluginError as exc:
            context.resolution_problem = (
                f"resolution cannot run on this platform: {error_line(exc)} (see R12)"
            )
        return context

    def note(self, text: str) -> None:
        """Record something the check could not cover."""
        self.notes.append(text)

    def resolve(self, platform: Platform, config: EngineConfig) -> Resolution:
        """Resolve ``config`` on ``platform`` with every plugin of the session taking part.

        :raises ResolutionBlocked: the platform cannot resolve anything (another check says why).
        """
        if self.resolution_problem is not None:
            raise ResolutionBlocked(self.resolution_problem)
        return self.the_session().resolve(config, platform=platform)

    def the_session(self) -> SessionProtocol:
        """``session``, else the active session.

        :raises RuntimeError: neither (core used without hwplug's face).
        """
        session = self.session or active_session("the conformance kit")
        assert session is not None  # active_session raises when none and a purpose is given
        return session


def _runtime_device(platform: Platform) -> tuple[str | None, str | None]:
    if platform.simulated:
        return "cpu", None
    if platform.device_type in ("", "cpu"):
        return "cpu", None
    try:
        import torch

        module = getattr(torch, platform.device_type, None)
        available = module is not None and bool(module.is_available())
    except Exception as exc:
        return None, f"torch cannot reach the {platform.device_type} device: {error_line(exc)}"
    if not available:
        return None, (
            f"torch.{platform.device_type}.is_available() is false: runtime checks need "
            "the device (or a simulated profile, which runs them on CPU tensors)"
        )
    return str(platform.torch_device(0)), None
