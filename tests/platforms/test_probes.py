"""Hardware probes against fake /sys, /proc and /dev trees and mock vendor libraries."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.probes import (
    cpu_numa_nodes,
    ipex_available,
    probe_amd,
    probe_cpu,
    probe_habana,
    probe_intel_gpu,
    probe_nvidia,
)
from hwplug.platforms.profiles import PROFILES
from tests.platforms.fakes import (
    DGX_ADDRESSES,
    XEON_FLAGS,
    FakeRoot,
    amd_box,
    empty_box,
    habana_box,
    intel_discrete_box,
    intel_integrated_box,
    jetson_box,
    nvidia_box,
)
from tests.platforms.mock_amdsmi import FakeAMDGPU, make_amdsmi
from tests.platforms.mock_pynvml import FakeGPU, NVMLError_LibraryNotFound, make_pynvml

GiB = 1 << 30
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_vendor_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see no real NVML/amdsmi/IPEX unless they install a mock."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr("hwplug.platforms.cpu.probe.ipex_available", lambda: False)
    monkeypatch.delenv("HWPLUG_PROBE_ROOT", raising=False)


def numbered_nvidia_box(path: Path, count: int = 8) -> FakeRoot:
    """An NVIDIA box whose GPUs are told apart by name ("GPU 0" ... "GPU 7")."""
    root = FakeRoot(path)
    for minor, address in enumerate(DGX_ADDRESSES[:count]):
        root.nvidia_gpu(
            address,
            model=f"GPU {minor}",
            minor=minor,
            uuid=f"GPU-{minor}{minor}aaaaaa-0000-0000-0000-00000000000{minor}",
        )
    return root


def names(devices: list[DeviceInfo]) -> list[str]:
    return [d.name for d in devices]


# ---------------------------------------------------------------------------
# NVIDIA
# ---------------------------------------------------------------------------


def test_nvidia_box_reports_eight_h100_like_the_profile(tmp_path: Path) -> None:
    devices = probe_nvidia(nvidia_box(tmp_path), env={})
    assert devices == [PROFILES["cuda"]["h100"]] * 8


def test_nvidia_names_come_from_proc_driver_information(tmp_path: Path) -> None:
    root = nvidia_box(tmp_path, count=2, device=0x20B2, model="NVIDIA A100-SXM4-80GB")
    (root.path / f"proc/driver/nvidia/gpus/{DGX_ADDRESSES[1]}/information").write_text(
        "Model: \t\t NVIDIA A100-SXM4-80GB (renamed)\n"
    )
    devices = probe_nvidia(root, env={})
    assert names(devices) == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB (renamed)"]
    assert all(d.capability == (8, 0) and d.vendor == "NVIDIA" for d in devices)


def test_nvidia_without_proc_entries_names_from_the_device_id_table(tmp_path: Path) -> None:
    root = nvidia_box(tmp_path, count=1, device=0x27B8, model=None)
    assert probe_nvidia(root, env={}) == [PROFILES["cuda"]["l4"]]


def test_nvidia_unknown_device_id_has_no_capability_or_memory(tmp_path: Path) -> None:
    root = nvidia_box(tmp_path, count=1, device=0x2BFF, model=None)
    (device,) = probe_nvidia(root, env={})
    assert device == DeviceInfo(name="NVIDIA GPU [10de:2bff]", vendor="NVIDIA")


def test_nvidia_skips_bridges_audio_and_other_drivers(tmp_path: Path) -> None:
    root = nvidia_box(tmp_path, count=2)
    root.pci_device("0000:01:00.1", vendor=0x10DE, device=0x10FA, pci_class=0x040300)
    root.nvidia_gpu("0000:41:00.0", driver="vfio-pci", minor=9)
    assert len(probe_nvidia(root, env={})) == 2


def test_nvidia_gpu_without_driver_link_still_counts(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.nvidia_gpu("0000:18:00.0", driver=None)
    assert len(probe_nvidia(root, env={})) == 1


def test_nvidia_nothing_present(tmp_path: Path) -> None:
    assert probe_nvidia(empty_box(tmp_path), env={}) == []
    assert probe_nvidia(tmp_path / "does-not-exist", env={}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,3", ["GPU 0", "GPU 3"]),
        ("3,1", ["GPU 3", "GPU 1"]),
        (" 2 , 0 ", ["GPU 2", "GPU 0"]),
        ("", []),
        ("  ", []),
        ("-1", []),
        ("0,-1,1", ["GPU 0"]),
        ("1,9,2", ["GPU 1"]),
        ("1,x,2", ["GPU 1"]),
        ("1,,2", ["GPU 1"]),
        ("1,1", ["GPU 1"]),
        ("GPU-55aaaaaa-0000-0000-0000-000000000005", ["GPU 5"]),
        ("GPU-66aa,0", ["GPU 6", "GPU 0"]),
        ("gpu-77AAAAAA", ["GPU 7"]),
        ("GPU-", []),
        ("4,GPU-ffff", ["GPU 4"]),
        ("MIG-0c2e1f32-5a5b-5c1d-9a2e-5f1a2b3c4d5e", []),
    ],
)
def test_cuda_visible_devices(tmp_path: Path, value: str, expected: list[str]) -> None:
    root = numbered_nvidia_box(tmp_path)
    assert names(probe_nvidia(root, env={"CUDA_VISIBLE_DEVICES": value})) == expected


@pytest.fixture(scope="module")
def numbered_box(tmp_path_factory: pytest.TempPathFactory) -> FakeRoot:
    return numbered_nvidia_box(tmp_path_factory.mktemp("numbered"))


def _cuda_rule(entries: list[str], count: int) -> list[str]:
    """The CUDA rule, restated: take entries until one is not a new valid index."""
    seen: list[int] = []
    for entry in entries:
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= count or int(entry) in seen:
            break
        seen.append(int(entry))
    return [f"GPU {i}" for i in seen]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.integers(min_value=-2, max_value=10).map(str),
            st.sampled_from(["", "x", " 3", "GPU-zz"]),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_cuda_visible_devices_follows_the_prefix_rule(
    numbered_box: FakeRoot, entries: list[str]
) -> None:
    value = ",".join(entries)
    expected = [] if not value.strip() else _cuda_rule(entries, 8)
    assert names(probe_nvidia(numbered_box, env={"CUDA_VISIBLE_DEVICES": value})) == expected


def test_probes_default_to_hwplug_probe_root_and_os_environ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = numbered_nvidia_box(tmp_path)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert names(probe_nvidia()) == ["GPU 2"]
    assert len(probe_nvidia(env={})) == 8


# -- NVML -------------------------------------------------------------------------

NVML_GPUS = [
    FakeGPU(),
    FakeGPU(
        name="NVIDIA L4",
        memory=23034 * MiB,
        capability=(8, 9),
        uuid="GPU-11111111-2222-3333-4444-555555555555",
    ),
]


def test_nvml_gives_name_memory_and_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = make_pynvml(NVML_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    devices = probe_nvidia("/", env={})
    assert devices == [PROFILES["cuda"]["h100"], PROFILES["cuda"]["l4"]]
    assert nvml.calls["nvmlInit"] == nvml.calls["nvmlShutdown"] == 1


def test_nvml_result_honours_cuda_visible_devices_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_pynvml(NVML_GPUS))
    devices = probe_nvidia("/", env={"CUDA_VISIBLE_DEVICES": "GPU-1111,0"})
    assert names(devices) == ["NVIDIA L4", "NVIDIA H100 80GB HBM3"]


def test_nvml_accepts_bytes_names_from_old_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = make_pynvml(NVML_GPUS[:1])
    nvml.nvmlDeviceGetName = lambda handle: b"NVIDIA H100 80GB HBM3"
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert probe_nvidia("/", env={}) == [PROFILES["cuda"]["h100"]]


def test_nvml_with_no_gpus_is_authoritative(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # In a container without GPUs, sysfs still shows the host's: NVML wins.
    monkeypatch.setitem(sys.modules, "pynvml", make_pynvml([]))
    monkeypatch.setattr("hwplug.platforms.cuda.probe.is_host_root", lambda root: True)
    assert probe_nvidia(nvidia_box(tmp_path), env={}) == []


@pytest.mark.parametrize(
    "fail_on",
    ["nvmlInit", "nvmlDeviceGetCount", "nvmlDeviceGetName", "nvmlDeviceGetCudaComputeCapability"],
)
def test_nvml_error_falls_back_to_sysfs_and_logs_why(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fail_on: str,
) -> None:
    nvml = make_pynvml(NVML_GPUS, fail_on=fail_on)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr("hwplug.platforms.cuda.probe.is_host_root", lambda root: True)
    with caplog.at_level(logging.DEBUG, logger="hwplug.probes"):
        devices = probe_nvidia(nvidia_box(tmp_path, count=3), env={})
    assert devices == [PROFILES["cuda"]["h100"]] * 3
    assert "using sysfs" in caplog.text
    if fail_on != "nvmlInit":
        assert nvml.calls["nvmlShutdown"] == 1


def test_nvml_library_missing_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nvml = make_pynvml(NVML_GPUS, fail_on="nvmlInit", error=NVMLError_LibraryNotFound)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr("hwplug.platforms.cuda.probe.is_host_root", lambda root: True)
    assert len(probe_nvidia(nvidia_box(tmp_path, count=2), env={})) == 2


def test_nvml_failing_shutdown_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_pynvml(NVML_GPUS, fail_on="nvmlShutdown"))
    with caplog.at_level(logging.DEBUG, logger="hwplug.probes"):
        assert len(probe_nvidia("/", env={})) == 2
    assert "nvmlShutdown failed" in caplog.text


def test_nvml_is_not_used_for_a_fake_root_or_when_disabled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nvml = make_pynvml(NVML_GPUS)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert len(probe_nvidia(nvidia_box(tmp_path), env={})) == 8
    monkeypatch.setattr("hwplug.platforms.cuda.probe.is_host_root", lambda root: True)
    assert len(probe_nvidia(tmp_path, env={}, use_nvml=False)) == 8
    assert sum(nvml.calls.values()) == 0


def test_a_bug_in_the_nvml_bindings_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = make_pynvml(NVML_GPUS)

    def broken(handle: object) -> str:
        raise RuntimeError("binding bug")

    nvml.nvmlDeviceGetName = broken
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with pytest.raises(RuntimeError, match="binding bug"):
        probe_nvidia("/", env={})
    assert nvml.calls["nvmlShutdown"] == 1


# -- Jetson -------------------------------------------------------------------------


def test_jetson_is_one_integrated_gpu(tmp_path: Path) -> None:
    (device,) = probe_nvidia(jetson_box(tmp_path), env={})
    assert device == DeviceInfo(
        name="NVIDIA Jetson AGX Orin Developer Kit",
        total_memory=64 * GiB,
        capability=DeviceCapability.parse((8, 7)),
        vendor="NVIDIA",
    )


@pytest.mark.parametrize(
    ("model", "capability"),
    [
        ("NVIDIA Jetson Xavier NX Developer Kit", (7, 2)),
        ("NVIDIA Jetson Nano Developer Kit", (5, 3)),
        ("Some carrier board", None),
    ],
)
def test_jetson_capability_by_family(
    tmp_path: Path, model: str, capability: tuple[int, int] | None
) -> None:
    (device,) = probe_nvidia(jetson_box(tmp_path, model=model), env={})
    assert device.name == model
    assert device.capability == capability


def test_jetson_marked_by_tegra_firmware_without_model(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.mkdir("sys/class/tegra-firmware")
    (device,) = probe_nvidia(root, env={})
    assert device.name == "NVIDIA Jetson"
    assert device.total_memory == 0


def test_jetson_honours_cuda_visible_devices(tmp_path: Path) -> None:
    root = jetson_box(tmp_path)
    assert probe_nvidia(root, env={"CUDA_VISIBLE_DEVICES": ""}) == []
    assert len(probe_nvidia(root, env={"CUDA_VISIBLE_DEVICES": "0"})) == 1
    assert probe_nvidia(root, env={"CUDA_VISIBLE_DEVICES": "1"}) == []


# ---------------------------------------------------------------------------
# AMD
# ---------------------------------------------------------------------------


def test_amd_box_reports_eight_mi300x_like_the_profile(tmp_path: Path) -> None:
    assert probe_amd(amd_box(tmp_path), env={}) == [PROFILES["rocm"]["mi300x"]] * 8


@pytest.mark.parametrize(
    ("version", "arch", "capability", "name"),
    [
        (90402, "gfx942", (9, 4), "AMD Instinct MI300 series"),
        (90010, "gfx90a", (9, 0), "AMD Instinct MI200 series"),
        (110000, "gfx1100", (11, 0), "AMD Radeon RX 7900 series"),
        (90500, "gfx950", (9, 5), "AMD Instinct MI350 series"),
        (120001, "gfx1201", (12, 0), "AMD Radeon RX 9070 series"),
        (100300, "gfx1030", (10, 3), "AMD GPU sienna_cichlid (gfx1030)"),
        (90012, "gfx90c", (9, 0), "AMD GPU (gfx90c)"),
    ],
)
def test_amd_gfx_target_version_decoding(
    tmp_path: Path, version: int, arch: str, capability: tuple[int, int], name: str
) -> None:
    root = FakeRoot(tmp_path)
    root.kfd_node(0, gfx_target_version=0)
    asic = "sienna_cichlid" if version == 100300 else "ip discovery"
    root.kfd_node(1, gfx_target_version=version, name=asic, banks=((1, 16 * GiB),))
    (device,) = probe_amd(root, env={})
    assert (device.arch, device.capability, device.name) == (arch, capability, name)
    assert device.total_memory == 16 * GiB
    assert device.vendor == "AMD"


def test_amd_names_by_device_id(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.kfd_node(1, gfx_target_version=90402, device_id=0x74A5, banks=((1, 256 * GiB),))
    root.kfd_node(2, gfx_target_version=90010, device_id=0x740C, banks=((1, 64 * GiB),))
    devices = probe_amd(root, env={})
    assert devices[0] == PROFILES["rocm"]["mi325x"]
    assert devices[1].name == "AMD Instinct MI250X / MI250"


def test_amd_memory_counts_only_device_local_banks(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.kfd_node(1, gfx_target_version=90402, banks=((0, 512 * GiB), (1, 8 * GiB), (2, 8 * GiB)))
    root.kfd_node(2, gfx_target_version=90402)
    root.kfd_node(3, gfx_target_version=90402)
    (root.path / "sys/class/kfd/kfd/topology/nodes/3/mem_banks/0").mkdir(parents=True)
    (root.path / "sys/class/kfd/kfd/topology/nodes/3/mem_banks/0/properties").write_text(
        "size_in_bytes 4096\n"
    )
    assert [d.total_memory for d in probe_amd(root, env={})] == [16 * GiB, 0, 4096]


def test_amd_nodes_sort_numerically(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    for index in (10, 2, 1):
        root.kfd_node(index, gfx_target_version=90402, banks=((1, index * GiB),))
    assert [d.total_memory for d in probe_amd(root, env={})] == [GiB, 2 * GiB, 10 * GiB]


@pytest.fixture
def amd_numbered(tmp_path: Path) -> FakeRoot:
    """Four GPUs told apart by memory: GPU i has i+1 GiB."""
    root = FakeRoot(tmp_path)
    root.kfd_node(0, gfx_target_version=0)
    for i in range(4):
        root.kfd_node(
            i + 1,
            gfx_target_version=90402,
            unique_id=0xABC0 + i,
            banks=((1, (i + 1) * GiB),),
        )
    return root


def gib(devices: list[DeviceInfo]) -> list[int]:
    return [d.total_memory // GiB - 1 for d in devices]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0, 1, 2, 3]),
        ({"HIP_VISIBLE_DEVICES": "2,0"}, [2, 0]),
        ({"HIP_VISIBLE_DEVICES": ""}, []),
        ({"HIP_VISIBLE_DEVICES": "-1"}, []),
        ({"HIP_VISIBLE_DEVICES": "1,7,0"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "3"}, [3]),
        ({"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "3"}, [1]),
        ({"ROCR_VISIBLE_DEVICES": "1,2,3"}, [1, 2, 3]),
        ({"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2"}, [3]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-000000000000abc2"}, [2]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-000000000000ABC3,0"}, [3, 0]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-ffff"}, []),
        ({"ROCR_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_amd_visibility_variables(
    amd_numbered: FakeRoot, env: dict[str, str], expected: list[int]
) -> None:
    assert gib(probe_amd(amd_numbered, env=env)) == expected


def test_amdsmi_gives_names_memory_and_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    smi = make_amdsmi(
        [
            FakeAMDGPU(),
            FakeAMDGPU(
                market_name="AMD Instinct MI355X",
                target_graphics_version="gfx950",
                memory=288 * GiB,
            ),
            FakeAMDGPU(market_name="", target_graphics_version=90010, memory=64 * GiB),
        ]
    )
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    devices = probe_amd("/", env={"HIP_VISIBLE_DEVICES": "0,1,2"})
    assert devices[:2] == [PROFILES["rocm"]["mi300x"], PROFILES["rocm"]["mi355x"]]
    assert (devices[2].name, devices[2].arch, devices[2].capability) == (
        "AMD Instinct MI200 series",
        "gfx90a",
        (9, 0),
    )
    assert smi.calls["amdsmi_init"] == smi.calls["amdsmi_shut_down"] == 1


@pytest.mark.parametrize("fail_on", ["amdsmi_init", "amdsmi_get_gpu_asic_info"])
def test_amdsmi_error_falls_back_to_kfd(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fail_on: str,
) -> None:
    smi = make_amdsmi([FakeAMDGPU()], fail_on=fail_on)
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    monkeypatch.setattr("hwplug.platforms.rocm.probe.is_host_root", lambda root: True)
    with caplog.at_level(logging.DEBUG, logger="hwplug.probes"):
        devices = probe_amd(amd_box(tmp_path, count=2), env={})
    assert devices == [PROFILES["rocm"]["mi300x"]] * 2
    assert "using the KFD topology" in caplog.text
    assert smi.calls["amdsmi_shut_down"] == (0 if fail_on == "amdsmi_init" else 1)


def test_amdsmi_is_skipped_for_fake_roots_and_when_disabled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smi = make_amdsmi([FakeAMDGPU()])
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    root = amd_box(tmp_path, count=3)
    assert len(probe_amd(root, env={})) == 3
    monkeypatch.setattr("hwplug.platforms.rocm.probe.is_host_root", lambda root: True)
    assert len(probe_amd(root, env={}, use_amdsmi=False)) == 3
    assert sum(smi.calls.values()) == 0


def test_amd_nothing_present(tmp_path: Path) -> None:
    root = empty_box(tmp_path)
    root.kfd_node(0, gfx_target_version=0)
    assert probe_amd(root, env={}) == []


# ---------------------------------------------------------------------------
# Intel Gaudi
# ---------------------------------------------------------------------------


def test_habana_box_reports_eight_gaudi2_like_the_profile(tmp_path: Path) -> None:
    devices = probe_habana(habana_box(tmp_path), env={})
    assert devices == [PROFILES["hpu"]["gaudi2"]] * 8
    assert "fp8" in devices[0].features


@pytest.mark.parametrize(
    ("device_id", "profile"),
    [
        (0x1000, "gaudi"),
        (0x1010, "gaudi"),
        (0x1020, "gaudi2"),
        (0x1060, "gaudi3"),
        (0x1062, "gaudi3"),
    ],
)
def test_habana_generation_from_device_id(tmp_path: Path, device_id: int, profile: str) -> None:
    root = habana_box(tmp_path, count=1, device=device_id)
    assert probe_habana(root, env={}) == [PROFILES["hpu"][profile]]


def test_habana_first_generation_has_no_fp8(tmp_path: Path) -> None:
    (device,) = probe_habana(habana_box(tmp_path, count=1, device=0x1000), env={})
    assert (device.arch, device.features) == ("gaudi", frozenset())


def test_habana_skips_goya_and_needs_driver_nodes(tmp_path: Path) -> None:
    root = habana_box(tmp_path, devices=(0x0001, 0x1020))
    assert probe_habana(root, env={}) == [PROFILES["hpu"]["gaudi2"]]
    for node in (root.path / "dev/accel").iterdir():
        node.unlink()
    assert probe_habana(root, env={}) == []


def test_habana_accepts_legacy_hl_nodes(tmp_path: Path) -> None:
    root = habana_box(tmp_path, count=2)
    for node in (root.path / "dev/accel").iterdir():
        node.unlink()
    root.touch("dev/hl0")
    root.touch("dev/hl1")
    assert len(probe_habana(root, env={})) == 2


# Bus order: gaudi2, gaudi3, gaudi2, gaudi3; module ids 0, 1, 2, 3 are at bus
# positions 0, 1, 2, 3 shifted by the fake's wiring (module = (i + 4) % 4 = i).
MIXED = (0x1020, 0x1060, 0x1000, 0x1062)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ["gaudi2", "gaudi3", "gaudi", "gaudi3"]),
        ("2,0", ["gaudi", "gaudi2"]),
        ("1", ["gaudi3"]),
        ("01", ["gaudi3"]),
        ("", []),
        ("-1", []),
        ("0,9,1", ["gaudi2"]),
        ("0,0", ["gaudi2"]),
    ],
)
def test_habana_visible_modules(tmp_path: Path, value: str | None, expected: list[str]) -> None:
    root = habana_box(tmp_path, devices=MIXED)
    env = {} if value is None else {"HABANA_VISIBLE_MODULES": value}
    assert [d.arch for d in probe_habana(root, env=env)] == expected


def test_habana_visible_modules_use_module_ids_not_bus_order(tmp_path: Path) -> None:
    root = habana_box(tmp_path, devices=(0x1020, 0x1060, 0x1000, 0x1062, 0x1020, 0x1020))
    # Six cards: bus position i carries module (i + 4) % 6.
    env = {"HABANA_VISIBLE_MODULES": "4,5"}
    assert [d.arch for d in probe_habana(root, env=env)] == ["gaudi2", "gaudi3"]


def test_habana_without_module_ids_uses_bus_order(tmp_path: Path) -> None:
    root = habana_box(tmp_path, devices=MIXED, module_ids=False)
    env = {"HABANA_VISIBLE_MODULES": "3"}
    assert [d.arch for d in probe_habana(root, env=env)] == ["gaudi3"]


def test_habana_nothing_present(tmp_path: Path) -> None:
    assert probe_habana(empty_box(tmp_path), env={}) == []


# ---------------------------------------------------------------------------
# Intel GPUs
# ---------------------------------------------------------------------------


def test_intel_max_1550_on_xe_sums_tile_vram(tmp_path: Path) -> None:
    devices = probe_intel_gpu(intel_discrete_box(tmp_path), env={})
    assert devices == [PROFILES["xpu"]["max-1550"]] * 2


def test_intel_arc_a770_on_i915_backport_reads_lmem(tmp_path: Path) -> None:
    root = intel_discrete_box(
        tmp_path, device=0x56A0, count=1, driver="i915", tiles=1, vram_per_tile=16 * GiB
    )
    assert probe_intel_gpu(root, env={}) == [PROFILES["xpu"]["arc-a770"]]


def test_intel_arc_b580_on_xe(tmp_path: Path) -> None:
    root = intel_discrete_box(tmp_path, device=0xE20B, count=1, tiles=1, vram_per_tile=12 * GiB)
    assert probe_intel_gpu(root, env={}) == [PROFILES["xpu"]["arc-b580"]]


def test_intel_newer_xe_layout_tile_memory_dir(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    pci = root.pci_device(
        "0000:03:00.0", vendor=0x8086, device=0xE20B, pci_class=0x030000, driver="xe"
    )
    root.write(
        f"{pci.relative_to(root.path)}/tile0/memory/physical_vram_size_bytes", "12884901888\n"
    )
    (device,) = probe_intel_gpu(root, env={})
    assert device.total_memory == 12 * GiB


def test_intel_known_discrete_id_counts_without_memory_file(tmp_path: Path) -> None:
    # Upstream i915 publishes no local-memory file for DG2.
    root = FakeRoot(tmp_path)
    root.pci_device("0000:03:00.0", vendor=0x8086, device=0x56A0, pci_class=0x030000, driver="i915")
    (device,) = probe_intel_gpu(root, env={})
    assert (device.name, device.arch, device.total_memory) == (
        "Intel(R) Arc(TM) A770 Graphics",
        "dg2",
        0,
    )


def test_intel_unknown_discrete_id_with_vram_counts(tmp_path: Path) -> None:
    root = intel_discrete_box(tmp_path, device=0xE2FF, count=1, tiles=1, vram_per_tile=24 * GiB)
    assert probe_intel_gpu(root, env={}) == [
        DeviceInfo(name="Intel GPU [8086:e2ff]", total_memory=24 * GiB, vendor="Intel")
    ]


@pytest.mark.parametrize(("driver", "device"), [("i915", 0x46A6), ("xe", 0x64A0), ("xe", 0x7D55)])
def test_intel_integrated_gpu_never_counts(tmp_path: Path, driver: str, device: int) -> None:
    assert (
        probe_intel_gpu(intel_integrated_box(tmp_path, driver=driver, device=device), env={}) == []
    )


def test_intel_integrated_beside_discrete_counts_only_discrete(tmp_path: Path) -> None:
    root = intel_discrete_box(tmp_path, count=1)
    root.pci_device("0000:00:02.0", vendor=0x8086, device=0x46A6, pci_class=0x030000, driver="i915")
    assert probe_intel_gpu(root, env={}) == [PROFILES["xpu"]["max-1550"]]


@pytest.mark.parametrize("driver", [None, "vfio-pci"])
def test_intel_gpu_not_bound_to_xe_or_i915_is_skipped(tmp_path: Path, driver: str | None) -> None:
    root = FakeRoot(tmp_path)
    root.pci_device("0000:03:00.0", vendor=0x8086, device=0x0BD5, pci_class=0x038000, driver=driver)
    assert probe_intel_gpu(root, env={}) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", [1]),
        ("0.0", [0]),
        ("0.0,0.1", [0]),
        ("1.1,0", [1, 0]),
        ("2,0", [2, 0]),
        ("", [0, 1, 2]),
        ("0,5", [0]),
        ("x", []),
        ("-1", []),
    ],
)
def test_ze_affinity_mask(tmp_path: Path, value: str, expected: list[int]) -> None:
    root = FakeRoot(tmp_path)
    for i in range(3):
        pci = root.pci_device(
            f"0000:{0x3A + i:02x}:00.0",
            vendor=0x8086,
            device=0x0BD5,
            pci_class=0x038000,
            driver="xe",
        )
        root.write(
            f"{pci.relative_to(root.path)}/tile0/physical_vram_size_bytes", f"{(i + 1) * GiB}\n"
        )
    devices = probe_intel_gpu(root, env={"ZE_AFFINITY_MASK": value})
    assert [d.total_memory // GiB - 1 for d in devices] == expected


# ---------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------


def test_cpu_xeon_features_name_and_memory(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.cpuinfo(model_name="Intel(R) Xeon(R) Platinum 8480+", flags=XEON_FLAGS, processors=4)
    root.meminfo(512 * GiB)
    expected = PROFILES["cpu"]["xeon-spr"]
    device = probe_cpu(root, env={})
    assert device.features == expected.features - {"ipex"}
    assert (device.name, device.total_memory, device.vendor, device.arch) == (
        expected.name,
        expected.total_memory,
        "Intel",
        "x86_64",
    )


def test_cpu_adds_ipex_when_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = FakeRoot(tmp_path)
    root.cpuinfo(model_name="Intel(R) Xeon(R) Platinum 8480+", flags=XEON_FLAGS)
    monkeypatch.setattr("hwplug.platforms.cpu.probe.ipex_available", lambda: True)
    assert probe_cpu(root, env={}).features == PROFILES["cpu"]["xeon-spr"].features


def test_cpu_desktop_amd_has_only_avx2(tmp_path: Path) -> None:
    device = probe_cpu(empty_box(tmp_path), env={})
    assert device.features == frozenset({"avx2"})
    assert device.vendor == "AMD"
    assert device.name == "AMD Ryzen 9 7950X 16-Core Processor"
    assert device.total_memory == 64 * GiB


def test_cpu_arm_has_neon(tmp_path: Path) -> None:
    device = probe_cpu(jetson_box(tmp_path), env={})
    assert device.features == frozenset({"neon"})
    assert (device.arch, device.name) == ("aarch64", "aarch64 CPU")


def test_cpu_without_cpuinfo(tmp_path: Path) -> None:
    assert probe_cpu(tmp_path, env={}) == DeviceInfo(name="CPU")


def test_cpu_on_the_real_root_uses_psutil() -> None:
    import psutil

    device = probe_cpu("/", env={})
    assert device.total_memory == psutil.virtual_memory().total
    assert device.features <= {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon"}


def test_ipex_available_never_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the real function, not the autouse stub
    seen: list[str] = []

    def find_spec(name: str, package: str | None = None) -> object | None:
        seen.append(name)
        return object() if name == "intel_extension_for_pytorch" else None

    monkeypatch.setattr("importlib.util.find_spec", find_spec)
    assert ipex_available() is True
    monkeypatch.setattr("importlib.util.find_spec", lambda name, package=None: None)
    assert ipex_available() is False
    assert seen == ["intel_extension_for_pytorch"]
    assert "intel_extension_for_pytorch" not in sys.modules


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2, 3]),
        ("", [0, 1, 2, 3]),
        ("2,0", [2, 0]),
        ("1-2", [1, 2]),
        ("3,0-1", [3, 0, 1]),
        ("0,7,1", [0]),
        ("2-1", []),
        ("a", []),
        ("1,1", [1]),
    ],
)
def test_cpu_numa_nodes(tmp_path: Path, value: str | None, expected: list[int]) -> None:
    root = FakeRoot(tmp_path)
    root.numa_nodes(0, 1, 2, 3)
    root.mkdir("sys/devices/system/node/power")
    root.mkdir("sys/devices/system/node/nodefoo")
    env = {} if value is None else {"CPU_VISIBLE_MEMORY_NODES": value}
    assert cpu_numa_nodes(root, env=env) == expected


def test_cpu_numa_nodes_absent(tmp_path: Path) -> None:
    assert cpu_numa_nodes(tmp_path, env={}) == []


# ---------------------------------------------------------------------------
# Robustness and isolation
# ---------------------------------------------------------------------------

ALL_PROBES = (probe_nvidia, probe_amd, probe_habana, probe_intel_gpu, probe_cpu, cpu_numa_nodes)

# Files the probes parse, in a tree that has every vendor present.
PARSED_FILES = (
    "sys/bus/pci/devices/0000:18:00.0/vendor",
    "sys/bus/pci/devices/0000:18:00.0/device",
    "sys/bus/pci/devices/0000:18:00.0/class",
    f"proc/driver/nvidia/gpus/{DGX_ADDRESSES[0]}/information",
    "sys/class/kfd/kfd/topology/nodes/2/properties",
    "sys/class/kfd/kfd/topology/nodes/2/mem_banks/0/properties",
    "sys/class/kfd/kfd/topology/nodes/2/name",
    "sys/bus/pci/devices/0000:19:00.0/device",
    "sys/bus/pci/devices/0000:19:00.0/accel/accel0/module_id",
    "sys/bus/pci/devices/0000:3a:00.0/tile0/physical_vram_size_bytes",
    "proc/cpuinfo",
    "proc/meminfo",
    "proc/device-tree/model",
)


def every_vendor_box(path: Path) -> FakeRoot:
    root = nvidia_box(path, count=1)
    amd_box(path, count=1)
    habana_box(path, count=1)
    intel_discrete_box(path, count=1)
    root.numa_nodes(0, 1)
    root.write("proc/device-tree/model", b"Board\x00")
    return root


@pytest.fixture(scope="module")
def vendor_tree(tmp_path_factory: pytest.TempPathFactory) -> FakeRoot:
    return every_vendor_box(tmp_path_factory.mktemp("vendors"))


def test_every_probe_sees_its_vendor_in_one_tree(vendor_tree: FakeRoot) -> None:
    root = vendor_tree
    assert len(probe_nvidia(root, env={})) == 1
    assert len(probe_amd(root, env={})) == 1
    assert len(probe_habana(root, env={})) == 1
    assert len(probe_intel_gpu(root, env={})) == 1
    assert cpu_numa_nodes(root, env={}) == [0, 1]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(PARSED_FILES),
    st.one_of(
        st.binary(max_size=64),
        st.text(max_size=64),
        st.sampled_from(["", "0x", "-5", "0x10de\x00", "gfx_target_version -90402", "1e9"]),
    ),
)
def test_probes_never_raise_on_junk_files(
    vendor_tree: FakeRoot, rel: str, content: str | bytes
) -> None:
    path = vendor_tree.path / rel
    original = path.read_bytes()
    vendor_tree.write(rel, content)
    try:
        for probe in ALL_PROBES:
            probe(vendor_tree, env={})
    finally:
        path.write_bytes(original)


@pytest.mark.parametrize("rel", PARSED_FILES)
def test_probes_survive_a_directory_or_dangling_link_in_place_of_a_file(
    tmp_path: Path, rel: str
) -> None:
    for kind in ("directory", "dangling link"):
        root = every_vendor_box(tmp_path / kind.replace(" ", "_"))
        target = root.path / rel
        target.unlink()
        if kind == "directory":
            target.mkdir()
        else:
            os.symlink(root.path / "missing", target)
        for probe in ALL_PROBES:
            probe(root, env={})


def test_negative_or_malformed_numbers_are_ignored(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.kfd_node(1, gfx_target_version=90402, banks=((1, 8 * GiB), (1, 0)))
    root.write(
        "sys/class/kfd/kfd/topology/nodes/1/mem_banks/1/properties",
        "heap_type 1\nsize_in_bytes -4096\n",
    )
    root.kfd_node(2, gfx_target_version=-90402)
    assert [d.total_memory for d in probe_amd(root, env={})] == [8 * GiB]

    for address, device in (("0000:03:00.0", 0x0BD5), ("0000:04:00.0", 0xE2FF)):
        pci = root.pci_device(
            address, vendor=0x8086, device=device, pci_class=0x038000, driver="xe"
        )
        root.write(f"{pci.relative_to(root.path)}/tile0/physical_vram_size_bytes", "-1\n")
    assert [(d.arch, d.total_memory) for d in probe_intel_gpu(root, env={})] == [("pvc", 0)]

    root.write("proc/meminfo", "MemTotal: -5 kB\n")
    root.write("proc/cpuinfo", "model name : 1234\n\n")
    assert probe_cpu(root, env={}) == DeviceInfo(name="CPU")


def test_hex_ids_in_either_case(tmp_path: Path) -> None:
    root = FakeRoot(tmp_path)
    root.nvidia_gpu("0000:18:00.0")
    root.write("sys/bus/pci/devices/0000:18:00.0/vendor", "0x10DE\n")
    root.write("sys/bus/pci/devices/0000:18:00.0/device", "0x2330\n")
    assert probe_nvidia(root, env={}) == [PROFILES["cuda"]["h100"]]


def test_probing_in_a_subprocess_imports_no_torch(tmp_path: Path) -> None:
    root = every_vendor_box(tmp_path)
    code = (
        "import json, sys\n"
        "import hwplug.platforms.probes as p\n"
        "out = {\n"
        "    'nvidia': len(p.probe_nvidia()), 'amd': len(p.probe_amd()),\n"
        "    'habana': len(p.probe_habana()), 'intel': len(p.probe_intel_gpu()),\n"
        "    'cpu': p.probe_cpu().name, 'numa': p.cpu_numa_nodes(), 'ipex': p.ipex_available(),\n"
        "    'torch': 'torch' in sys.modules,\n"
        "}\n"
        "print(json.dumps(out))\n"
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.endswith("_VISIBLE_DEVICES")
        and key not in ("HABANA_VISIBLE_MODULES", "ZE_AFFINITY_MASK", "CPU_VISIBLE_MEMORY_NODES")
    }
    env["HWPLUG_PROBE_ROOT"] = str(root)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["torch"] is False
    assert (out["nvidia"], out["amd"], out["habana"], out["intel"]) == (1, 1, 1, 1)
    assert out["cpu"] == "Intel(R) Xeon(R) Platinum 8480C"
    assert out["numa"] == [0, 1]
