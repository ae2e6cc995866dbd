"""Rules every platform must keep, run on each selected profile by the hwplug pytest plugin.

By default each test runs once per installed platform (its representative
profile); ``pytest --hwplug-profiles=all`` runs them on every known profile.
"""

from __future__ import annotations

import pytest

import hwplug
from hwplug.core.config import CacheConfig, CUDAGraphMode, EngineConfig, ModelConfig
from hwplug.core.platform import Platform
from hwplug.matrix import graph_modes


def test_the_fixture_is_the_current_platform(hwplug_platform: Platform) -> None:
    assert hwplug.current_platform is hwplug_platform
    assert hwplug_platform.simulated
    assert hwplug_platform.devices


def test_default_config_resolves_within_the_platform_tables(hwplug_platform: Platform) -> None:
    resolution = hwplug.resolve()
    config = resolution.config
    assert resolution.platform is hwplug_platform
    assert config.cache.block_size == hwplug_platform.default_block_size(config)
    assert config.cache.block_size in hwplug_platform.supported_block_sizes(config.model)
    assert config.model.dtype == hwplug_platform.supported_model_dtypes()[0]
    assert config.compilation.level == hwplug_platform.default_compilation_level
    assert config.compilation.cudagraph_mode is not None
    assert config.compilation.cudagraph_mode.name in graph_modes(hwplug_platform)
    if config.compilation.cudagraph_mode == CUDAGraphMode.NONE:
        assert config.compilation.cudagraph_capture_sizes == []
    else:
        assert config.compilation.cudagraph_capture_sizes
    # Every filled-in value is recorded with a reason.
    assert all(change.reason for change in resolution.changes)
    assert "cache.block_size" in {change.path for change in resolution.changes}


def test_resolution_is_deterministic(hwplug_platform: Platform) -> None:
    first = hwplug.resolve()
    second = hwplug.resolve()
    assert first.to_dict() == second.to_dict()
    assert first.config.compute_hash() == second.config.compute_hash()


def test_mla_models_get_an_allowed_block_size(hwplug_platform: Platform) -> None:
    config = EngineConfig(model=ModelConfig(use_mla=True))
    resolved = hwplug.resolve(config).config
    assert resolved.cache.block_size in hwplug_platform.supported_block_sizes(resolved.model)


def test_every_allowed_block_size_resolves(hwplug_platform: Platform) -> None:
    for size in hwplug_platform.supported_block_sizes(ModelConfig()):
        resolved = hwplug.resolve(EngineConfig(cache=CacheConfig(block_size=size))).config
        assert resolved.cache.block_size == size


def test_a_block_size_outside_the_table_names_the_device(hwplug_platform: Platform) -> None:
    allowed = hwplug_platform.supported_block_sizes(ModelConfig())
    size = next(s for s in (24, 48, 96, 512) if s not in allowed)
    with pytest.raises(hwplug.ConfigError) as info:
        hwplug.resolve(EngineConfig(cache=CacheConfig(block_size=size)))
    message = str(info.value)
    assert "cache.block_size" in message
    assert hwplug_platform.describe_device() in message


def test_every_supported_cache_dtype_resolves(hwplug_platform: Platform) -> None:
    for dtype in hwplug_platform.supported_cache_dtypes():
        resolved = hwplug.resolve(EngineConfig(cache=CacheConfig(cache_dtype=dtype))).config
        assert resolved.cache.cache_dtype == dtype


def test_unsupported_cache_dtypes_are_errors(hwplug_platform: Platform) -> None:
    supported = set(hwplug_platform.supported_cache_dtypes())
    for dtype in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        if dtype in supported:
            continue
        with pytest.raises(hwplug.ConfigError, match="cache.cache_dtype"):
            hwplug.resolve(EngineConfig(cache=CacheConfig(cache_dtype=dtype)))


def test_graph_modes_in_the_support_matrix_are_the_ones_that_resolve(
    hwplug_platform: Platform,
) -> None:
    accepted = set(graph_modes(hwplug_platform))
    for mode in CUDAGraphMode:
        config = EngineConfig.from_dict({"compilation": {"cudagraph_mode": mode.name}})
        if mode.name in accepted:
            assert hwplug.resolve(config).config.compilation.cudagraph_mode == mode
        else:
            with pytest.raises(hwplug.ConfigError, match="compilation.cudagraph_mode"):
                hwplug.resolve(config)


def test_enforce_eager_turns_compilation_and_graphs_off(hwplug_platform: Platform) -> None:
    resolved = hwplug.resolve(EngineConfig(model=ModelConfig(enforce_eager=True))).config
    assert resolved.compilation.level == 0
    assert resolved.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert resolved.compilation.cudagraph_capture_sizes == []


@pytest.mark.hwplug_platforms("cuda", "rocm")
def test_cuda_alike_platforms_capture_full_and_piecewise_graphs(
    hwplug_platform: Platform,
) -> None:
    assert hwplug_platform.is_cuda_alike()
    mode = hwplug.resolve().config.compilation.cudagraph_mode
    assert mode == CUDAGraphMode.FULL_AND_PIECEWISE
