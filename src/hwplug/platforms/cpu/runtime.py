"""The host CPU as a device: nothing to bind, wait for or release; memory from psutil.

:class:`CpuRuntime` is the CPU platform's runtime, and the runtime of any
platform whose tensors live in host memory (a vendor's simulated device, as in
``examples/acme_npu``): such a platform sets ``runtime_cls = CpuRuntime``.
Nothing here imports torch or psutil at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplug.core.runtime import DeviceRuntime

if TYPE_CHECKING:
    import torch

__all__ = ["CpuRuntime"]


class CpuRuntime(DeviceRuntime):
    """Device services on the host: ``torch.device("cpu")``, no-op device calls.

    The host's memory comes from psutil. Like every runtime it refuses device
    calls on a simulated platform.
    """

    def torch_device(self, i: int = 0) -> torch.device:
        """``torch.device("cpu")`` (``i`` is still checked against the devices)."""
        import torch

        self.device_index(i)
        return torch.device("cpu")

    def set_device(self, i: int) -> None:
        """Nothing to select on the host (``i`` is still checked)."""
        self.device_index(i)
        self.require_real_device("set_device()")

    def synchronize(self) -> None:
        """Nothing to wait for: host work is synchronous."""
        self.require_real_device("synchronize()")

    def empty_cache(self) -> None:
        """Nothing to release: the host allocator keeps no device cache."""
        self.require_real_device("empty_cache()")

    def mem_get_info(self, i: int = 0) -> tuple[int, int]:
        """The host's available and total memory in bytes (psutil)."""
        self.device_index(i)
        self.require_real_device("mem_get_info()")
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    def get_current_memory_usage(self, i: int = 0) -> int:
        """This process's resident memory in bytes (psutil; never 0 on the real host).

        A simulated device is idle, like every simulated device: 0.
        """
        self.platform._device(i)
        if self.platform.simulated:
            return 0
        import psutil

        return max(1, int(psutil.Process().memory_info().rss))

    def peak_memory_usage(self, i: int = 0) -> int:
        """The current resident memory: the host keeps no peak counter."""
        return self.get_current_memory_usage(i)

    def bind_device(self, local_rank: int) -> None:
        """Nothing to bind: the ranks on one host share its CPUs."""
