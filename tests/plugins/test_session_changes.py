"""A session follows its plugin set at once: every reader, in every thread, and the
registering thread itself, sees a registration or unregistration as soon as it returns;
the platform table, the backends and the selection follow every way a plugin comes or goes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import hwplug
from hwplug.attention import TorchAttentionBackend
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.plugins.manager import HwplugPluginManager, Session

ROUNDS = 3000


class RiverPlatform(Platform):
    name = "river"
    device_type = "cpu"
    priority = 70

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"river-1": DeviceInfo("River One", 1 << 30)}

    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        return [DeviceInfo("River One", 1 << 30)]


class RiverBackend(TorchAttentionBackend):
    name = "river-attn"


class RiverPlugin:
    @hwplug.hookimpl
    def hwplug_platforms(self) -> list[type[Platform]]:
        return [RiverPlatform]

    @hwplug.hookimpl
    def hwplug_attention_backends(self) -> list[type]:
        return [RiverBackend]


class QuietRule:
    """A plugin with no platform: it must leave the selection as it is."""

    @hwplug.hookimpl
    def hwplug_verify_config(self, config: object, platform: Platform) -> None:
        return None


def _session() -> Session:
    manager = HwplugPluginManager(strict=True)
    manager.load_builtins()
    return Session(manager)


@pytest.fixture
def session() -> Session:
    return _session()


@pytest.fixture
def readers(session: Session) -> Iterator[threading.Event]:
    """Two threads reading the session's backends, platform table and platform without pause."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                session.attention_backends()
                session.platform_names()
                session.get_platform()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    yield stop
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors


def test_the_registering_thread_always_sees_its_change(
    session: Session, readers: threading.Event
) -> None:
    manager = session.plugin_manager
    missing = stale = 0
    for _ in range(ROUNDS):
        manager.register(RiverPlugin(), name="river")
        if "river-attn" not in session.attention_backends() or "river" not in (
            session.platform_names()
        ):
            missing += 1
        manager.unregister(name="river")
        if "river-attn" in session.attention_backends() or "river" in session.platform_names():
            stale += 1
    assert (missing, stale) == (0, 0)


def test_other_threads_see_a_change_once_it_returns(session: Session) -> None:
    """A reader told "registered" (after register() returned) sees the backend; told
    "unregistered", it no longer does."""
    manager = session.plugin_manager
    registered = threading.Event()
    seen: list[bool] = []
    done = threading.Event()

    def reader() -> None:
        for _ in range(300):
            registered.wait(timeout=10)
            seen.append("river-attn" in session.attention_backends())
            registered.clear()
            done.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    for _ in range(300):
        manager.register(RiverPlugin(), name="river")
        registered.set()
        assert done.wait(timeout=10)
        done.clear()
        manager.unregister(name="river")
    thread.join(timeout=30)
    assert seen == [True] * 300


def test_concurrent_registrations_are_all_seen(session: Session) -> None:
    manager = session.plugin_manager
    session.attention_backends()
    classes = [type(f"B{i}", (TorchAttentionBackend,), {"name": f"b{i}"}) for i in range(16)]

    def plugin_for(cls: type) -> object:
        class One:
            @hwplug.hookimpl
            def hwplug_attention_backends(self) -> list[type]:
                return [cls]

        return One()

    threads = [
        threading.Thread(target=manager.register, args=(plugin_for(cls), cls.name))
        for cls in classes
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {cls.name for cls in classes} <= set(session.attention_backends())


@pytest.mark.parametrize("how", ["register", "register_plugin"])
def test_the_platform_table_follows_every_way_in_and_out(session: Session, how: str) -> None:
    manager = session.plugin_manager
    assert "river" not in session.platform_names()  # the table is derived before the change
    if how == "register":
        manager.register(RiverPlugin(), name="river")
    else:
        manager.register_plugin(
            RiverPlugin(), "river", group="hwplug.platforms", distribution="river-dist"
        )
        assert manager.distribution_of("river") == "river-dist"
    assert "river" in session.platform_names()
    assert session.resolve(platform="river-1").platform.name == "river"
    assert session.platform.name == "river"  # priority 70 beats the CPU: reselected

    manager.unregister(name="river")
    assert "river" not in session.platform_names()
    assert manager.distribution_of("river") is None
    assert "river-attn" not in session.attention_backends()
    with pytest.raises(hwplug.ConfigError, match="unknown platform or profile 'river-1'"):
        session.resolve(platform="river-1")
    assert session.platform.name == "cpu"


def test_unregister_by_object_and_blocking_remove_the_platform(session: Session) -> None:
    manager = session.plugin_manager
    plugin = RiverPlugin()
    manager.register(plugin, name="river")
    assert "river" in session.platform_names()
    manager.unregister(plugin)
    assert "river" not in session.platform_names()

    manager.register(RiverPlugin(), name="river")
    assert "river" in session.platform_names()
    manager.set_blocked("river")
    assert "river" not in session.platform_names()
    manager.register_plugin(RiverPlugin(), "river", group="g", distribution="river-dist")
    assert "river" not in session.platform_names()  # a blocked name stays out
    assert manager.distribution_of("river") is None


def test_a_plugin_without_platforms_keeps_the_selected_platform(session: Session) -> None:
    before = session.platform
    session.plugin_manager.register(QuietRule(), name="quiet")
    assert session.platform is before
    session.plugin_manager.unregister(name="quiet")
    assert session.platform is before
