"""hwplug platform plugin for the ACME NPU (a simulated vendor device)."""

from acme_npu.plugin import NpuPlatform

__all__ = ["NpuPlatform"]
