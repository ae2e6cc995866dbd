"""The ACME NPU platform: detection, rule tables, an attention backend and graphs.

ACME's NPU is simulated: the device is "present" when the driver would have
exported ``ACME_NPU_DEVICES`` (a comma-separated list of device indices), so
this plugin shows every part of a real one without real hardware.

ACME's attention kernel (``acme``) can run inside a full graph only for
single-token decode batches (``UNIFORM_SINGLE_TOKEN_DECODE``), so hwplug fits
the graph mode to it: the NPU's default ``FULL`` becomes ``FULL_DECODE_ONLY``
(recorded), and an explicit ``FULL`` is refused. Its ranks run collectives
through ACME's own communicator class (:mod:`acme_npu.communicator`).
"""

# docs/vendor-plugin.md shows this file in sections, each from its "[vendor-guide: ...]"
# line to the next; tests/docs/test_vendor_guide.py keeps the page identical to them.
# [vendor-guide: imports]
from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

import hwplug
from acme_npu.communicator import AcmeCommunicator
from hwplug.attention import AttentionBackend, TorchAttentionBackend
from hwplug.core.errors import ConfigError
from hwplug.core.graphs import AttentionGraphSupport
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.platforms.cpu import CpuRuntime
from hwplug.platforms.vendor import VendorPlatform

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig
    from hwplug.core.resolve import ChangeLog

# [vendor-guide: profiles]
GiB = 1 << 30

_PROFILES = {
    "acme-n1": DeviceInfo("ACME N1 Inference Accelerator", 64 * GiB, arch="n1", vendor="ACME"),
    "acme-n2": DeviceInfo(
        "ACME N2 Inference Accelerator",
        128 * GiB,
        arch="n2",
        vendor="ACME",
        features=frozenset({"fp8"}),
    ),
}


# [vendor-guide: backend]
class AcmeAttentionBackend(TorchAttentionBackend):
    """ACME's attention kernel: graph-capturable for single-token decode batches only.

    (In this demo it computes with hwplug's torch reference.)
    """

    name = "acme"
    graph_support = AttentionGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE
    platforms = ("npu",)  # ACME's kernels, for ACME's NPU only (never another vendor's)
    device_types = ("cpu",)


# [vendor-guide: platform]
class NpuPlatform(VendorPlatform):
    """ACME NPU: 32-token blocks, an fp8 (e4m3) cache on N2 and later, whole-model graphs.

    It builds on hwplug's public platform base (:class:`~hwplug.platforms.vendor.VendorPlatform`:
    profiles from a table, dtype messages that name what works) and, since this demo's
    NPU computes with host tensors, runs its device services on the host runtime.
    """

    name = "npu"
    device_type = "cpu"  # ACME's runtime exposes the NPU through CPU tensors in this demo
    dist_backend = "gloo"
    priority = 60
    ray_device_key = "NPU"
    device_control_env_var = "ACME_NPU_VISIBLE_DEVICES"
    communicator_cls = AcmeCommunicator  # ACME's own collectives (see communicator.py)
    runtime_cls = CpuRuntime  # a real NPU names a DeviceRuntime subclass driving its runtime
    vendor = "ACME"

    block_sizes: ClassVar[tuple[int, ...]] = (32, 64)
    default_block = 32
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16", "fp8", "fp8_e4m3")
    model_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    fp8_dtype_name = "float8_e4m3fn"
    default_compilation_level = 2
    representative_profile = "acme-n2"
    profile_table = _PROFILES
    custom_op_forward = "forward_oot"
    attention_order: ClassVar[tuple[str, ...]] = ("acme", "torch")
    supports_device_graphs = True
    supports_piecewise_graphs = False
    graphs_need_compilation = False  # ACME graphs capture the whole model: FULL by default

    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        raw = os.environ.get("ACME_NPU_DEVICES", "").strip()
        if not raw:
            return []
        arch = os.environ.get("ACME_NPU_ARCH", "n2")
        device = _PROFILES.get(f"acme-{arch}")
        if device is None:
            raise RuntimeError(f"ACME_NPU_ARCH={arch!r} is not an ACME NPU generation (n1, n2)")
        return [device for part in raw.split(",") if part.strip()]

    def device_cache_dtype_problem(self, cache_dtype: str) -> str | None:
        if cache_dtype.startswith("fp8") and not self.has_feature("fp8"):
            return "fp8 KV caches need an ACME N2 or later"
        return None

    def check_and_update_config(self, config: EngineConfig, changes: ChangeLog) -> None:
        super().check_and_update_config(config, changes)
        if config.scheduler.max_num_seqs > 128:
            if changes.was_set("scheduler.max_num_seqs"):
                raise ConfigError(
                    f"scheduler.max_num_seqs={config.scheduler.max_num_seqs} exceeds the 128 "
                    f"sequences {self.describe_device()} can schedule; use 128 or fewer"
                )
            changes.record("scheduler.max_num_seqs", 128, "ACME NPUs schedule 128 sequences")

    def graph_wrapper_cls(self) -> type | None:
        """ACME graphs (see :mod:`acme_npu.graphs`)."""
        from acme_npu.graphs import AcmeGraphWrapper

        return AcmeGraphWrapper


# [vendor-guide: hooks]
@hwplug.hookimpl
def hwplug_platforms() -> list[type[Platform]]:
    return [NpuPlatform]


@hwplug.hookimpl
def hwplug_attention_backends() -> list[type[AttentionBackend]]:
    return [AcmeAttentionBackend]
