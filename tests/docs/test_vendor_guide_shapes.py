"""The "Common shapes of accelerator" of docs/vendor-plugin.md resolve as the page says.

Each block after a ``<!-- shape: NAME -->`` line in the page is a class whose
attributes are taken as written: a platform is built from them (with a test
graph wrapper where the block defines ``graph_wrapper_cls``) and resolved with
:func:`hwplug.resolve`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

import hwplug
from hwplug.core.config import CompilationLevel, CUDAGraphMode, EngineConfig
from hwplug.core.graphs import GraphWrapper
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.core.resolve import Resolution
from hwplug.platforms.vendor import VendorPlatform

PAGE = Path(__file__).resolve().parents[2] / "docs" / "vendor-plugin.md"
SHAPE = re.compile(r"^<!-- shape: (?P<name>[\w-]+) -->$")


def shape_blocks() -> dict[str, str]:
    """The page's shape blocks by name."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    found = {}
    for i, line in enumerate(lines):
        mark = SHAPE.match(line.strip())
        if mark is None:
            continue
        assert lines[i + 1] == "```python", f"{PAGE.name}:{i + 2}: a shape is a python block"
        end = lines.index("```", i + 2)
        found[mark["name"]] = "\n".join(lines[i + 2 : end])
    return found


class _Wrapper(GraphWrapper):
    """Stands for a vendor's graph wrapper: resolution only asks that there is one."""


def shape(name: str) -> Platform:
    """A simulated platform with the attributes of the page's ``name`` block."""
    (cls,) = ast.parse(shape_blocks()[name]).body
    assert isinstance(cls, ast.ClassDef) and [ast.unparse(b) for b in cls.bases] == [
        "VendorPlatform"
    ]
    attrs: dict[str, Any] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef):
            assert node.name == "graph_wrapper_cls", f"{name}: a block defines only tables"
            attrs["graph_wrapper_cls"] = lambda self: _Wrapper
            continue
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.unparse(node)
        target = node.targets[0]
        assert isinstance(target, ast.Name)
        assert hasattr(VendorPlatform, target.id), f"{name}: no platform attribute {target.id}"
        attrs[target.id] = ast.literal_eval(node.value)
    attrs.update(
        name="shape",
        device_type="cpu",
        dist_backend="gloo",
        profile_table={"shape-1": DeviceInfo("Shape NPU", 64 << 30)},
    )
    platform_cls: type[VendorPlatform] = type("ShapePlatform", (VendorPlatform,), attrs)
    return platform_cls.simulate("shape-1")


def resolve(platform: Platform, **sections: dict[str, Any]) -> Resolution:
    return hwplug.resolve(EngineConfig.from_dict(sections), platform=platform)


def platform_graph_mode(resolution: Resolution) -> tuple[CUDAGraphMode, str]:
    """The graph mode the platform's attributes filled in, before the attention backend
    fitted it (the first recorded change of ``compilation.cudagraph_mode``), and why."""
    first = next(c for c in resolution.changes if c.path == "compilation.cudagraph_mode")
    return CUDAGraphMode.parse(first.new), first.reason


def test_the_page_has_the_shapes_this_file_checks() -> None:
    assert list(shape_blocks()) == [
        "no-graphs",
        "piecewise-compilation",
        "full-graphs",
        "piecewise-graphs",
        "fp8-e5m2",
    ]


def test_no_graphs_runs_eagerly_and_refuses_graph_modes() -> None:
    platform = shape("no-graphs")
    result = resolve(platform)
    assert result.config.compilation.level == CompilationLevel.NO_COMPILATION
    assert platform_graph_mode(result) == (CUDAGraphMode.NONE, "shape has no device graphs")
    assert result.config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert not platform.has_device_graphs()
    with pytest.raises(hwplug.ConfigError, match="platform has no device graphs; use NONE"):
        resolve(platform, compilation={"cudagraph_mode": "FULL"})


def test_piecewise_compilation_splits_at_attention_and_captures_nothing() -> None:
    platform = shape("piecewise-compilation")
    result = resolve(platform)
    comp = result.config.compilation
    assert comp.level == CompilationLevel.PIECEWISE
    assert comp.cudagraph_mode == CUDAGraphMode.NONE
    assert "hwplug.unified_attention" in (comp.splitting_ops or [])
    for mode in ("FULL", "PIECEWISE"):
        with pytest.raises(hwplug.ConfigError, match="has no device graphs; use NONE"):
            resolve(platform, compilation={"cudagraph_mode": mode})


@pytest.mark.parametrize("level", [0, 2, 3])
def test_full_graphs_are_filled_in_at_every_level(level: int) -> None:
    result = resolve(shape("full-graphs"), compilation={"level": level})
    assert platform_graph_mode(result) == (
        CUDAGraphMode.FULL,
        "shape captures the whole forward pass",
    )


def test_full_graphs_refuse_piecewise_graph_modes() -> None:
    platform = shape("full-graphs")
    assert platform.has_device_graphs()
    for mode in ("PIECEWISE", "FULL_AND_PIECEWISE"):
        with pytest.raises(hwplug.ConfigError, match="whole forward pass only; use FULL or NONE"):
            resolve(platform, compilation={"level": 3, "cudagraph_mode": mode})


def test_piecewise_graphs_need_level_three() -> None:
    platform = shape("piecewise-graphs")
    result = resolve(platform)
    assert result.config.compilation.level == CompilationLevel.PIECEWISE
    assert platform_graph_mode(result)[0] == CUDAGraphMode.FULL_AND_PIECEWISE
    lower = resolve(platform, compilation={"level": 2})
    assert lower.config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert platform_graph_mode(lower) == (
        CUDAGraphMode.NONE,
        "graphs need compilation level PIECEWISE",
    )


def test_one_fp8_format_stores_it_for_both_names_and_refuses_the_other() -> None:
    import torch

    platform = shape("fp8-e5m2")
    assert platform.fp8_dtype() == torch.float8_e5m2
    assert platform.fp8_cache_dtype == "fp8"
    for name in ("fp8", "fp8_e5m2"):
        result = resolve(platform, cache={"cache_dtype": name})
        assert result.config.cache.cache_dtype == name
        assert platform.cache_dtype_torch_name(name) == "float8_e5m2"
    with pytest.raises(
        hwplug.ConfigError,
        match=r"does not store fp8_e4m3 KV caches; use cache\.cache_dtype='fp8_e5m2'",
    ):
        resolve(platform, cache={"cache_dtype": "fp8_e4m3"})
