"""Running the checks on one platform and reporting the outcome."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from hwplug._version import __version__
from hwplug.conformance.base import (
    CHECKS,
    KINDS,
    CheckContext,
    CheckFailed,
    CheckSkipped,
    get_check,
)
from hwplug.core.errors import ConfigError, error_line
from hwplug.core.platform import Platform
from hwplug.core.session import SessionProtocol, active_session

__all__ = ["CONFORMANCE_VERSION", "CheckResult", "Report", "load_platform", "run_checks"]

CONFORMANCE_VERSION = "1.1"
"""The version of the contract the checks test; a passing platform "passes hwplug
conformance 1.1"."""

Outcome = Literal["pass", "fail", "skip"]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one check: ``pass``, ``fail`` or ``skip``, and why."""

    id: str
    title: str
    kind: str
    outcome: Outcome
    reason: str
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: id, title, kind, outcome, reason, seconds."""
        return {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "outcome": self.outcome,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
        }


@dataclasses.dataclass(frozen=True)
class Report:
    """Every check's result for one platform; :attr:`ok` when none failed."""

    platform: str
    profile: str | None
    simulated: bool
    device: str
    results: tuple[CheckResult, ...]

    @property
    def ok(self) -> bool:
        """Whether no check failed."""
        return all(r.outcome != "fail" for r in self.results)

    def counts(self) -> dict[str, int]:
        """How many checks passed, failed and were skipped."""
        return {o: sum(r.outcome == o for r in self.results) for o in ("pass", "fail", "skip")}

    def result(self, id: str) -> CheckResult:
        """The result of check ``id``."""
        for r in self.results:
            if r.id == id:
                return r
        raise KeyError(id)

    def failed(self) -> list[str]:
        """Ids of the failing checks."""
        return [r.id for r in self.results if r.outcome == "fail"]

    def summary(self) -> str:
        """One line: the verdict and the counts."""
        counts = self.counts()
        verdict = (
            f"passes hwplug conformance {CONFORMANCE_VERSION}"
            if self.ok
            else f"fails hwplug conformance {CONFORMANCE_VERSION}"
        )
        where = f"simulated {self.profile}" if self.simulated else self.device
        return (
            f"{self.platform} ({where}) {verdict}: {counts['pass']} passed, "
            f"{counts['fail']} failed, {counts['skip']} skipped"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: version, platform, profile, simulated, device, ok, counts, results."""
        return {
            "conformance_version": CONFORMANCE_VERSION,
            "hwplug_version": __version__,
            "platform": self.platform,
            "profile": self.profile,
            "simulated": self.simulated,
            "device": self.device,
            "ok": self.ok,
            "counts": self.counts(),
            "results": [r.to_dict() for r in self.results],
        }


def load_platform(
    name: str, profile: str | None = None, *, session: SessionProtocol | None = None
) -> Platform:
    """Platform ``name`` on ``profile`` (one of its own), else on the detected device,
    else on its representative profile, from ``session``'s plugins (default: the
    active session).

    :raises ConfigError: unknown platform, or a profile of another platform.
    """
    chosen = _session(session)
    key = name.strip().lower()
    own = chosen.profiles_of(key)  # raises for an unknown platform, listing the known ones
    if profile is None:
        return chosen.platform_from_spec(key)
    profile_name = profile.strip().lower().partition(":")[0]
    if profile_name not in own:
        raise ConfigError(
            f"unknown {key} profile {profile!r}; profiles of {key}: {', '.join(sorted(own))}"
        )
    return chosen.platform_from_spec(profile.strip().lower())


def _session(session: SessionProtocol | None) -> SessionProtocol:
    chosen = session or active_session("the conformance kit")
    assert chosen is not None  # active_session raises when none and a purpose is given
    return chosen


def _validate(
    kinds: Iterable[str], skip: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, str]]:
    chosen = tuple(k.strip().lower() for k in kinds)
    unknown = [k for k in chosen if k not in KINDS]
    if unknown or not chosen:
        raise ConfigError(
            f"unknown check kind {', '.join(map(repr, unknown)) or '(none)'}; kinds: "
            f"{', '.join(KINDS)}"
        )
    skips: dict[str, str] = {}
    for id, reason in skip.items():
        found = get_check(id)
        if not str(reason).strip():
            raise ConfigError(f"skipping {found.id} needs a reason, as in {found.id}=REASON")
        skips[found.id] = str(reason).strip()
    return chosen, skips


def run_checks(
    platform_or_profile: Platform | str,
    *,
    kinds: Iterable[str] = KINDS,
    skip: Mapping[str, str] | None = None,
    context: CheckContext | None = None,
    progress: Callable[[str, str, int, int], None] | None = None,
    session: SessionProtocol | None = None,
) -> Report:
    """Run the checks of ``kinds`` on a platform, a platform name or a profile.

    A name means the detected device, else the platform's representative
    profile. ``skip`` maps check ids to the reason each is skipped (it is
    reported). A check that raises anything other than its verdict fails,
    naming the exception. ``progress(id, title, index, total)`` is called
    before each check (the CLI's status line). ``session``: whose plugins take
    part (default: ``context.session``, else the active session).

    :raises ConfigError: an unknown platform, profile, kind or check id, or a
        skip without a reason.
    """
    chosen, skips = _validate(kinds, skip or {})
    the_session = _session(session or (context.session if context is not None else None))
    if isinstance(platform_or_profile, Platform):
        platform = platform_or_profile
    elif isinstance(platform_or_profile, str):
        platform = the_session.platform_from_spec(platform_or_profile)
    else:
        raise ConfigError(
            f"run_checks() takes a Platform, a platform name or a profile, got "
            f"{type(platform_or_profile).__name__}"
        )
    ctx = (
        context if context is not None else CheckContext.for_platform(platform, session=the_session)
    )
    if ctx.session is None:
        ctx.session = the_session
    chosen_checks = [item for item in CHECKS.values() if item.kind in chosen]
    results = []
    for index, item in enumerate(chosen_checks):
        if progress is not None:
            progress(item.id, item.title, index, len(chosen_checks))
        results.append(run_one(item.id, platform, ctx, skip_reason=skips.get(item.id)))
    return Report(
        platform=platform.name,
        profile=platform.profile,
        simulated=platform.simulated,
        device=platform.describe_device(),
        results=tuple(results),
    )


@contextlib.contextmanager
def _library_quiet() -> Iterator[None]:
    """Hold back hwplug's warnings while checks resolve hundreds of configs."""
    logger = logging.getLogger("hwplug")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def run_one(
    check_id: str, platform: Platform, context: CheckContext, *, skip_reason: str | None = None
) -> CheckResult:
    """Run one check and turn its verdict into a :class:`CheckResult`.

    The check runs in a worker thread for at most ``context.timeout`` seconds
    (None: no limit). A check still running then fails, saying so: a hook or a
    kernel that never returns cannot hang the kit. The worker is a daemon
    thread left to finish on its own (Python cannot stop a thread).
    """
    item = get_check(check_id)

    def result(outcome: Outcome, reason: str, seconds: float = 0.0) -> CheckResult:
        return CheckResult(item.id, item.title, item.kind, outcome, reason, seconds)

    if skip_reason is not None:
        return result("skip", f"skipped by request: {skip_reason}")
    context.notes = []
    verdict: list[BaseException | None] = []

    def work() -> None:
        try:
            item.check(platform, context)
        except BaseException as exc:  # handed to the caller's thread as the verdict
            verdict.append(exc)
        else:
            verdict.append(None)

    start = time.perf_counter()
    with _library_quiet():
        if context.timeout is None:
            work()
        else:
            # the check sees the caller's context (use_platform, for one)
            worker = threading.Thread(
                target=contextvars.copy_context().run,
                args=(work,),
                name=f"hwplug-conformance-{item.id}",
                daemon=True,
            )
            worker.start()
            worker.join(context.timeout)
    seconds = time.perf_counter() - start
    if not verdict:
        return result(
            "fail",
            f"the check did not finish within {context.timeout:g} s (a hook, probe or kernel "
            "of the platform that never returns?); it was abandoned",
            seconds,
        )
    exc = verdict[0]
    if exc is None:
        return result("pass", "; ".join(context.notes), seconds)
    if isinstance(exc, CheckFailed):
        return result("fail", exc.reason, seconds)
    if isinstance(exc, CheckSkipped):
        return result("skip", exc.reason, seconds)
    if isinstance(exc, Exception):
        return result("fail", f"the check raised {error_line(exc)}", seconds)
    raise exc  # KeyboardInterrupt, SystemExit: not a verdict on the platform
