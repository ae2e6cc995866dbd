"""The whole support matrix: every profile of every built-in platform against every choice.

Each cell either resolves or fails with a ``ConfigError`` that names the
option and the device; never any other exception. The expected supported
sets are pinned here so that a change to any rule table shows up as a diff.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hwplug
from hwplug import ConfigError
from hwplug.core.config import CacheConfig, EngineConfig, ModelConfig
from hwplug.core.platform import Platform
from hwplug.platforms.cpu import CpuPlatform
from hwplug.platforms.cuda import CudaPlatform
from hwplug.platforms.hpu import HpuPlatform
from hwplug.platforms.rocm import RocmPlatform
from hwplug.platforms.xpu import XpuPlatform

BUILTINS: dict[str, type[Platform]] = {
    "cuda": CudaPlatform,
    "rocm": RocmPlatform,
    "cpu": CpuPlatform,
    "hpu": HpuPlatform,
    "xpu": XpuPlatform,
}

CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
MODEL_DTYPES = ("bfloat16", "float16", "float32")

ALL_CUDA = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
ROCM_FP8 = ("auto", "bfloat16", "fp8", "fp8_e4m3")
IPEX_CPU = ("auto", "bfloat16", "fp8", "fp8_e5m2")
GAUDI_FP8 = ("auto", "bfloat16", "fp8_inc")
INTEL_GPU = ("auto", "bfloat16", "fp8", "fp8_e5m2")
PLAIN = ("auto", "bfloat16")

# profile -> (platform, supported cache dtypes, supported model dtypes, default block size)
EXPECTED: dict[str, tuple[str, tuple[str, ...], tuple[str, ...], int]] = {
    "b200": ("cuda", ALL_CUDA, MODEL_DTYPES, 16),
    "h100": ("cuda", ALL_CUDA, MODEL_DTYPES, 16),
    "h200": ("cuda", ALL_CUDA, MODEL_DTYPES, 16),
    "l4": ("cuda", ALL_CUDA, MODEL_DTYPES, 16),
    "a100": ("cuda", ("auto", "bfloat16", "fp8_e5m2"), MODEL_DTYPES, 16),
    "rtx3090": ("cuda", ("auto", "bfloat16", "fp8_e5m2"), MODEL_DTYPES, 16),
    "t4": ("cuda", ("auto",), ("float16", "float32"), 16),
    "mi300x": ("rocm", ROCM_FP8, MODEL_DTYPES, 16),
    "mi325x": ("rocm", ROCM_FP8, MODEL_DTYPES, 16),
    "mi355x": ("rocm", ROCM_FP8, MODEL_DTYPES, 16),
    "mi250x": ("rocm", PLAIN, MODEL_DTYPES, 16),
    "rx7900xtx": ("rocm", PLAIN, MODEL_DTYPES, 16),
    "cpu-generic": ("cpu", PLAIN, MODEL_DTYPES, 16),
    "xeon-spr": ("cpu", IPEX_CPU, MODEL_DTYPES, 128),
    "gaudi": ("hpu", PLAIN, ("bfloat16",), 128),
    "gaudi2": ("hpu", GAUDI_FP8, ("bfloat16",), 128),
    "gaudi3": ("hpu", GAUDI_FP8, ("bfloat16",), 128),
    "max-1550": ("xpu", INTEL_GPU, MODEL_DTYPES, 64),
    "arc-b580": ("xpu", INTEL_GPU, MODEL_DTYPES, 64),
    "arc-a770": ("xpu", ("auto", "fp8", "fp8_e5m2"), ("float16", "float32"), 64),
}

PROFILES = tuple(EXPECTED)


def simulate(profile: str) -> Platform:
    return BUILTINS[EXPECTED[profile][0]].simulate(profile)


def test_every_builtin_profile_is_pinned() -> None:
    shipped = {p: name for name, cls in BUILTINS.items() for p in cls.profiles()}
    assert shipped == {p: spec[0] for p, spec in EXPECTED.items()}


def test_the_builtins_are_registered_through_entry_points() -> None:
    from hwplug.plugins.manager import get_plugin_manager

    entries = get_plugin_manager().platform_entries()
    for name, cls in BUILTINS.items():
        assert entries[name].cls is cls
        assert entries[name].distribution == "hwplug"


@pytest.mark.parametrize("profile", PROFILES)
def test_default_config_resolves(profile: str) -> None:
    res = hwplug.resolve(EngineConfig(), platform=simulate(profile))
    _, _, model_dtypes, block = EXPECTED[profile]
    assert res.config.cache.block_size == block
    assert res.config.model.dtype == model_dtypes[0]
    assert res.config.compilation.level == BUILTINS[EXPECTED[profile][0]].default_compilation_level


@pytest.mark.parametrize("profile", PROFILES)
def test_default_config_resolves_on_several_devices(profile: str) -> None:
    plat = BUILTINS[EXPECTED[profile][0]].simulate(f"{profile}:2")
    assert len(plat.devices) == 2
    hwplug.resolve(EngineConfig(), platform=plat)


@pytest.mark.parametrize("profile", PROFILES)
def test_supported_cache_dtypes_are_pinned(profile: str) -> None:
    assert simulate(profile).supported_cache_dtypes() == EXPECTED[profile][1]


@pytest.mark.parametrize("profile", PROFILES)
def test_supported_model_dtypes_are_pinned(profile: str) -> None:
    assert simulate(profile).supported_model_dtypes() == EXPECTED[profile][2]


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("profile", PROFILES)
def test_cache_dtype_cell(profile: str, cache_dtype: str) -> None:
    plat = simulate(profile)
    config = EngineConfig(cache=CacheConfig(cache_dtype=cache_dtype))
    supported = cache_dtype in EXPECTED[profile][1]
    assert plat.is_kv_cache_dtype_supported(cache_dtype, config) is supported
    if supported:
        res = hwplug.resolve(config, platform=plat)
        assert res.config.cache.cache_dtype == cache_dtype
        return
    with pytest.raises(ConfigError) as err:
        hwplug.resolve(config, platform=plat)
    text = str(err.value)
    assert f"cache.cache_dtype={cache_dtype!r}" in text
    assert plat.get_device_name() in text
    # The suggestion is a value that works on this very device.
    suggested = text.rsplit("use cache.cache_dtype=", 1)[1]
    offered = [v.strip(" '") for v in suggested.replace(" or ", ",").split(",")]
    assert offered
    assert set(offered) <= set(EXPECTED[profile][1])


@pytest.mark.parametrize("dtype", MODEL_DTYPES)
@pytest.mark.parametrize("profile", PROFILES)
def test_model_dtype_cell(profile: str, dtype: str) -> None:
    plat = simulate(profile)
    config = EngineConfig(model=ModelConfig(dtype=dtype))
    if dtype in EXPECTED[profile][2]:
        assert hwplug.resolve(config, platform=plat).config.model.dtype == dtype
        return
    with pytest.raises(ConfigError) as err:
        hwplug.resolve(config, platform=plat)
    text = str(err.value)
    assert f"model.dtype={dtype!r}" in text
    assert plat.get_device_name() in text
    assert f"use model.dtype={EXPECTED[profile][2][0]!r}" in text


@pytest.mark.parametrize("profile", PROFILES)
def test_every_allowed_block_size_resolves(profile: str) -> None:
    plat = simulate(profile)
    for use_mla in (False, True):
        model = ModelConfig(use_mla=use_mla)
        for size in plat.supported_block_sizes(model):
            config = EngineConfig(model=model, cache=CacheConfig(block_size=size))
            assert hwplug.resolve(config, platform=plat).config.cache.block_size == size


def test_platforms_and_resolution_never_import_torch() -> None:
    script = """
import json, sys
import hwplug
from hwplug.platforms import cpu, cuda, hpu, rocm, xpu
out = {}
for cls in (cuda.CudaPlatform, rocm.RocmPlatform, cpu.CpuPlatform, hpu.HpuPlatform,
            xpu.XpuPlatform):
    for profile in cls.profiles():
        plat = cls.simulate(profile)
        hwplug.resolve(platform=plat)
        out[profile] = [plat.supported_cache_dtypes(), plat.fp8_dtype_name, plat.dist_backend]
out["torch imported"] = "torch" in sys.modules
print(json.dumps(out))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out.pop("torch imported") is False
    assert {p: tuple(v[0]) for p, v in out.items()} == {p: s[1] for p, s in EXPECTED.items()}
