"""Platform runtime services (SPEC 13): device handles, sync, memory, seeding."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from hwplug.core.platform import DeviceInfo, Platform
from hwplug.platforms.cpu import CpuPlatform
from hwplug.platforms.cuda import CudaPlatform

MiB = 1 << 20


@pytest.fixture
def host_cpu() -> CpuPlatform:
    return CpuPlatform(CpuPlatform.detect())


class FakeRuntime:
    """Stands in for ``torch.<device_type>`` of an accelerator."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def set_device(self, index: int) -> None:
        self.calls.append(("set_device", index))

    def synchronize(self) -> None:
        self.calls.append(("synchronize", None))

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache", None))

    def mem_get_info(self, index: int) -> tuple[int, int]:
        self.calls.append(("mem_get_info", index))
        return 3 * MiB, 8 * MiB


class FakeNpu(Platform):
    """A vendor platform whose devices torch drives as ``xpu`` (the runtime is faked)."""

    name = "fakenpu"
    device_type = "xpu"
    vendor = "Fake"


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeNpu, FakeRuntime]:
    runtime = FakeRuntime()
    monkeypatch.setattr(torch, "xpu", runtime)
    return FakeNpu([DeviceInfo("Fake NPU")] * 2), runtime


# -- the host CPU -------------------------------------------------------------------


def test_cpu_torch_device_is_plain_cpu(host_cpu: CpuPlatform) -> None:
    assert host_cpu.torch_device() == torch.device("cpu")
    assert host_cpu.torch_device(0).type == "cpu"


def test_cpu_device_calls_are_no_ops(host_cpu: CpuPlatform) -> None:
    host_cpu.set_device(0)
    host_cpu.synchronize()
    host_cpu.empty_cache()


def test_cpu_mem_get_info_is_the_hosts_memory(host_cpu: CpuPlatform) -> None:
    free, total = host_cpu.mem_get_info()
    assert 0 < free <= total


def test_cpu_memory_usage_is_resident_memory_and_grows(host_cpu: CpuPlatform) -> None:
    before = host_cpu.get_current_memory_usage()
    assert before > 0
    block = torch.ones(64 * MiB // 4)  # touch 64 MiB
    after = host_cpu.get_current_memory_usage()
    assert after >= before + 32 * MiB
    del block


def test_device_index_out_of_range(host_cpu: CpuPlatform) -> None:
    with pytest.raises(IndexError, match="out of range"):
        host_cpu.torch_device(5)
    with pytest.raises(ValueError, match="integer"):
        host_cpu.torch_device(True)


# -- simulated platforms ------------------------------------------------------------


def test_simulated_torch_device_names_the_device() -> None:
    h100 = CudaPlatform.simulate("h100:2")
    assert h100.torch_device() == torch.device("cuda", 0)
    assert h100.torch_device(1) == torch.device("cuda", 1)
    with pytest.raises(IndexError):
        h100.torch_device(2)


@pytest.mark.parametrize("call", ["set_device", "synchronize", "empty_cache", "mem_get_info"])
@pytest.mark.parametrize("platform", ["h100", "cpu-generic"])
def test_simulated_platform_refuses_device_calls(call: str, platform: str) -> None:
    plat = CudaPlatform.simulate(platform) if platform == "h100" else CpuPlatform.simulate(platform)
    args = (0,) if call == "set_device" else ()
    with pytest.raises(RuntimeError, match="simulated") as info:
        getattr(plat, call)(*args)
    assert platform in str(info.value)
    assert "HWPLUG_SIMULATE" in str(info.value)


def test_simulated_devices_are_idle() -> None:
    assert CudaPlatform.simulate("h100").get_current_memory_usage() == 0
    assert CpuPlatform.simulate("cpu-generic").get_current_memory_usage() == 0


def test_seed_everything_is_deterministic_even_when_simulated() -> None:
    plat = CudaPlatform.simulate("h100")
    plat.seed_everything(1234)
    first = (random.random(), torch.rand(4))
    plat.seed_everything(1234)
    second = (random.random(), torch.rand(4))
    assert first[0] == second[0]
    assert torch.equal(first[1], second[1])


@pytest.mark.parametrize("seed", [-1, 1.5, True, "7"])
def test_seed_everything_rejects_bad_seeds(seed: Any) -> None:
    with pytest.raises(ValueError, match="seed"):
        CudaPlatform.simulate("h100").seed_everything(seed)


# -- an accelerator, through torch.<device_type> ----------------------------------------


def test_accelerator_calls_go_to_torch_device_module(
    fake_npu: tuple[FakeNpu, FakeRuntime],
) -> None:
    plat, runtime = fake_npu
    assert plat.torch_device(1) == torch.device("xpu", 1)
    plat.set_device(1)
    plat.synchronize()
    plat.empty_cache()
    assert plat.mem_get_info(1) == (3 * MiB, 8 * MiB)
    assert runtime.calls == [
        ("set_device", 1),
        ("synchronize", None),
        ("empty_cache", None),
        ("mem_get_info", 1),
    ]


def test_accelerator_without_torch_runtime_says_what_is_missing() -> None:
    class Orphan(Platform):
        name = "orphan"
        device_type = "orphandev"

    with pytest.raises(RuntimeError, match=r"torch\.orphandev\.synchronize"):
        Orphan([DeviceInfo("x")]).synchronize()


def test_peak_memory_usage_on_the_host_is_the_resident_memory() -> None:
    from hwplug.platforms.cpu import CpuPlatform

    cpu = CpuPlatform(CpuPlatform.detect())
    assert cpu.peak_memory_usage() >= 1
    assert CpuPlatform.simulate("cpu-generic").peak_memory_usage() == 0


def test_a_real_vendor_device_reports_torchs_allocated_memory(monkeypatch) -> None:
    import types

    import torch

    from hwplug.core.platform import DeviceInfo, Platform

    class Npu(Platform):
        name = "npu"
        device_type = "fakenpu"

    fake = types.SimpleNamespace(memory_allocated=lambda i: 123, max_memory_allocated=lambda i: 456)
    monkeypatch.setattr(torch, "fakenpu", fake, raising=False)
    npu = Npu([DeviceInfo("Fake NPU", 1 << 30)])
    assert npu.get_current_memory_usage() == 123
    assert npu.peak_memory_usage() == 456
    assert Npu([DeviceInfo("Fake NPU", 1 << 30)], simulated=True).get_current_memory_usage() == 0
