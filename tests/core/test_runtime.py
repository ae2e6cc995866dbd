"""Platform.runtime: the device runtime a platform hands out, and the service names
on Platform that hand over to it (SPEC 13, 14)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from hwplug.core.errors import PluginError
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.core.runtime import DeviceRuntime


class RecordingRuntime(DeviceRuntime):
    """Answers every service with its name and arguments."""

    def _record(self, name: str, *args: Any, **kwargs: Any) -> tuple[str, tuple, dict]:
        return name, args, kwargs

    def torch_device(self, i: int = 0) -> Any:
        return self._record("torch_device", i)

    def set_device(self, i: int) -> Any:
        self.platform.calls.append(self._record("set_device", i))  # type: ignore[attr-defined]

    def synchronize(self) -> Any:
        self.platform.calls.append(self._record("synchronize"))  # type: ignore[attr-defined]

    def empty_cache(self) -> Any:
        self.platform.calls.append(self._record("empty_cache"))  # type: ignore[attr-defined]

    def seed_everything(self, seed: int) -> Any:
        self.platform.calls.append(self._record("seed_everything", seed))  # type: ignore[attr-defined]

    def mem_get_info(self, i: int = 0) -> Any:
        return self._record("mem_get_info", i)

    def get_current_memory_usage(self, i: int = 0) -> Any:
        return self._record("get_current_memory_usage", i)

    def peak_memory_usage(self, i: int = 0) -> Any:
        return self._record("peak_memory_usage", i)

    def init_distributed(self, *args: Any, **kwargs: Any) -> Any:
        return self._record("init_distributed", *args, **kwargs)

    def destroy_distributed(self) -> Any:
        self.platform.calls.append(self._record("destroy_distributed"))  # type: ignore[attr-defined]

    def device_communicator(self, group: Any = None) -> Any:
        return self._record("device_communicator", group)


class Recorded(Platform):
    name = "recorded"
    device_type = "recdev"
    runtime_cls = RecordingRuntime

    def __init__(self) -> None:
        super().__init__([DeviceInfo("Recorded device")] * 2)
        self.calls: list[tuple[str, tuple, dict]] = []


def test_the_runtime_is_built_once_per_platform_instance() -> None:
    first, second = Recorded(), Recorded()
    runtime = first.runtime
    assert isinstance(runtime, RecordingRuntime)
    assert runtime.platform is first
    assert first.runtime is runtime
    assert second.runtime is not runtime
    assert second.runtime.platform is second


def test_the_default_runtime_is_the_base_one() -> None:
    class Plain(Platform):
        name = "plain"
        device_type = "plaindev"

    runtime = Plain([DeviceInfo("x")]).runtime
    assert type(runtime) is DeviceRuntime
    assert "plain" in repr(runtime)


@pytest.mark.parametrize(
    ("method", "args", "kwargs", "expected"),
    [
        ("torch_device", (1,), {}, ("torch_device", (1,), {})),
        ("mem_get_info", (1,), {}, ("mem_get_info", (1,), {})),
        ("get_current_memory_usage", (1,), {}, ("get_current_memory_usage", (1,), {})),
        ("peak_memory_usage", (), {}, ("peak_memory_usage", (0,), {})),
        (
            "init_distributed",
            (1, 2),
            {"local_rank": 0, "init_method": "tcp://h:1"},
            (
                "init_distributed",
                (1, 2),
                {"local_rank": 0, "init_method": "tcp://h:1", "timeout": timedelta(minutes=10)},
            ),
        ),
        ("device_communicator", ("group",), {}, ("device_communicator", ("group",), {})),
    ],
)
def test_platform_services_return_what_the_runtime_answers(
    method: str, args: tuple, kwargs: dict, expected: tuple
) -> None:
    assert getattr(Recorded(), method)(*args, **kwargs) == expected


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("set_device", (1,)),
        ("synchronize", ()),
        ("empty_cache", ()),
        ("seed_everything", (7,)),
        ("destroy_distributed", ()),
    ],
)
def test_platform_services_without_a_result_hand_over_to_the_runtime(
    method: str, args: tuple
) -> None:
    plat = Recorded()
    assert getattr(plat, method)(*args) is None
    assert plat.calls == [(method, args, {})]


def test_a_runtime_cls_that_is_not_a_device_runtime_is_a_plugin_error() -> None:
    class Odd(Platform):
        name = "odd"
        runtime_cls = dict  # type: ignore[assignment]

    with pytest.raises(PluginError, match=r"platform 'odd': runtime_cls is <class 'dict'>"):
        Odd().runtime
    with pytest.raises(PluginError, match="hwplug.core.runtime.DeviceRuntime"):
        Odd().synchronize()
