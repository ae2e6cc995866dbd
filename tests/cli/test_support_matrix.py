"""The support-matrix builder behind ``hwplug matrix`` and docs/support-matrix.md."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

import hwplug
from hwplug.core.config import CUDAGraphMode, EngineConfig
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.matrix import (
    builtin_plugin_manager,
    graph_modes,
    render_markdown,
    support_matrix,
    support_matrix_page,
)

GiB = 1 << 30


class FakeNpu(Platform):
    name = "znpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 60
    block_sizes: ClassVar[tuple[int, ...]] = (32, 64)
    default_block = 32
    cache_dtypes: ClassVar[tuple[str, ...]] = ("auto", "fp8")
    supports_device_graphs = True
    supports_piecewise_graphs = False
    graphs_need_compilation = False
    representative_profile = "z1"

    @classmethod
    def profiles(cls) -> dict[str, DeviceInfo]:
        return {"z1": DeviceInfo("Z|1 NPU", 48 * GiB, arch="z1")}

    @classmethod
    def detect(cls) -> list[DeviceInfo]:
        return [DeviceInfo("Z|1 NPU", 48 * GiB, arch="z1")] * 2


class _Plugin:
    @hwplug.hookimpl
    def hwplug_platforms(self) -> list[type[Platform]]:
        return [FakeNpu]


def _manager_with_vendor():
    manager = builtin_plugin_manager()
    manager.register_plugin(_Plugin(), "znpu", group="hwplug.platforms", distribution="z-npu")
    return manager


def test_graph_modes_follow_the_platform_capabilities() -> None:
    assert graph_modes(Platform) == ("NONE",)
    assert graph_modes(FakeNpu) == ("NONE", "FULL", "FULL_DECODE_ONLY")


def test_vendor_platforms_come_after_the_builtins() -> None:
    rows = support_matrix(_manager_with_vendor())
    order = list(dict.fromkeys(row.platform for row in rows))
    assert order == ["cuda", "rocm", "cpu", "hpu", "xpu", "znpu"]
    vendor = rows[-1]
    assert vendor.profile == "z1"
    assert vendor.distribution == "z-npu"
    assert vendor.block_sizes == (32, 64)
    assert vendor.fp8_format == "float8_e4m3fn"
    # graphs in the class, but no graph wrapper for this device: no graph mode but NONE
    assert vendor.graph_modes == ("NONE",)
    assert vendor.default_compilation_level == "NO_COMPILATION (0)"


def test_a_device_without_a_graph_wrapper_resolves_no_graphs() -> None:
    platform = FakeNpu.simulate("z1")
    assert not platform.has_device_graphs()
    config = hwplug.resolve(platform=platform).config
    assert config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    with pytest.raises(hwplug.ConfigError, match="has no device graphs"):
        hwplug.resolve(
            EngineConfig.from_dict({"compilation": {"cudagraph_mode": "FULL"}}), platform=platform
        )


def test_a_graph_wrapper_that_is_not_a_graph_wrapper_is_a_plugin_error() -> None:
    class Guessed(FakeNpu):
        def graph_wrapper_cls(self) -> type | None:
            return dict

    with pytest.raises(hwplug.PluginError, match=r"'znpu'.*graph_wrapper_cls\(\) returned"):
        hwplug.resolve(platform=Guessed.simulate("z1"))


def test_installed_rows_describe_detected_devices() -> None:
    rows = support_matrix(_manager_with_vendor(), installed=True)
    by_platform = {row.platform: row for row in rows}
    assert "cpu" in by_platform  # the CPU is always present
    npu = by_platform["znpu"]
    assert npu.profile is None
    assert npu.device_count == 2
    assert npu.total_memory == 48 * GiB


def test_rows_are_json_ready() -> None:
    row = support_matrix(builtin_plugin_manager())[0]
    data = json.loads(json.dumps(row.to_dict()))
    assert data["platform"] == "cuda"
    assert isinstance(data["block_sizes"], list)


def test_markdown_escapes_pipes_and_marks_defaults() -> None:
    text = render_markdown(support_matrix(_manager_with_vendor()))
    assert "Z\\|1 NPU" in text
    assert "| `z1` |" in text
    assert "**32** (32, 64)" in text
    assert "[znpu](#znpu)" in text


def test_markdown_of_nothing() -> None:
    assert render_markdown([]) == "No platform to show.\n"


def test_page_defaults_to_builtins_only() -> None:
    page = support_matrix_page()
    assert page.startswith("# Support matrix\n")
    assert "znpu" not in page
    assert "znpu" in support_matrix_page(_manager_with_vendor())
