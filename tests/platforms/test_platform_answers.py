"""Facts about a vendor's device come from its platform: a made-up platform that sets
them gets the behaviour in the kernels, the attention metadata and the support matrix."""

from __future__ import annotations

from typing import ClassVar

import pytest

import hwplug
from hwplug.core.platform import DeviceInfo, Platform

torch = pytest.importorskip("torch")


class MetaAccelerator(Platform):
    """A platform whose devices are torch ``meta`` devices (no data: nothing runs)."""

    name = "metaacc"
    device_type = "meta"
    dist_backend = "gloo"
    representative_profile = "m1"

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"m1": DeviceInfo("Meta Accelerator 1", 1 << 30)}


class TritonMetaAccelerator(MetaAccelerator):
    name = "tritonmeta"
    runs_triton = True


class PinningMetaAccelerator(MetaAccelerator):
    name = "pinmeta"
    pins_host_memory = True


class OwnFp8Name(MetaAccelerator):
    """Stores its fp8 caches (float8_e5m2 here) only under the vendor name ``fp8_inc``."""

    name = "ownfp8"
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "bfloat16", "fp8_inc")
    fp8_dtype_name = "float8_e5m2"
    fp8_cache_dtype = "fp8_inc"


# -- Triton --------------------------------------------------------------------------


def test_a_platform_that_runs_triton_makes_its_devices_triton_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernels look up no platform: the caller passes its platform's ``runs_triton``
    for the device (the Triton attention backend passes its session's)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from hwplug.kernels import select_backend, triton_unavailable_reason

    pytest.importorskip("triton")
    runs = TritonMetaAccelerator.simulate("m1").runs_triton
    assert triton_unavailable_reason("meta", runs_triton=runs) is None
    assert select_backend("auto", "meta", runs_triton=runs) == "triton"
    runs = MetaAccelerator.simulate("m1").runs_triton
    reason = triton_unavailable_reason("meta", runs_triton=runs) or ""
    assert "the platform of meta tensors does not run Triton" in reason
    assert select_backend("auto", "meta", runs_triton=runs) == "torch"


def test_without_a_platforms_answer_the_device_type_decides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from hwplug.kernels import TRITON_DEVICE_TYPES, triton_unavailable_reason

    assert TRITON_DEVICE_TYPES == {"cuda", "xpu"}
    with hwplug.use_platform(TritonMetaAccelerator.simulate("m1")):
        reason = triton_unavailable_reason("hpu") or ""
    assert "Triton has no backend for hpu devices" in reason


def test_triton_attention_serves_a_platform_that_runs_triton() -> None:
    from hwplug.attention import TritonAttentionBackend
    from hwplug.core.config import EngineConfig

    config = EngineConfig.from_dict({"model": {"dtype": "float16"}})
    assert TritonAttentionBackend.problem(config, TritonMetaAccelerator.simulate("m1")) is None
    problem = TritonAttentionBackend.problem(config, MetaAccelerator.simulate("m1")) or ""
    assert "(a meta device) does not run Triton" in problem


# -- pinned host memory --------------------------------------------------------------


@pytest.mark.parametrize(
    ("platform_cls", "pinned"), [(MetaAccelerator, False), (PinningMetaAccelerator, True)]
)
def test_metadata_copies_pin_host_memory_where_the_platform_says(
    monkeypatch: pytest.MonkeyPatch, platform_cls: type[Platform], pinned: bool
) -> None:
    from hwplug.attention import AttentionMetadata

    calls: list[torch.Size] = []

    def pin_memory(self: torch.Tensor) -> torch.Tensor:
        calls.append(self.shape)
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    with hwplug.use_platform(platform_cls.simulate("m1")):
        metadata = AttentionMetadata.build([2], [2], [[0]], [0, 1], device="meta")
    assert metadata.device.type == "meta"
    assert bool(calls) is pinned


def test_copies_to_the_host_never_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    from hwplug.attention import AttentionMetadata

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pytest.fail("pinned"))
    with hwplug.use_platform(PinningMetaAccelerator.simulate("m1")):
        AttentionMetadata.build([2], [2], [[0]], [0, 1], device="cpu")


# -- the platform's own name for its fp8 cache -------------------------------------------


def test_a_vendor_fp8_name_stores_the_platforms_fp8_dtype() -> None:
    from hwplug.core.kv_cache import cache_dtype_to_torch

    platform = OwnFp8Name.simulate("m1")
    assert "fp8_inc" in platform.supported_cache_dtypes()
    assert cache_dtype_to_torch("fp8_inc", "bfloat16", platform) is torch.float8_e5m2


@pytest.mark.parametrize(
    ("platform_cls", "fp8_format"), [(OwnFp8Name, "float8_e5m2"), (MetaAccelerator, None)]
)
def test_the_matrix_fp8_column_follows_the_platforms_fp8_cache_dtype(
    platform_cls: type[Platform], fp8_format: str | None
) -> None:
    from hwplug.matrix import builtin_plugin_manager, support_matrix

    class Provides:
        @hwplug.hookimpl
        def hwplug_platforms(self) -> list[type[Platform]]:
            return [platform_cls]

    manager = builtin_plugin_manager()
    manager.register_plugin(Provides(), "vendor", group="hwplug.platforms", distribution="v")
    (row,) = [r for r in support_matrix(manager) if r.platform == platform_cls.name]
    assert row.fp8_format == fp8_format
