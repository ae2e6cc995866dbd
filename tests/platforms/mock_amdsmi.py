"""A small stand-in for AMD's ``amdsmi`` Python package.

``make_amdsmi(gpus)`` returns a fresh module object with the calls the probes
make; inject it with ``monkeypatch.setitem(sys.modules, "amdsmi", module)``.
``fail_on`` names a function that raises ``AmdSmiLibraryException``.
"""

from __future__ import annotations

import enum
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class FakeAMDGPU:
    market_name: str = "AMD Instinct MI300X"
    target_graphics_version: Any = "gfx942"
    memory: int = 192 * GiB
    device_id: int = 0x74A1
    uuid: str = "1fff74a1-0000-1000-80ab-6dcb8ca2b1c0"


class AmdSmiException(Exception):
    """Base of amdsmi's errors."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, code: int = 8) -> None:
        super().__init__(f"amdsmi library error {code}")
        self.code = code


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


def make_amdsmi(gpus: list[FakeAMDGPU] | None = None, *, fail_on: str | None = None) -> Any:
    """An ``amdsmi`` module that reports ``gpus``; ``fail_on`` raises."""
    devices = list(gpus or [])
    module: Any = types.ModuleType("amdsmi")
    calls: Counter[str] = Counter()

    def call(name: str) -> None:
        calls[name] += 1
        if name == fail_on:
            raise AmdSmiLibraryException()

    def amdsmi_init(flags: int = 0) -> None:
        call("amdsmi_init")

    def amdsmi_shut_down() -> None:
        call("amdsmi_shut_down")

    def amdsmi_get_processor_handles() -> list[FakeAMDGPU]:
        call("amdsmi_get_processor_handles")
        return list(devices)

    def amdsmi_get_gpu_asic_info(gpu: FakeAMDGPU) -> dict[str, Any]:
        call("amdsmi_get_gpu_asic_info")
        return {
            "market_name": gpu.market_name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": hex(gpu.device_id),
            "rev_id": "0x00",
            "asic_serial": "0xDEADBEEF",
            "oam_id": 0,
            "target_graphics_version": gpu.target_graphics_version,
        }

    def amdsmi_get_gpu_memory_total(gpu: FakeAMDGPU, mem_type: AmdSmiMemoryType) -> int:
        call("amdsmi_get_gpu_memory_total")
        if mem_type != AmdSmiMemoryType.VRAM:
            return 0
        return gpu.memory

    def amdsmi_get_gpu_device_uuid(gpu: FakeAMDGPU) -> str:
        call("amdsmi_get_gpu_device_uuid")
        return gpu.uuid

    for fn in (
        amdsmi_init,
        amdsmi_shut_down,
        amdsmi_get_processor_handles,
        amdsmi_get_gpu_asic_info,
        amdsmi_get_gpu_memory_total,
        amdsmi_get_gpu_device_uuid,
    ):
        setattr(module, fn.__name__, fn)
    module.AmdSmiException = AmdSmiException
    module.AmdSmiLibraryException = AmdSmiLibraryException
    module.AmdSmiMemoryType = AmdSmiMemoryType
    module.calls = calls
    return module
