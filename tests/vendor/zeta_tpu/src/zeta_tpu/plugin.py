"""The Zeta TPU platform: detection, rules, an attention backend and a graph backend.

The device is "present" when ``ZETA_TPU_DEVICES`` lists device indices; it
computes with CPU tensors (it is invented). Its blocks are 16, 64 or 128
tokens (never 32), its cache stores ``auto`` or ``bfloat16``, and its own
attention backend (``zeta``) may run inside any graph.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import hwplug
from hwplug.attention import AttentionBackend, TorchAttentionBackend
from hwplug.core.graphs import AttentionGraphSupport, BatchDescriptor, GraphBackend, GraphWrapper
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.platforms.cpu import CpuRuntime

GiB = 1 << 30

_PROFILES = {
    "zeta-t1": DeviceInfo("Zeta T1 Tensor Processor", 32 * GiB, arch="t1", vendor="Zeta"),
    "zeta-t2": DeviceInfo("Zeta T2 Tensor Processor", 96 * GiB, arch="t2", vendor="Zeta"),
}


class ZetaAttentionBackend(TorchAttentionBackend):
    """Zeta's attention (the torch reference in this invented device)."""

    name = "zeta"
    graph_support = AttentionGraphSupport.ALWAYS
    device_types = ("cpu",)
    block_sizes = (16, 64, 128)


class _ZetaGraphBackend:
    """Zeta graphs: capture keeps the call, replay calls it again on the static buffers."""

    name = "zeta"

    def graph_pool_handle(self) -> Any:
        return None

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        return fn, fn()

    def replay(self, graph: Any, output: Any) -> Any:
        return graph()

    def weak_ref(self, output: Any) -> Any:
        return output

    def synchronize(self) -> None:
        """Synchronous."""


_shared = _ZetaGraphBackend()


class ZetaGraphWrapper(GraphWrapper):
    """What the zeta platform returns from ``graph_wrapper_cls()``."""

    @classmethod
    def default_backend(cls) -> GraphBackend:
        return _shared


class ZetaPlatform(Platform):
    """The Zeta TPU."""

    name = "zeta"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 55
    ray_device_key = "TPU"
    device_control_env_var = "ZETA_TPU_VISIBLE_DEVICES"
    vendor = "Zeta"
    runtime_cls = CpuRuntime  # the invented device computes with host tensors

    block_sizes: ClassVar[tuple[int, ...]] = (16, 64, 128)
    default_block = 64
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16")
    model_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    representative_profile = "zeta-t2"
    attention_order: ClassVar[tuple[str, ...]] = ("zeta", "torch")
    supports_device_graphs = True
    supports_piecewise_graphs = False
    graphs_need_compilation = False

    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        raw = os.environ.get("ZETA_TPU_DEVICES", "").strip()
        if not raw:
            return []
        return [_PROFILES["zeta-t2"] for part in raw.split(",") if part.strip()]

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return dict(_PROFILES)

    def graph_wrapper_cls(self) -> type | None:
        return ZetaGraphWrapper


@hwplug.hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    return [ZetaPlatform]


@hwplug.hookimpl
def hwplug_attention_backends() -> list[type[AttentionBackend]]:
    return [ZetaAttentionBackend]
