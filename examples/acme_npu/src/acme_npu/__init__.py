"""hwplug platform plugin for the ACME NPU (a simulated vendor device)."""

from acme_npu.plugin import AcmeAttentionBackend, NpuPlatform

__all__ = ["AcmeAttentionBackend", "NpuPlatform"]
