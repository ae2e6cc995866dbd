"""Run tests over simulated platforms: the ``hwplug`` pytest plugin.

Installed with hwplug (``pytest11`` entry point), so any test suite gets:

``--hwplug-profiles=h100,mi300x,...|all``
    the device profiles that tests using the ``hwplug_platform`` fixture run
    on. Default: one representative profile per installed platform.
fixture ``hwplug_platform``
    parametrised over the selected profiles (test ids show the profile, as in
    ``test_x[h100]``); makes ``hwplug.current_platform`` that simulated
    platform for the duration of the test and yields it.
marker ``hwplug_platforms(*names)``
    limits a test to those platforms (or profiles); a test none of whose
    platforms is selected gets an empty parameter set and is skipped.
marker ``hwplug_requires_device(name)``
    skips a test unless platform ``name`` is really present (detected, never
    simulated).

The report header names the platform detected on this machine. Detection for
the header and for ``hwplug_requires_device`` runs on a private plugin
manager, so it never fixes the process-wide current platform.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from hwplug.core.errors import ConfigError, PluginError, error_line
from hwplug.core.platform import Platform, parse_profile_spec
from hwplug.plugins.manager import Candidate, HwplugPluginManager, use_platform

__all__ = ["FIXTURE", "HwplugSession"]

FIXTURE = "hwplug_platform"
"""Name of the fixture parametrised over the selected profiles."""

_PLATFORMS_MARKER = "hwplug_platforms"
_REQUIRES_MARKER = "hwplug_requires_device"


@dataclasses.dataclass(frozen=True)
class _Profile:
    spec: str
    platform: str


class HwplugSession:
    """What the plugin knows in one pytest session: plugins, profiles, detection.

    Built lazily, so a pytest run that never uses hwplug's fixture or markers
    loads no hwplug plugin at all.
    """

    def __init__(self, option: str | None) -> None:
        self.option = option
        self._manager: HwplugPluginManager | None = None
        self._profiles: tuple[_Profile, ...] | None = None
        self._detected: dict[str, Candidate | str] = {}

    @property
    def manager(self) -> HwplugPluginManager:
        """A private plugin manager (the process-wide selection is left alone)."""
        if self._manager is None:
            manager = HwplugPluginManager()
            with warnings.catch_warnings():
                # Failing plugins are reported in the header, not as warnings here.
                warnings.simplefilter("ignore")
                manager.load_entrypoints()
                manager.platform_entries()
            self._manager = manager
        return self._manager

    def profiles(self) -> tuple[_Profile, ...]:
        """The profiles selected by ``--hwplug-profiles`` (validated)."""
        if self._profiles is None:
            self._profiles = self._select_profiles()
        return self._profiles

    def _select_profiles(self) -> tuple[_Profile, ...]:
        manager = self.manager
        known = manager.known_profiles()
        text = (self.option or "").strip()
        if not text:
            chosen = []
            for name, entry in sorted(manager.platform_entries().items()):
                spec = entry.cls.representative()
                if spec is not None:
                    chosen.append(_Profile(spec, name))
            return tuple(chosen)
        if text.lower() == "all":
            return tuple(_Profile(spec, plat) for spec, (plat, _dev) in sorted(known.items()))
        profiles: list[_Profile] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                name, count = parse_profile_spec(part)
            except ConfigError as exc:
                raise pytest.UsageError(f"--hwplug-profiles: {exc}") from None
            if name not in known:
                raise pytest.UsageError(
                    f"--hwplug-profiles: unknown profile {name!r}; known profiles: "
                    f"{', '.join(sorted(known))} (or 'all')"
                )
            spec = name if count == 1 else f"{name}:{count}"
            if all(p.spec != spec for p in profiles):
                profiles.append(_Profile(spec, known[name][0]))
        if not profiles:
            raise pytest.UsageError(
                "--hwplug-profiles is empty; give profile names separated by commas, or 'all'"
            )
        return tuple(profiles)

    def check_marker_names(self, nodeid: str, names: set[str]) -> None:
        """Refuse ``hwplug_platforms`` names that are neither a platform nor a profile.

        :raises pytest.UsageError: naming the test, the unknown names and the known ones.
        """
        platforms = set(self.manager.platform_entries())
        known = platforms | set(self.manager.known_profiles())
        unknown = sorted(names - known)
        if unknown:
            raise pytest.UsageError(
                f"{nodeid}: @pytest.mark.{_PLATFORMS_MARKER} names unknown platform or profile "
                f"{', '.join(map(repr, unknown))}; installed platforms: "
                f"{', '.join(sorted(platforms))} (profiles: hwplug profiles)"
            )

    def detected(self, name: str) -> Candidate | str:
        """The probe result for platform ``name``, or why it could not be probed."""
        if name not in self._detected:
            entries = self.manager.platform_entries()
            entry = entries.get(name)
            if entry is None:
                self._detected[name] = (
                    f"platform {name!r} is not installed (installed: {', '.join(sorted(entries))})"
                )
            else:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        self._detected[name] = self.manager.detect(entry)
                except Exception as exc:
                    self._detected[name] = f"detecting {name!r} failed: {error_line(exc)}"
        return self._detected[name]

    def header(self) -> list[str]:
        """Report-header lines: the detected platform, plugin failures."""
        lines: list[str] = []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                manager = HwplugPluginManager()
                manager.load_entrypoints()
                selection = manager.select()
        except Exception as exc:
            return [f"hwplug: platform detection failed: {error_line(exc)}"]
        platform = selection.platform
        lines.append(
            f"hwplug: detected platform {platform.name} ({_describe(platform)}; {selection.reason})"
        )
        lines.extend(f"hwplug: {failure.message()}" for failure in manager.failures)
        if self.option:
            lines.append(f"hwplug: profiles: {self.option}")
        return lines


def _describe(platform: Platform) -> str:
    count = len(platform.devices)
    device = platform.describe_device()
    amount = f"{count} x {device}" if count > 1 else device
    return f"simulated {platform.profile}: {amount}" if platform.simulated else amount


_SESSION = pytest.StashKey[HwplugSession]()


def _session(config: pytest.Config) -> HwplugSession:
    return config.stash[_SESSION]


# --------------------------------------------------------------------------- hooks


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hwplug", "hwplug platform test matrix")
    group.addoption(
        "--hwplug-profiles",
        dest="hwplug_profiles",
        default=None,
        metavar="PROFILES",
        help=(
            "device profiles to run hwplug_platform tests on: comma-separated names "
            "(h100,mi300x,h100:8) or 'all'; default: one representative profile per "
            "installed platform"
        ),
    )
    group.addoption(
        "--hwplug-conformance",
        dest="hwplug_conformance",
        default=None,
        metavar="NAMES",
        help=(
            "run hwplug's conformance checks on these platforms (comma-separated names, "
            "as in npu,cuda): one test per check per platform"
        ),
    )
    group.addoption(
        "--hwplug-conformance-timeout",
        dest="hwplug_conformance_timeout",
        default=None,
        type=float,
        metavar="SECONDS",
        help="how long one conformance check may run before it fails as hung (default 600)",
    )


class ConformanceItem(pytest.Item):
    """One conformance check on one platform (``--hwplug-conformance``)."""

    def __init__(self, *, platform_name: str, check_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.platform_name = platform_name
        self.check_id = check_id

    def runtest(self) -> None:
        # lazy: the conformance kit needs hypothesis (the test extra), loaded only when asked for
        from hwplug.conformance import CheckContext, load_platform, run_one

        cache = self.config.stash.setdefault(_CONFORMANCE, {})
        if self.platform_name not in cache:
            platform = load_platform(self.platform_name)
            timeout = self.config.getoption("hwplug_conformance_timeout", default=None)
            limit = {} if timeout is None else {"timeout": timeout}
            cache[self.platform_name] = (platform, CheckContext.for_platform(platform, **limit))
        platform, context = cache[self.platform_name]
        result = run_one(self.check_id, platform, context)
        if result.outcome == "skip":
            pytest.skip(result.reason)
        if result.outcome == "fail":
            raise _CheckFailure(f"{result.id} {result.title}: {result.reason}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, _CheckFailure):
            return f"{self.platform_name} fails {excinfo.value}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[str, int | None, str]:
        return "hwplug-conformance", None, f"{self.platform_name} {self.check_id}"


class _CheckFailure(Exception):
    """A conformance check failed (its reason is the message)."""


_CONFORMANCE = pytest.StashKey[dict[str, Any]]()


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    text = config.getoption("hwplug_conformance", default=None)
    if not text:
        return
    # lazy: the conformance kit needs hypothesis (the test extra), loaded only when asked for
    from hwplug.conformance import CHECKS, load_platform

    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise pytest.UsageError("--hwplug-conformance is empty; give platform names, as in npu")
    timeout = config.getoption("hwplug_conformance_timeout", default=None)
    if timeout is not None and not 0 < timeout < float("inf"):
        raise pytest.UsageError(
            f"--hwplug-conformance-timeout {timeout!r}: give a positive number of seconds"
        )
    for name in names:
        try:
            load_platform(name)
        except (ConfigError, PluginError) as exc:
            raise pytest.UsageError(f"--hwplug-conformance: {exc}") from None
        for check_id in CHECKS:
            items.append(
                ConformanceItem.from_parent(
                    session,
                    name=f"hwplug_conformance[{name}-{check_id}]",
                    platform_name=name,
                    check_id=check_id,
                )
            )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{_PLATFORMS_MARKER}(*names): run this test only on these hwplug platforms "
        "(or profiles) among the selected profiles",
    )
    config.addinivalue_line(
        "markers",
        f"{_REQUIRES_MARKER}(name): skip unless hwplug platform `name` is really present "
        "(detected hardware, never simulated)",
    )
    session = HwplugSession(config.getoption("hwplug_profiles", default=None))
    config.stash[_SESSION] = session
    if session.option is not None:
        try:
            session.profiles()  # a bad name is a usage error before collection
        except PluginError as exc:
            raise pytest.UsageError(f"--hwplug-profiles: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _session(config).header()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if FIXTURE not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if FIXTURE in names:
            return  # the test parametrises the fixture itself
    session = _session(metafunc.config)
    profiles = session.profiles()
    for marker in metafunc.definition.iter_markers(_PLATFORMS_MARKER):
        wanted = {str(arg).strip().lower() for arg in marker.args}
        session.check_marker_names(metafunc.definition.nodeid, wanted)
        profiles = tuple(
            p for p in profiles if p.platform in wanted or parse_profile_spec(p.spec)[0] in wanted
        )
    specs = [p.spec for p in profiles]
    metafunc.parametrize(FIXTURE, specs, ids=specs, indirect=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers = list(item.iter_markers(_REQUIRES_MARKER))
    if not markers:
        return
    session = _session(item.config)
    for marker in markers:
        if len(marker.args) != 1 or not isinstance(marker.args[0], str):
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.{_REQUIRES_MARKER} takes one platform name, "
                f"got {marker.args!r}"
            )
        name = marker.args[0].strip().lower()
        found = session.detected(name)
        if isinstance(found, str):
            pytest.skip(f"needs a real {name} device: {found}")
        if not found.present:
            why = f" ({found.error})" if found.error else ""
            pytest.skip(f"needs a real {name} device; none detected{why}")


@pytest.fixture
def hwplug_platform(request: pytest.FixtureRequest) -> Iterator[Platform]:
    """The simulated platform of this test's profile, made ``hwplug.current_platform``.

    Parametrised over ``--hwplug-profiles``; the previous current platform is
    restored after the test.
    """
    spec = getattr(request, "param", None)
    if not isinstance(spec, str):
        raise pytest.UsageError(
            f"{request.node.nodeid}: the {FIXTURE} fixture is parametrised by the hwplug "
            "plugin; parametrise it only with profile names (indirect=True)"
        )
    with use_platform(spec) as platform:
        yield platform
