"""A small stand-in for ``pynvml`` (nvidia-ml-py), in the style of Ray's mock.

``make_pynvml(gpus)`` returns a fresh module object with the NVML functions
the probes call, backed by ``gpus``; inject it with
``monkeypatch.setitem(sys.modules, "pynvml", module)``. ``fail_on`` names a
function that raises ``NVMLError`` instead. The module counts ``nvmlInit``
and ``nvmlShutdown`` calls in ``calls`` so tests can check the pairing.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20


@dataclass(frozen=True)
class FakeGPU:
    name: str = "NVIDIA H100 80GB HBM3"
    memory: int = 81559 * MiB
    capability: tuple[int, int] = (9, 0)
    uuid: str = "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"


class NVMLError(Exception):
    """Base of every NVML error, as in pynvml."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            1: "Uninitialized",
            9: "Driver Not Loaded",
            12: "NVML Shared Library Not Found",
        }.get(self.value, "Unknown Error")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12)


@dataclass(frozen=True)
class _MemoryInfo:
    total: int
    free: int
    used: int


def make_pynvml(
    gpus: list[FakeGPU] | None = None,
    *,
    fail_on: str | None = None,
    error: type[NVMLError] = NVMLError,
) -> Any:
    """A ``pynvml`` module that reports ``gpus``; ``fail_on`` raises ``error``."""
    devices = list(gpus or [])
    module: Any = types.ModuleType("pynvml")
    calls: Counter[str] = Counter()
    state = {"initialised": False}

    def call(name: str) -> None:
        calls[name] += 1
        if name == fail_on:
            raise error()
        if name not in ("nvmlInit", "nvmlShutdown") and not state["initialised"]:
            raise NVMLError(1)

    def handle(index: int) -> FakeGPU:
        if not 0 <= index < len(devices):
            raise NVMLError(2)
        return devices[index]

    def nvmlInit() -> None:
        call("nvmlInit")
        state["initialised"] = True

    def nvmlShutdown() -> None:
        call("nvmlShutdown")
        state["initialised"] = False

    def nvmlDeviceGetCount() -> int:
        call("nvmlDeviceGetCount")
        return len(devices)

    def nvmlDeviceGetHandleByIndex(index: int) -> FakeGPU:
        call("nvmlDeviceGetHandleByIndex")
        return handle(index)

    def nvmlDeviceGetName(gpu: FakeGPU) -> str:
        call("nvmlDeviceGetName")
        return gpu.name

    def nvmlDeviceGetMemoryInfo(gpu: FakeGPU) -> _MemoryInfo:
        call("nvmlDeviceGetMemoryInfo")
        return _MemoryInfo(total=gpu.memory, free=gpu.memory - 512 * MiB, used=512 * MiB)

    def nvmlDeviceGetCudaComputeCapability(gpu: FakeGPU) -> tuple[int, int]:
        call("nvmlDeviceGetCudaComputeCapability")
        return gpu.capability

    def nvmlDeviceGetUUID(gpu: FakeGPU) -> str:
        call("nvmlDeviceGetUUID")
        return gpu.uuid

    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetName,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetCudaComputeCapability,
        nvmlDeviceGetUUID,
    ):
        setattr(module, fn.__name__, fn)
    module.NVMLError = NVMLError
    module.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    module.calls = calls
    return module
