"""hwplug.current_platform, get_platform() and use_platform()."""

from __future__ import annotations

import threading

import pytest

import hwplug
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.plugins import manager


class ToyPlatform(Platform):
    name = "toy"
    device_type = "cpu"

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"toy-1": DeviceInfo("Toy One", 1 << 30)}


def test_current_platform_is_the_selection() -> None:
    assert hwplug.current_platform is manager.select_platform().platform
    assert hwplug.get_platform() is hwplug.current_platform


def test_unknown_module_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        hwplug.nonsense


def test_use_platform_with_profile_restores_on_exit() -> None:
    before = hwplug.current_platform
    with hwplug.use_platform("h100:8") as platform:
        assert hwplug.current_platform is platform
        assert platform.name == "cuda" and platform.simulated
        assert len(platform.devices) == 8
        assert platform.profile == "h100:8"
    assert hwplug.current_platform is before


def test_use_platform_nests_and_restores_on_error() -> None:
    before = hwplug.current_platform
    with pytest.raises(RuntimeError), hwplug.use_platform("mi300x") as outer:
        with hwplug.use_platform("gaudi3") as inner:
            assert hwplug.current_platform is inner
        assert hwplug.current_platform is outer
        raise RuntimeError
    assert hwplug.current_platform is before


def test_use_platform_by_name_simulates_the_representative_profile() -> None:
    with hwplug.use_platform("rocm") as platform:
        assert platform.name == "rocm"
        assert platform.simulated and platform.profile == "mi300x"
    with hwplug.use_platform("cpu") as platform:
        assert platform.name == "cpu" and not platform.simulated


def test_use_platform_accepts_instances_and_classes() -> None:
    toy = ToyPlatform([DeviceInfo("Toy", 1)])
    with hwplug.use_platform(toy) as platform:
        assert platform is toy
    with hwplug.use_platform(ToyPlatform) as platform:
        assert isinstance(platform, ToyPlatform) and platform.profile == "toy-1"


def test_use_platform_as_decorator() -> None:
    @hwplug.use_platform("l4")
    def device_name() -> str:
        return hwplug.current_platform.get_device_name()

    assert device_name() == "NVIDIA L4"
    assert hwplug.current_platform.name == "cpu"


@pytest.mark.parametrize("bad", ["h1000", "cuda:2", ":3", "h100:0", "h100:x"])
def test_use_platform_rejects_unknown_specs(bad: str) -> None:
    with pytest.raises(hwplug.ConfigError), hwplug.use_platform(bad):
        pass


def test_use_platform_rejects_other_types() -> None:
    with pytest.raises(hwplug.ConfigError, match="takes a Platform"):
        hwplug.use_platform(42)  # type: ignore[arg-type]


def test_overrides_from_threads_do_not_leak() -> None:
    errors: list[BaseException] = []

    def worker(profile: str) -> None:
        try:
            with hwplug.use_platform(profile):
                pass
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(p,)) for p in ["h100", "mi300x"] * 8]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert hwplug.current_platform.name == "cpu"


def test_reset_forgets_the_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    first = hwplug.current_platform
    monkeypatch.setenv("HWPLUG_SIMULATE", "a100")
    manager.reset()
    try:
        assert hwplug.current_platform.get_device_name() == "NVIDIA A100-SXM4-80GB"
    finally:
        monkeypatch.delenv("HWPLUG_SIMULATE")
        manager.reset()
    assert hwplug.current_platform.name == first.name


def test_decorated_function_running_in_many_threads_restores_cleanly() -> None:
    barrier = threading.Barrier(8)
    names: list[str] = []

    @hwplug.use_platform("h100")
    def work() -> None:
        barrier.wait()
        names.append(hwplug.current_platform.name)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert names == ["cuda"] * 8
    assert hwplug.current_platform.name == "cpu"
    seen: list[str] = []
    fresh = threading.Thread(target=lambda: seen.append(hwplug.current_platform.name))
    fresh.start()
    fresh.join()
    assert seen == ["cpu"]


def test_representative_profile_falls_back_to_the_first_profile() -> None:
    assert ToyPlatform.representative() == "toy-1"

    class Named(ToyPlatform):
        representative_profile = "toy-1"

    class Misnamed(ToyPlatform):
        representative_profile = "no-such-profile"

    assert Named.representative() == "toy-1"
    assert Misnamed.representative() == "toy-1"
    assert Platform.representative() is None
