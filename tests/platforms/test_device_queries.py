"""Device queries on real (not simulated) CUDA and ROCm platforms.

NVML and amdsmi are replaced by the small mocks beside this file; the
``torch.cuda`` fallback is replaced by a recorder, so every path runs on a
machine without a GPU. The last tests, marked ``gpu``, compare against the
real device where there is one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.cuda import CudaPlatform
from hwplug.platforms.rocm import RocmPlatform
from tests.platforms.fakes import nvidia_box
from tests.platforms.mock_amdsmi import FakeAMDGPU, make_amdsmi
from tests.platforms.mock_pynvml import FakeGPU, NVMLError, make_pynvml

MiB = 1 << 20
GiB = 1 << 30

H100 = FakeGPU()
A100 = FakeGPU(
    "NVIDIA A100-SXM4-80GB", 81920 * MiB, (8, 0), "GPU-a100a100-0000-0000-0000-000000000001"
)
L4 = FakeGPU("NVIDIA L4", 23034 * MiB, (8, 9), "GPU-14141414-0000-0000-0000-000000000002")


class TorchCudaRecorder:
    """Stands in for ``torch_cuda_query``: records what was asked, answers from a table."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[str] = []

    def __call__(self, what: str, query: Callable[[Any], Any]) -> Any:
        self.asked.append(what)
        return self.answers.get(what)


def install_nvml(monkeypatch, gpus: list[FakeGPU], **kwargs: Any) -> Any:
    module = make_pynvml(gpus, **kwargs)

    def by_uuid(uuid: str) -> FakeGPU:
        module.calls["nvmlDeviceGetHandleByUUID"] += 1
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu
        raise NVMLError(13)

    module.nvmlDeviceGetHandleByUUID = by_uuid
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


@pytest.fixture
def torch_cuda(monkeypatch) -> TorchCudaRecorder:
    recorder = TorchCudaRecorder()
    monkeypatch.setattr("hwplug.platforms.vendor.torch_cuda_query", recorder)
    return recorder


@pytest.fixture(autouse=True)
def _no_visibility_variables(monkeypatch) -> None:
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)


def sysfs_only(name: str = "NVIDIA H100 80GB HBM3") -> DeviceInfo:
    """What detection knows without NVML: a name, nothing else."""
    return DeviceInfo(name=name, vendor="NVIDIA")


# -- CUDA through NVML -----------------------------------------------------------------


def test_nvml_answers_capability_name_and_memory(monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [H100])
    plat = CudaPlatform([sysfs_only()])
    assert plat.get_device_capability() == DeviceCapability(9, 0)
    assert plat.get_device_name() == "NVIDIA H100 80GB HBM3"
    assert plat.get_device_total_memory() == 81559 * MiB
    assert nvml.calls["nvmlInit"] == nvml.calls["nvmlShutdown"] == 3
    assert torch_cuda.asked == []


def test_nvml_wins_over_what_detection_recorded(monkeypatch, torch_cuda) -> None:
    install_nvml(monkeypatch, [L4])
    stale = DeviceInfo("old name", 1, capability=(7, 0), vendor="NVIDIA")
    plat = CudaPlatform([stale])
    assert plat.get_device_capability() == (8, 9)
    assert plat.get_device_name() == "NVIDIA L4"
    assert plat.get_device_total_memory() == 23034 * MiB
    # The rules follow the queried capability: fp8 e4m3 needs 8.9.
    assert "fp8_e4m3" in plat.supported_cache_dtypes()


def test_results_are_cached(monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [H100])
    plat = CudaPlatform([sysfs_only()])
    for _ in range(5):
        plat.get_device_capability()
        plat.get_device_name()
        plat.get_device_total_memory()
    assert nvml.calls["nvmlInit"] == 3
    assert nvml.calls["nvmlDeviceGetCudaComputeCapability"] == 1


def test_queries_use_the_physical_device(monkeypatch, torch_cuda) -> None:
    install_nvml(monkeypatch, [H100, A100, L4])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    plat = CudaPlatform([sysfs_only(), sysfs_only()])
    assert plat.device_id_to_physical_device_id(0) == 2
    assert plat.get_device_name(0) == "NVIDIA L4"
    assert plat.get_device_name(1) == "NVIDIA H100 80GB HBM3"
    assert plat.get_device_capability(0) == (8, 9)


