"""hwplug.platforms.vendor: the public base a vendor's platform subclasses, and its runtime."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

import hwplug
from hwplug.core.config import CacheConfig, EngineConfig
from hwplug.core.platform import DeviceInfo
from hwplug.core.runtime import DeviceRuntime
from hwplug.platforms.cpu import CpuRuntime
from hwplug.platforms.vendor import DeviceQuery, VendorPlatform, VendorRuntime

GiB = 1 << 30

N1 = DeviceInfo("Vend N1", 16 * GiB, arch="n1", vendor="Vend")
N2 = DeviceInfo("Vend N2", 32 * GiB, arch="n2", vendor="Vend", features=frozenset({"fp8"}))


class CountingRuntime(DeviceRuntime):
    """A vendor's runtime: its device calls go to its own library (here, a counter)."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.synchronized = 0

    def synchronize(self) -> None:
        self.require_real_device("synchronize()")
        self.synchronized += 1


class VendPlatform(VendorPlatform):
    name = "vend"
    device_type = "vend"
    vendor = "Vend"
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16", "fp8")
    profile_table: ClassVar[dict[str, DeviceInfo]] = {"vend-n1": N1, "vend-n2": N2}
    runtime_cls = CountingRuntime

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype == "fp8" and not self.has_feature("fp8"):
            return "fp8 needs a Vend N2"
        return None


def test_a_vendor_platform_gets_the_runtime_it_names() -> None:
    plat = VendPlatform([N2])
    assert isinstance(plat.runtime, CountingRuntime)
    plat.synchronize()
    plat.synchronize()
    assert plat.runtime.synchronized == 2  # type: ignore[attr-defined]


def test_a_vendor_runtime_keeps_refusing_simulated_devices() -> None:
    with pytest.raises(RuntimeError, match="simulated"):
        VendPlatform.simulate("vend-n2").synchronize()


def test_the_profile_table_gives_the_profiles() -> None:
    assert VendPlatform.profiles() == {"vend-n1": N1, "vend-n2": N2}
    assert VendPlatform.simulate("vend-n1:2").devices == (N1, N1)


def test_a_device_cache_dtype_problem_becomes_a_message_naming_what_works() -> None:
    with pytest.raises(hwplug.ConfigError) as info:
        hwplug.resolve(
            EngineConfig(cache=CacheConfig(cache_dtype="fp8")),
            platform=VendPlatform.simulate("vend-n1"),
        )
    assert str(info.value) == (
        "cache.cache_dtype='fp8' is not supported on Vend N1 (n1): fp8 needs a Vend N2; "
        "use cache.cache_dtype='auto' or 'bfloat16'"
    )
    assert VendPlatform.simulate("vend-n2").supported_cache_dtypes() == ("auto", "bfloat16", "fp8")


class Tabled(VendorPlatform):
    """A vendor platform on the default runtime, with a memory-usage query."""

    name = "tabled"
    device_type = "tableddev"
    device_queries: ClassVar[dict[str, DeviceQuery]] = {
        "memory usage": DeviceQuery(detected=lambda d: d.total_memory // 4, cached=False),
    }


def test_the_default_vendor_runtime_asks_the_device_query_table_for_memory_in_use() -> None:
    plat = Tabled([N1])
    assert type(plat.runtime) is VendorRuntime
    assert plat.get_current_memory_usage() == 4 * GiB
    assert Tabled([N1], simulated=True).get_current_memory_usage() == 0


def test_without_a_memory_usage_query_the_base_answers() -> None:
    class Untabled(VendorPlatform):
        name = "untabled"
        device_type = "untableddev"  # torch has no such module: 0

    assert Untabled([N1]).get_current_memory_usage() == 0


def test_a_library_without_library_handle_says_what_to_implement() -> None:
    plat = Tabled([N1])
    with pytest.raises(NotImplementedError, match=r"'tabled' .*library_handle\(\)"):
        plat.library_handle(object(), 0)


def test_a_host_tensor_vendor_device_runs_on_the_cpu_runtime() -> None:
    import torch

    class HostNpu(VendorPlatform):
        name = "hostnpu"
        device_type = "cpu"
        runtime_cls = CpuRuntime

    plat = HostNpu([N1, N1])
    assert plat.torch_device(1) == torch.device("cpu")
    plat.set_device(1)
    plat.synchronize()
    free, total = plat.mem_get_info()
    assert 0 < free <= total
    assert plat.get_current_memory_usage() > 0


def test_the_old_module_of_the_shared_base_still_imports() -> None:
    from hwplug.platforms import builtin, vendor

    assert builtin.BuiltinPlatform is vendor.VendorPlatform
    assert builtin.VendorRuntime is vendor.VendorRuntime
