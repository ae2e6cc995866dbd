"""The CPU platform: identity, detection, and every CPU cell of platforms.md."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwplug
from hwplug import ConfigError
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from hwplug.core.platform import DeviceInfo
from hwplug.platforms.cpu import KVCACHE_SPACE_ENV, CpuPlatform
from hwplug.platforms.cpu import probe as cpu_probe
from tests.platforms.fakes import XEON_FLAGS, FakeRoot, empty_box
from tests.platforms.helpers import change, resolver

resolve = resolver("cpu-generic")

GiB = 1 << 30


@pytest.fixture(autouse=True)
def _no_kvcache_env(monkeypatch) -> None:
    monkeypatch.delenv(KVCACHE_SPACE_ENV, raising=False)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("name", "cpu"),
        ("device_type", "cpu"),
        ("dist_backend", "gloo"),
        ("ray_device_key", ""),
        ("device_control_env_var", "CPU_VISIBLE_MEMORY_NODES"),
        ("priority", 0),
        ("representative_profile", "cpu-generic"),
        ("supports_device_graphs", False),
        ("default_compilation_level", 2),
        ("fp8_dtype_name", "float8_e5m2"),
    ],
)
def test_identity_and_graph_attributes(attribute: str, value: object) -> None:
    assert getattr(CpuPlatform, attribute) == value


def test_profiles_are_the_documented_devices() -> None:
    profiles = CpuPlatform.profiles()
    assert set(profiles) == {"cpu-generic", "xeon-spr"}
    assert "ipex" in profiles["xeon-spr"].features
    assert "ipex" not in profiles["cpu-generic"].features
    assert CpuPlatform.simulate("xeon-spr").has_ipex()
    assert not CpuPlatform.simulate("cpu-generic").has_ipex()


# -- detection -------------------------------------------------------------------------


def test_detect_always_finds_one_cpu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(empty_box(tmp_path)))
    monkeypatch.setattr(cpu_probe, "ipex_available", lambda: False)
    (cpu,) = CpuPlatform.detect()
    assert cpu.name == "AMD Ryzen 9 7950X 16-Core Processor"
    assert "avx2" in cpu.features
    assert "ipex" not in cpu.features
    assert cpu.total_memory == 64 * GiB


def test_detect_sees_ipex(tmp_path, monkeypatch) -> None:
    root = FakeRoot(tmp_path)
    root.cpuinfo(model_name="Intel(R) Xeon(R) Platinum 8480+", flags=XEON_FLAGS)
    root.meminfo(512 * GiB)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.setattr(cpu_probe, "ipex_available", lambda: True)
    (cpu,) = CpuPlatform.detect()
    assert {"ipex", "amx_bf16", "avx512f"} <= cpu.features
    plat = CpuPlatform([cpu])
    assert plat.has_ipex()
    assert hwplug.resolve(platform=plat).config.cache.block_size == 128


def test_detect_on_a_bare_root_still_finds_a_cpu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    assert len(CpuPlatform.detect()) == 1


# -- block sizes -----------------------------------------------------------------------


@pytest.mark.parametrize(("profile", "size"), [("xeon-spr", 128), ("cpu-generic", 16)])
def test_default_block_size(profile: str, size: int) -> None:
    res = resolve(profile)
    assert res.config.cache.block_size == size
    filled = change(res, "cache.block_size")
    assert filled.source == "platform:cpu"
    assert "intel_extension_for_pytorch" in filled.reason


def test_allowed_block_sizes() -> None:
    assert CpuPlatform.simulate("cpu-generic").supported_block_sizes() == (16,)
    assert CpuPlatform.simulate("xeon-spr").supported_block_sizes() == (16, 32, 64, 128)


@pytest.mark.parametrize("size", [32, 64, 128])
def test_larger_blocks_need_ipex(size: int) -> None:
    assert resolve("xeon-spr", cache=CacheConfig(block_size=size)).config.cache.block_size == size
    with pytest.raises(ConfigError) as err:
        resolve("cpu-generic", cache=CacheConfig(block_size=size))
    text = str(err.value)
    assert f"cache.block_size={size}" in text
    assert "Generic x86-64 CPU" in text
    assert "use one of: 16" in text
    assert "intel_extension_for_pytorch" in text


def test_block_sizes_outside_the_ipex_set_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"cache\.block_size=8 .*16, 32, 64, 128"):
        resolve("xeon-spr", cache=CacheConfig(block_size=8))


# -- cache dtypes and fp8 --------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("cpu-generic", ("auto", "bfloat16")),
        ("xeon-spr", ("auto", "bfloat16", "fp8", "fp8_e5m2")),
    ],
)
def test_cache_dtypes(profile: str, expected: tuple[str, ...]) -> None:
    assert CpuPlatform.simulate(profile).supported_cache_dtypes() == expected


def test_e4m3_suggests_e5m2() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("xeon-spr", cache=CacheConfig(cache_dtype="fp8_e4m3"))
    text = str(err.value)
    assert "cache.cache_dtype='fp8_e4m3'" in text
    assert "Intel(R) Xeon(R) Platinum 8480+" in text
    assert "use cache.cache_dtype='fp8_e5m2'" in text


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e5m2", "fp8_e4m3"])
def test_fp8_without_ipex_names_ipex(cache_dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("cpu-generic", cache=CacheConfig(cache_dtype=cache_dtype))
    text = str(err.value)
    assert f"cache.cache_dtype={cache_dtype!r}" in text
    assert "intel_extension_for_pytorch" in text
    assert "use cache.cache_dtype='auto' or 'bfloat16'" in text


def test_fp8_inc_is_the_gaudi_format() -> None:
    with pytest.raises(ConfigError, match=r"Intel Gaudi \(HPU\) format.*fp8_e5m2"):
        resolve("xeon-spr", cache=CacheConfig(cache_dtype="fp8_inc"))


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_cache_turns_prefix_caching_and_chunked_prefill_off(cache_dtype: str) -> None:
    res = resolve("xeon-spr", cache=CacheConfig(cache_dtype=cache_dtype))
    assert res.config.cache.enable_prefix_caching is False
    assert res.config.scheduler.enable_chunked_prefill is False
    for path in ("cache.enable_prefix_caching", "scheduler.enable_chunked_prefill"):
        filled = change(res, path)
        assert filled.new is False
        assert cache_dtype in filled.reason


def test_without_fp8_prefix_caching_and_chunked_prefill_stay_on() -> None:
    res = resolve("xeon-spr")
    assert res.config.cache.enable_prefix_caching is True
    assert res.config.scheduler.enable_chunked_prefill is True


@pytest.mark.parametrize(
    ("path", "sections"),
    [
        (
            "cache.enable_prefix_caching",
            {"cache": CacheConfig(cache_dtype="fp8", enable_prefix_caching=True)},
        ),
        (
            "scheduler.enable_chunked_prefill",
            {
                "cache": CacheConfig(cache_dtype="fp8_e5m2"),
                "scheduler": SchedulerConfig(enable_chunked_prefill=True),
            },
        ),
    ],
)
def test_fp8_cache_with_an_explicit_on_is_an_error(path: str, sections: dict) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("xeon-spr", **sections)
    text = str(err.value)
    assert f"{path}=True" in text
    assert "cache.cache_dtype=" in text
    assert "Intel(R) Xeon(R) Platinum 8480+" in text
    assert f"{path}=False" in text


def test_fp8_cache_with_explicit_off_is_fine() -> None:
    res = resolve(
        "xeon-spr",
        cache=CacheConfig(cache_dtype="fp8", enable_prefix_caching=False),
        scheduler=SchedulerConfig(enable_chunked_prefill=False),
    )
    assert res.config.cache.cache_dtype == "fp8"


def test_is_kv_cache_dtype_supported_looks_at_the_config() -> None:
    spr = CpuPlatform.simulate("xeon-spr")
    assert spr.is_kv_cache_dtype_supported("fp8", EngineConfig())
    on = EngineConfig(cache=CacheConfig(enable_prefix_caching=True))
    assert not spr.is_kv_cache_dtype_supported("fp8", on)
    assert spr.is_kv_cache_dtype_supported("bfloat16", on)


# -- model dtypes ----------------------------------------------------------------------


def test_model_dtypes() -> None:
    assert CpuPlatform.simulate("cpu-generic").supported_model_dtypes() == (
        "bfloat16",
        "float16",
        "float32",
    )
    assert resolve().config.model.dtype == "bfloat16"


def test_float16_model_with_fp8_cache_must_be_bfloat16() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(
            "xeon-spr", cache=CacheConfig(cache_dtype="fp8"), model=ModelConfig(dtype="float16")
        )
    text = str(err.value)
    assert "model.dtype='float16'" in text
    assert "cache.cache_dtype='fp8'" in text
    assert "use model.dtype='bfloat16'" in text


def test_auto_model_with_fp8_cache_becomes_bfloat16() -> None:
    res = resolve("xeon-spr", cache=CacheConfig(cache_dtype="fp8"))
    assert res.config.model.dtype == "bfloat16"


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_explicit_model_dtypes_without_fp8_are_kept(dtype: str) -> None:
    assert resolve(model=ModelConfig(dtype=dtype)).config.model.dtype == dtype


# -- compilation and graphs ------------------------------------------------------------


def test_compilation_defaults() -> None:
    res = resolve()
    comp = res.config.compilation
    assert comp.level == 2
    assert comp.cudagraph_mode == CUDAGraphMode.NONE
    assert comp.cudagraph_capture_sizes == []
    assert comp.backend == "inductor"
    assert comp.custom_ops == ["none"]
    assert change(res, "compilation.backend").source == "platform:cpu"
    assert change(res, "compilation.custom_ops").source == "platform:cpu"
    assert change(res, "compilation.level").source == "engine"


def test_explicit_compilation_choices_are_kept() -> None:
    res = resolve(compilation=CompilationConfig(backend="eager", custom_ops=["+rms_norm"]))
    assert res.config.compilation.backend == "eager"
    assert res.config.compilation.custom_ops == ["+rms_norm"]


def test_custom_ops_untouched_without_inductor() -> None:
    res = resolve(compilation=CompilationConfig(use_inductor=False))
    assert res.config.compilation.custom_ops == []
    assert res.config.compilation.backend == "inductor"


def test_explicit_piecewise_level_runs_without_graphs() -> None:
    res = resolve(compilation=CompilationConfig(level=3))
    assert res.config.compilation.level == 3
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.NONE


@pytest.mark.parametrize("mode", ["FULL", "PIECEWISE", "FULL_AND_PIECEWISE"])
def test_device_graphs_are_an_error(mode: str) -> None:
    with pytest.raises(ConfigError, match=rf"compilation\.cudagraph_mode={mode}.*NONE"):
        resolve(compilation=CompilationConfig(cudagraph_mode=mode))


def test_no_graph_wrapper() -> None:
    assert CpuPlatform.simulate("cpu-generic").graph_wrapper_cls() is None


# -- executor --------------------------------------------------------------------------


def test_one_rank_leaves_the_executor_alone() -> None:
    assert resolve().config.parallel.distributed_executor_backend is None


def test_several_ranks_use_mp() -> None:
    res = resolve(parallel=ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2))
    assert res.config.parallel.distributed_executor_backend == "mp"
    assert change(res, "parallel.distributed_executor_backend").source == "platform:cpu"


@pytest.mark.parametrize("backend", ["ray", "uni", "external_launcher", "mp"])
def test_an_explicit_executor_with_several_ranks_is_kept(backend: str) -> None:
    """platforms.md: an explicit uni, mp, ray or external_launcher is kept."""
    res = resolve(
        parallel=ParallelConfig(tensor_parallel_size=2, distributed_executor_backend=backend)
    )
    assert res.config.parallel.distributed_executor_backend == backend
    assert not [c for c in res.changes if c.path == "parallel.distributed_executor_backend"]


def test_explicit_executor_with_one_rank_is_kept() -> None:
    res = resolve(parallel=ParallelConfig(distributed_executor_backend="uni"))
    assert res.config.parallel.distributed_executor_backend == "uni"


# -- KV-cache space --------------------------------------------------------------------


def test_kvcache_space_defaults_to_4_gib() -> None:
    res = resolve()
    assert res.config.cache.cpu_kvcache_space_bytes == 4 * GiB
    filled = change(res, "cache.cpu_kvcache_space_bytes")
    assert filled.source == "platform:cpu"
    assert KVCACHE_SPACE_ENV in filled.reason
    assert "4 GiB" in filled.reason


@pytest.mark.parametrize(
    ("value", "expected"), [("8", 8 * GiB), ("0.5", GiB // 2), (" 2 ", 2 * GiB)]
)
def test_kvcache_space_from_the_environment(monkeypatch, value: str, expected: int) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, value)
    res = resolve()
    assert res.config.cache.cpu_kvcache_space_bytes == expected
    assert KVCACHE_SPACE_ENV in change(res, "cache.cpu_kvcache_space_bytes").reason


@pytest.mark.parametrize("value", ["lots", "-1", "0", "nan", "inf", "4GiB"])
def test_bad_kvcache_space_names_the_variable(monkeypatch, value: str) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, value)
    with pytest.raises(ConfigError) as err:
        resolve()
    text = str(err.value)
    assert KVCACHE_SPACE_ENV in text
    assert repr(value) in text
    assert "positive number" in text


@settings(max_examples=30, deadline=None)
@given(gib=st.floats(min_value=0.001, max_value=4096, allow_nan=False, allow_infinity=False))
def test_kvcache_space_is_gib_times_2_to_the_30(gib: float) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KVCACHE_SPACE_ENV, repr(gib))
        space, origin = CpuPlatform.simulate("cpu-generic").kvcache_space_bytes()
    assert space == int(gib * GiB)
    assert math.isclose(space / GiB, gib, rel_tol=1e-6, abs_tol=1e-9)
    assert KVCACHE_SPACE_ENV in origin


def test_explicit_kvcache_space_is_kept(monkeypatch) -> None:
    monkeypatch.setenv(KVCACHE_SPACE_ENV, "not even a number")
    res = resolve(cache=CacheConfig(cpu_kvcache_space_bytes=123 * (1 << 20)))
    assert res.config.cache.cpu_kvcache_space_bytes == 123 * (1 << 20)
    assert res.changes_to("cache.cpu_kvcache_space_bytes") == []


def test_kv_budget_is_the_kvcache_space(monkeypatch) -> None:
    plat = CpuPlatform.simulate("xeon-spr")
    config = resolve("xeon-spr").config
    assert plat.kv_cache_budget_bytes(config) == 4 * GiB
    assert plat.kv_cache_budget_bytes(config, used_bytes=GiB) == 4 * GiB
    monkeypatch.setenv(KVCACHE_SPACE_ENV, "3")
    assert plat.kv_cache_budget_bytes(EngineConfig()) == 3 * GiB


def test_a_cpu_without_features_is_a_plain_cpu() -> None:
    plat = CpuPlatform([DeviceInfo("Ampere Altra", 256 * GiB, arch="aarch64")])
    assert plat.default_block_size(EngineConfig()) == 16
    assert plat.supported_cache_dtypes() == ("auto", "bfloat16")