def test_uuids_in_the_visibility_variable(monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [H100, A100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", A100.uuid)
    plat = CudaPlatform([sysfs_only()])
    assert plat.get_device_name() == "NVIDIA A100-SXM4-80GB"
    assert nvml.calls["nvmlDeviceGetHandleByUUID"] == 1


def test_an_invisible_device_is_an_index_error(monkeypatch, torch_cuda) -> None:
    install_nvml(monkeypatch, [H100, A100])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    plat = CudaPlatform([sysfs_only()])
    with pytest.raises(IndexError, match="CUDA_VISIBLE_DEVICES"):
        plat.get_device_name(1)


@pytest.mark.parametrize("fail_on", ["nvmlInit", "nvmlDeviceGetHandleByIndex"])
def test_nvml_failure_falls_back_to_detection(monkeypatch, torch_cuda, fail_on: str) -> None:
    nvml = install_nvml(monkeypatch, [H100], fail_on=fail_on)
    detected = DeviceInfo("NVIDIA A100-SXM4-80GB", 80 * GiB, capability=(8, 0), vendor="NVIDIA")
    plat = CudaPlatform([detected])
    assert plat.get_device_capability() == (8, 0)
    assert plat.get_device_name() == "NVIDIA A100-SXM4-80GB"
    assert plat.get_device_total_memory() == 80 * GiB
    assert torch_cuda.asked == []
    # Every successful nvmlInit was shut down again.
    inits = nvml.calls["nvmlInit"] - (fail_on == "nvmlInit") * nvml.calls["nvmlInit"]
    assert nvml.calls["nvmlShutdown"] == inits


def test_without_pynvml_detection_then_torch_answer(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    recorder = TorchCudaRecorder({"capability": DeviceCapability(8, 6), "memory": 24 * GiB})
    monkeypatch.setattr("hwplug.platforms.vendor.torch_cuda_query", recorder)
    plat = CudaPlatform([sysfs_only("NVIDIA GeForce RTX 3090")])
    assert plat.get_device_name() == "NVIDIA GeForce RTX 3090"
    assert recorder.asked == []
    assert plat.get_device_capability() == (8, 6)
    assert plat.get_device_total_memory() == 24 * GiB
    assert recorder.asked == ["capability", "memory"]
    assert plat.supported_cache_dtypes() == ("auto", "bfloat16", "fp8_e5m2")


def test_nothing_knows_the_capability(monkeypatch, torch_cuda) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    plat = CudaPlatform([sysfs_only()])
    assert plat.get_device_capability() is None
    assert plat.get_device_total_memory() == 0
    assert not plat.has_device_capability(80)
    # An unknown capability is asked again each time rather than cached.
    assert torch_cuda.asked.count("capability") == 2
    plat.get_device_capability()
    assert torch_cuda.asked.count("capability") == 3


def test_memory_usage_from_nvml_is_not_cached(monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [H100])
    plat = CudaPlatform([sysfs_only()])
    assert plat.get_current_memory_usage() == 512 * MiB
    assert plat.get_current_memory_usage() == 512 * MiB
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 2


def test_memory_usage_falls_back_to_torch(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    recorder = TorchCudaRecorder({"memory usage": 3 * GiB})
    monkeypatch.setattr("hwplug.platforms.vendor.torch_cuda_query", recorder)
    assert CudaPlatform([sysfs_only()]).get_current_memory_usage() == 3 * GiB
    recorder.answers.clear()
    assert CudaPlatform([sysfs_only()]).get_current_memory_usage() == 0


def test_simulated_platforms_never_query(monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [A100])
    plat = CudaPlatform.simulate("h100")
    assert plat.get_device_capability() == (9, 0)
    assert plat.get_device_name() == "NVIDIA H100 80GB HBM3"
    assert plat.get_current_memory_usage() == 0
    assert sum(nvml.calls.values()) == 0
    assert torch_cuda.asked == []


def test_detection_and_construction_run_no_device_query(tmp_path, monkeypatch, torch_cuda) -> None:
    nvml = install_nvml(monkeypatch, [H100])
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(nvidia_box(tmp_path, count=2)))
    devices = CudaPlatform.detect()
    CudaPlatform(devices)
    assert len(devices) == 2
    assert sum(nvml.calls.values()) == 0
    assert torch_cuda.asked == []


# -- ROCm through amdsmi ---------------------------------------------------------------------------


def install_amdsmi(monkeypatch, gpus: list[FakeAMDGPU], **kwargs: Any) -> Any:
    module = make_amdsmi(gpus, **kwargs)

    def usage(gpu: FakeAMDGPU, mem_type: Any) -> int:
        module.calls["amdsmi_get_gpu_memory_usage"] += 1
        return 7 * GiB

    module.amdsmi_get_gpu_memory_usage = usage
    monkeypatch.setitem(sys.modules, "amdsmi", module)
    return module


MI300X = FakeAMDGPU()
MI355X = FakeAMDGPU("AMD Instinct MI355X", "gfx950", 288 * GiB, 0x75A3)


def kfd_only(arch: str | None = "gfx942") -> DeviceInfo:
    return DeviceInfo("AMD Instinct MI300 series", 0, arch=arch, vendor="AMD")


def test_amdsmi_answers_name_memory_and_capability(monkeypatch, torch_cuda) -> None:
    smi = install_amdsmi(monkeypatch, [MI300X])
    plat = RocmPlatform([kfd_only()])
    assert plat.get_device_name() == "AMD Instinct MI300X"
    assert plat.get_device_total_memory() == 192 * GiB
    assert plat.get_device_capability() == DeviceCapability(9, 4)
    assert plat.get_current_memory_usage() == 7 * GiB
    assert smi.calls["amdsmi_init"] == smi.calls["amdsmi_shut_down"]
    assert torch_cuda.asked == []


def test_amdsmi_uses_the_physical_device(monkeypatch, torch_cuda) -> None:
    install_amdsmi(monkeypatch, [MI300X, MI355X])
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    plat = RocmPlatform([kfd_only("gfx950")])
    assert plat.get_device_name() == "AMD Instinct MI355X"
    assert plat.get_device_capability() == (9, 5)


@pytest.mark.parametrize("target", ["gfx950", "gfx950:sramecc+:xnack-", 90500])
def test_arch_from_amdsmi_when_detection_has_none(monkeypatch, torch_cuda, target) -> None:
    gpu = FakeAMDGPU("AMD Instinct MI355X", target, 288 * GiB)
    install_amdsmi(monkeypatch, [gpu])
    plat = RocmPlatform([kfd_only(arch=None)])
    assert plat.device_arch() == "gfx950"
    assert plat.fp8_dtype_name == "float8_e4m3fn"
    assert not plat.is_fp8_fnuz()
    assert "fp8" in plat.supported_cache_dtypes()


def test_amdsmi_failure_falls_back_to_detection(monkeypatch, torch_cuda) -> None:
    install_amdsmi(monkeypatch, [MI300X], fail_on="amdsmi_get_processor_handles")
    detected = DeviceInfo("AMD Instinct MI300X", 192 * GiB, arch="gfx942", vendor="AMD")
    plat = RocmPlatform([detected])
    assert plat.get_device_name() == "AMD Instinct MI300X"
    assert plat.get_device_total_memory() == 192 * GiB
    assert plat.get_device_capability() == (9, 4)
    assert plat.fp8_dtype_name == "float8_e4m3fnuz"
    assert torch_cuda.asked == []


def test_without_amdsmi_torch_is_the_last_resort(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    recorder = TorchCudaRecorder({"arch": "gfx942", "memory usage": GiB})
    monkeypatch.setattr("hwplug.platforms.vendor.torch_cuda_query", recorder)
    plat = RocmPlatform([kfd_only(arch=None)])
    assert plat.device_arch() == "gfx942"
    assert plat.is_fp8_fnuz()
    assert plat.get_current_memory_usage() == GiB
    assert recorder.asked == ["arch", "memory usage"]


def test_simulated_rocm_never_queries(monkeypatch, torch_cuda) -> None:
    smi = install_amdsmi(monkeypatch, [MI355X])
    plat = RocmPlatform.simulate("mi300x")
    assert plat.get_device_name() == "AMD Instinct MI300X"
    assert plat.is_fp8_fnuz()
    assert sum(smi.calls.values()) == 0


# -- real hardware --------------------------------------------------------------------------------


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available()) and torch.version.hip is None


@pytest.mark.gpu
def test_real_nvidia_gpu_queries_match_torch() -> None:
    if not _cuda_available():
        pytest.skip("needs an NVIDIA GPU")
    import torch

    devices = CudaPlatform.detect()
    assert devices, "torch sees a GPU but detection does not"
    plat = CudaPlatform(devices)
    assert plat.get_device_capability() == torch.cuda.get_device_capability(0)
    assert plat.get_device_name() == torch.cuda.get_device_name(0)
    total = torch.cuda.get_device_properties(0).total_memory
    # NVML counts memory the driver reserves; torch reports what CUDA can use.
    assert abs(plat.get_device_total_memory() - total) <= 0.05 * total
    assert plat.get_current_memory_usage() >= 0
