"""hwplug.Session: sessions with different plugins answer independently in one process."""

from __future__ import annotations

from typing import Any

import pytest

import hwplug
from hwplug.attention import TorchAttentionBackend, available_backends, get_backend
from hwplug.conformance import run_checks
from hwplug.core.config import EngineConfig
from hwplug.core.errors import ConfigError
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.core.resolve import ChangeLog
from hwplug.matrix import builtin_plugin_manager, graph_modes, support_matrix
from hwplug.plugins.manager import HwplugPluginManager, Session, default_session


class LakePlatform(Platform):
    name = "lake"
    device_type = "cpu"
    priority = 60

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"lake-1": DeviceInfo("Lake One", 1 << 30)}

    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        return [DeviceInfo("Lake One", 1 << 30)]


class LakeBackend(TorchAttentionBackend):
    name = "lake-attn"


class LakePlugin:
    """Adds a platform, an attention backend and a config rule."""

    @hwplug.hookimpl
    def hwplug_platforms(self) -> list[type[Platform]]:
        return [LakePlatform]

    @hwplug.hookimpl
    def hwplug_attention_backends(self) -> list[type]:
        return [LakeBackend]

    @hwplug.hookimpl
    def hwplug_check_and_update_config(
        self, config: EngineConfig, platform: Platform, changes: ChangeLog
    ) -> None:
        if not changes.was_set("scheduler.max_num_seqs"):
            changes.record("scheduler.max_num_seqs", 7, "the lake serves seven at a time")


class GraphlessVerifier:
    """Refuses every graph mode but NONE (as a verify hook in one session only)."""

    @hwplug.hookimpl
    def hwplug_verify_config(self, config: EngineConfig, platform: Platform) -> None:
        if config.compilation.cudagraph_mode.name != "NONE":
            raise ConfigError("compilation.cudagraph_mode: this site runs without graphs")


def _builtins() -> HwplugPluginManager:
    manager = HwplugPluginManager(strict=True)
    manager.load_builtins()
    return manager


@pytest.fixture
def lake() -> Session:
    manager = _builtins()
    manager.register(LakePlugin(), name="lake")
    return Session(manager)


@pytest.fixture
def plain() -> Session:
    return Session(_builtins())


def test_two_sessions_with_different_plugins_resolve_independently(
    lake: Session, plain: Session
) -> None:
    with_lake = lake.resolve(platform="h100")
    without = plain.resolve(platform="h100")
    assert with_lake.config.scheduler.max_num_seqs == 7
    assert [c.source for c in with_lake.changes_to("scheduler.max_num_seqs")] == ["lake"]
    assert without.config.scheduler.max_num_seqs != 7
    assert not without.changes_to("scheduler.max_num_seqs")


def test_each_session_has_its_own_platforms_and_backends(lake: Session, plain: Session) -> None:
    assert "lake" in lake.platform_names() and "lake" not in plain.platform_names()
    assert lake.profiles_of("lake") == ("lake-1",)
    with pytest.raises(ConfigError, match="unknown platform 'lake'; known platforms: cpu"):
        plain.profiles_of("lake")
    assert lake.get_backend("lake-attn") is LakeBackend
    with pytest.raises(ConfigError, match="lake-attn"):
        plain.get_backend("lake-attn")
    assert lake.selection.platform.name == "lake"  # priority 60 outranks the CPU
    assert plain.platform.name == hwplug.get_platform().name


def test_the_support_matrix_uses_only_the_plugins_it_is_given(lake: Session) -> None:
    default_manager = default_session().plugin_manager
    default_manager.register(GraphlessVerifier(), name="graphless")
    try:
        with pytest.raises(ConfigError, match="runs without graphs"):
            hwplug.resolve(platform="h100")
        rows = {row.profile: row for row in support_matrix(builtin_plugin_manager())}
        # the default session's verify hook does not leak into a matrix of the built-ins
        assert len(rows["h100"].graph_modes) == 5
        assert graph_modes(default_session().platform_from_spec("h100")) == ("NONE",)
        builtin = Session(builtin_plugin_manager())
        assert len(graph_modes(builtin.platform_from_spec("h100"), builtin)) == 5
    finally:
        default_manager.unregister(name="graphless")
    lake_rows = support_matrix(lake)
    assert {row.platform for row in lake_rows} >= {"lake", "cuda"}
    with pytest.raises(ConfigError, match="takes a Session or a HwplugPluginManager, got int"):
        support_matrix(3)  # type: ignore[arg-type]


def test_use_platform_in_one_session_leaves_the_others_alone(lake: Session) -> None:
    before = hwplug.get_platform()
    with lake.use_platform("mi300x") as platform:
        assert lake.platform is platform
        assert hwplug.get_platform() is before
    assert lake.platform.name == "lake"
    with hwplug.use_platform("gaudi3"):
        assert lake.platform.name == "lake"


def test_a_fixed_platform_is_resolved_once_and_used_by_default() -> None:
    session = Session(_builtins(), platform="h100:2")
    assert session.platform is session.platform
    assert session.platform.profile == "h100:2"
    assert session.resolve().platform is session.platform


def test_an_activated_session_is_what_lower_layers_use(lake: Session) -> None:
    assert "lake-attn" not in available_backends()
    with lake.activate():
        assert available_backends()["lake-attn"] is LakeBackend
        assert get_backend("lake-attn") is LakeBackend
    assert available_backends(lake)["lake-attn"] is LakeBackend
    assert "lake-attn" not in available_backends()


def test_activation_holds_in_its_own_thread_only(lake: Session) -> None:
    import threading

    seen: list[bool] = []
    with lake.activate():
        worker = threading.Thread(target=lambda: seen.append("lake-attn" in available_backends()))
        worker.start()
        worker.join()
    assert seen == [False]


def test_the_conformance_kit_uses_the_session_it_is_given(plain: Session) -> None:
    manager = _builtins()
    manager.register(GraphlessVerifier(), name="graphless")
    graphless = Session(manager)
    report = run_checks("h100", kinds=["rule"], session=graphless)
    plain_report = run_checks("h100", kinds=["rule"], session=plain)
    assert plain_report.ok, plain_report.summary()
    assert not report.ok
    failed = {r.id for r in report.results if r.outcome == "fail"}
    assert failed and failed <= {r.id for r in plain_report.results}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"plugin_manager": object()}, "takes a HwplugPluginManager, got object"),
        ({"platform": 3}, "takes a Platform, a platform name or a profile, got int"),
    ],
)
def test_bad_session_arguments_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Session(**kwargs)


def test_resolve_refuses_a_platform_of_another_type(plain: Session) -> None:
    with pytest.raises(ConfigError, match=r"resolve\(platform=...\) takes a Platform"):
        plain.resolve(platform=3.5)  # type: ignore[arg-type]


def test_the_face_uses_the_default_session() -> None:
    session = hwplug.default_session()
    assert session is default_session()
    assert hwplug.get_platform() is session.platform
    assert isinstance(session, hwplug.Session)


def test_profiles_of_an_unknown_platform_suggests_the_near_miss() -> None:
    with pytest.raises(
        hwplug.ConfigError, match=r"unknown platform 'cdua' \(did you mean 'cuda'\?\)"
    ):
        hwplug.default_session().profiles_of("cdua")
