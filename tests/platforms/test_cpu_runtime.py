"""CpuRuntime: the host CPU's device services, through public names."""

from __future__ import annotations

import psutil
import pytest
import torch

from hwplug.platforms.cpu import CpuPlatform, CpuRuntime

GiB = 1 << 30


@pytest.fixture
def host() -> CpuPlatform:
    return CpuPlatform(CpuPlatform.detect())


def test_the_cpu_platform_hands_out_a_cpu_runtime(host: CpuPlatform) -> None:
    assert isinstance(host.runtime, CpuRuntime)
    assert host.runtime is host.runtime


def test_device_calls_do_nothing_and_return_nothing(host: CpuPlatform) -> None:
    runtime = host.runtime
    assert runtime.set_device(0) is None
    assert runtime.synchronize() is None
    assert runtime.empty_cache() is None


def test_the_device_is_plain_cpu(host: CpuPlatform) -> None:
    assert host.runtime.torch_device(0) == torch.device("cpu")
    assert CpuPlatform.simulate("xeon-spr").runtime.torch_device() == torch.device("cpu")


def test_memory_is_the_hosts_from_psutil(host: CpuPlatform) -> None:
    free, total = host.runtime.mem_get_info(0)
    assert total == psutil.virtual_memory().total
    assert 0 < free <= total


def test_memory_in_use_is_the_resident_set_and_peak_is_the_same(host: CpuPlatform) -> None:
    rss = psutil.Process().memory_info().rss
    used = host.runtime.get_current_memory_usage(0)
    assert abs(used - rss) < GiB // 4
    assert host.runtime.peak_memory_usage(0) >= used // 2 > 0


def test_a_simulated_cpu_is_idle_and_refuses_device_calls() -> None:
    runtime = CpuPlatform.simulate("cpu-generic").runtime
    assert runtime.get_current_memory_usage() == 0
    assert runtime.peak_memory_usage() == 0
    with pytest.raises(RuntimeError, match="simulated"):
        runtime.synchronize()
    with pytest.raises(RuntimeError, match="simulated"):
        runtime.mem_get_info()


def test_ranks_on_one_host_bind_no_device(host: CpuPlatform) -> None:
    # local rank 3 of a host with one CPU device: nothing to bind, so no IndexError
    assert host.runtime.bind_device(3) is None
    with pytest.raises(IndexError, match="out of range"):
        host.runtime.set_device(3)
