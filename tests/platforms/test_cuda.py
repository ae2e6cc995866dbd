"""The CUDA platform: identity, detection, and every CUDA cell of platforms.md."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug import ConfigError
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
)
from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.cuda import CudaPlatform
from tests.platforms.fakes import empty_box, jetson_box, nvidia_box
from tests.platforms.helpers import change, resolver

resolve = resolver()

CUDA_PROFILES = ("b200", "h100", "h200", "a100", "l4", "rtx3090", "t4")


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("name", "cuda"),
        ("device_type", "cuda"),
        ("dist_backend", "nccl"),
        ("ray_device_key", "GPU"),
        ("device_control_env_var", "CUDA_VISIBLE_DEVICES"),
        ("priority", 10),
        ("vendor", "NVIDIA"),
        ("representative_profile", "h100"),
        ("supports_device_graphs", True),
        ("supports_piecewise_graphs", True),
        ("graphs_need_compilation", True),
        ("default_compilation_level", 3),
        ("max_compilation_level", 3),
        ("fp8_dtype_name", "float8_e4m3fn"),
    ],
)
def test_identity_and_graph_attributes(attribute: str, value: object) -> None:
    assert getattr(CudaPlatform, attribute) == value


def test_identity_helpers() -> None:
    plat = CudaPlatform.simulate("h100")
    assert plat.is_cuda()
    assert plat.is_cuda_alike()
    assert not (plat.is_rocm())
    assert not (plat.is_cpu())
    assert not (plat.is_hpu())
    assert not (plat.is_xpu())


def test_profiles_are_the_documented_devices() -> None:
    profiles = CudaPlatform.profiles()
    assert set(profiles) == set(CUDA_PROFILES)
    assert profiles["h100"].name == "NVIDIA H100 80GB HBM3"
    assert profiles["rtx3090"].capability == (8, 6)
    assert profiles["t4"].capability == (7, 5)
    assert CudaPlatform.representative_profile in profiles


def test_simulated_device_count() -> None:
    plat = CudaPlatform.simulate("h100:8")
    assert len(plat.devices) == 8
    assert plat.simulated
    assert plat.get_device_name(7) == "NVIDIA H100 80GB HBM3"


# -- detection -------------------------------------------------------------------------


def test_detect_reads_sysfs_under_the_probe_root(tmp_path, monkeypatch) -> None:
    root = nvidia_box(tmp_path, count=4)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    devices = CudaPlatform.detect()
    assert len(devices) == 4
    assert {d.name for d in devices} == {"NVIDIA H100 80GB HBM3"}


def test_detect_honours_cuda_visible_devices(tmp_path, monkeypatch) -> None:
    root = nvidia_box(tmp_path, count=4)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert len(CudaPlatform.detect()) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert CudaPlatform.detect() == []


def test_detect_finds_nothing_without_nvidia_gpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(empty_box(tmp_path)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert CudaPlatform.detect() == []


def test_detect_finds_a_jetson(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(jetson_box(tmp_path)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (device,) = CudaPlatform.detect()
    assert "Jetson" in device.name


# -- block sizes -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", CUDA_PROFILES)
def test_default_block_size_is_16_and_recorded_by_the_platform(profile: str) -> None:
    res = resolve(profile)
    assert res.config.cache.block_size == 16
    filled = change(res, "cache.block_size")
    assert (filled.old, filled.new, filled.source) == (None, 16, "platform:cuda")


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("b200", 128),
        ("h100", 64),
        ("h200", 64),
        ("a100", 16),
        ("l4", 16),
        ("rtx3090", 16),
        ("t4", 16),
    ],
)
def test_mla_default_block_size_follows_compute_capability(profile: str, expected: int) -> None:
    res = resolve(profile, model=ModelConfig(use_mla=True))
    assert res.config.cache.block_size == expected
    assert change(res, "cache.block_size").source == "platform:cuda"


def test_allowed_block_sizes_depend_on_mla() -> None:
    plat = CudaPlatform.simulate("h100")
    assert plat.supported_block_sizes() == (8, 16, 32)
    assert plat.supported_block_sizes(ModelConfig()) == (8, 16, 32)
    assert plat.supported_block_sizes(ModelConfig(use_mla=True)) == (16, 32, 64, 128)


def test_explicit_block_size_is_kept() -> None:
    res = resolve("h100", cache=CacheConfig(block_size=32))
    assert res.config.cache.block_size == 32
    assert res.changes_to("cache.block_size") == []


def test_unsupported_block_size_names_option_device_and_choices() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("h100", cache=CacheConfig(block_size=64))
    text = str(err.value)
    assert "cache.block_size=64" in text
    assert "NVIDIA H100 80GB HBM3" in text
    assert "8, 16, 32" in text


def test_unsupported_mla_block_size_says_mla() -> None:
    with pytest.raises(ConfigError, match=r"cache\.block_size=8 .*MLA.*16, 32, 64, 128"):
        resolve("b200", model=ModelConfig(use_mla=True), cache=CacheConfig(block_size=8))


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]),
    use_mla=st.booleans(),
    profile=st.sampled_from(CUDA_PROFILES),
)
def test_block_size_resolves_exactly_when_allowed(
    block_size: int, use_mla: bool, profile: str
) -> None:
    allowed = (16, 32, 64, 128) if use_mla else (8, 16, 32)
    sections = {"cache": CacheConfig(block_size=block_size), "model": ModelConfig(use_mla=use_mla)}
    if block_size in allowed:
        assert resolve(profile, **sections).config.cache.block_size == block_size
    else:
        with pytest.raises(ConfigError, match=rf"cache\.block_size={block_size}\b"):
            resolve(profile, **sections)


# -- cache dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("b200", ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
        ("h100", ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
        ("l4", ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
        ("a100", ("auto", "bfloat16", "fp8_e5m2")),
        ("rtx3090", ("auto", "bfloat16", "fp8_e5m2")),
        ("t4", ("auto",)),
    ],
)
def test_cache_dtypes_follow_compute_capability(profile: str, expected: tuple[str, ...]) -> None:
    assert CudaPlatform.simulate(profile).supported_cache_dtypes() == expected


@pytest.mark.parametrize("cache_dtype", ["fp8_e4m3", "fp8"])
def test_e4m3_on_an_rtx_3090_suggests_e5m2(cache_dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("rtx3090", cache=CacheConfig(cache_dtype=cache_dtype))
    text = str(err.value)
    assert f"cache.cache_dtype={cache_dtype!r}" in text
    assert "NVIDIA GeForce RTX 3090" in text
    assert "8.6" in text
    assert "8.9" in text
    assert "use cache.cache_dtype='fp8_e5m2'" in text


def test_e5m2_and_bfloat16_caches_need_ampere() -> None:
    for cache_dtype in ("fp8_e5m2", "bfloat16"):
        with pytest.raises(ConfigError) as err:
            resolve("t4", cache=CacheConfig(cache_dtype=cache_dtype))
        text = str(err.value)
        assert "Tesla T4" in text
        assert "8.0" in text
        assert "use cache.cache_dtype='auto'" in text


def test_fp8_inc_is_the_gaudi_format() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("h100", cache=CacheConfig(cache_dtype="fp8_inc"))
    text = str(err.value)
    assert "cache.cache_dtype='fp8_inc'" in text
    assert "Intel Gaudi (HPU) format" in text
    assert "fp8_e4m3" in text


def test_fp8_means_e4m3fn() -> None:
    torch = pytest.importorskip("torch")
    plat = CudaPlatform.simulate("h100")
    assert plat.fp8_dtype() is torch.float8_e4m3fn
    assert not plat.is_fp8_fnuz()


def test_kv_cache_dtype_support_query_matches_the_rules() -> None:
    config = EngineConfig()
    l4, a100 = CudaPlatform.simulate("l4"), CudaPlatform.simulate("a100")
    assert l4.is_kv_cache_dtype_supported("fp8", config)
    assert not a100.is_kv_cache_dtype_supported("fp8", config)
    assert a100.is_kv_cache_dtype_supported("fp8_e5m2", config)
    assert a100.cache_dtype_problem("fp8_e4m3", None) is not None


# -- model dtypes ----------------------------------------------------------------------


def test_auto_dtype_is_bfloat16_on_ampere_and_later() -> None:
    res = resolve("a100")
    assert res.config.model.dtype == "bfloat16"
    assert change(res, "model.dtype").source == "engine"


def test_auto_dtype_is_float16_below_ampere() -> None:
    res = resolve("t4")
    assert res.config.model.dtype == "float16"
    assert CudaPlatform.simulate("t4").supported_model_dtypes() == ("float16", "float32")


def test_explicit_bfloat16_below_ampere_suggests_float16() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("t4", model=ModelConfig(dtype="bfloat16"))
    text = str(err.value)
    assert "model.dtype='bfloat16'" in text
    assert "Tesla T4" in text
    assert "8.0" in text
    assert "use model.dtype='float16'" in text


def test_supports_dtype_accepts_names_and_torch_dtypes() -> None:
    torch = pytest.importorskip("torch")
    t4, h100 = CudaPlatform.simulate("t4"), CudaPlatform.simulate("h100")
    assert h100.supports_dtype(torch.bfloat16)
    assert h100.supports_dtype("bf16")
    assert not t4.supports_dtype(torch.bfloat16)
    assert t4.supports_dtype(torch.float16)
    assert t4.supports_dtype("float32")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_explicit_half_and_float_run_everywhere(dtype: str) -> None:
    assert resolve("t4", model=ModelConfig(dtype=dtype)).config.model.dtype == dtype


# -- compilation and graphs ------------------------------------------------------------


def test_default_is_piecewise_compilation_with_full_and_piecewise_graphs() -> None:
    res = resolve("h100")
    assert res.config.compilation.level == 3
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert res.config.compilation.cudagraph_capture_sizes
    assert change(res, "compilation.level").source == "engine"


def test_enforce_eager_turns_compilation_and_graphs_off() -> None:
    res = resolve("h100", model=ModelConfig(enforce_eager=True))
    assert res.config.compilation.level == 0
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert res.config.compilation.cudagraph_capture_sizes == []


def test_compilation_is_kept_as_given() -> None:
    comp = CompilationConfig(level=1, backend="eager", custom_ops=["+rms_norm"])
    res = resolve("h100", compilation=comp)
    assert res.config.compilation.level == 1
    assert res.config.compilation.backend == "eager"
    assert res.config.compilation.custom_ops == ["+rms_norm"]
    assert not [
        c for c in res.changes if c.source == "platform:cuda" and c.path != "cache.block_size"
    ]


def test_executor_is_kept_as_given() -> None:
    res = resolve("h100")
    assert res.config.parallel.distributed_executor_backend is None


def test_graph_wrapper_is_the_cuda_graph_wrapper() -> None:
    from hwplug.platforms.cuda_graphs import CUDAGraphWrapper

    assert CudaPlatform.simulate("h100").graph_wrapper_cls() is CUDAGraphWrapper


# -- memory ----------------------------------------------------------------------------


def test_kv_budget_is_device_memory_times_utilisation() -> None:
    plat = CudaPlatform.simulate("h100")
    total = plat.get_device_total_memory()
    config = EngineConfig(cache=CacheConfig(gpu_memory_utilization=0.5))
    assert plat.kv_cache_budget_bytes(config) == total // 2
    assert plat.kv_cache_budget_bytes(config, used_bytes=1 << 30) == total // 2 - (1 << 30)


def test_capability_queries_on_simulated_devices() -> None:
    plat = CudaPlatform.simulate("l4")
    assert plat.get_device_capability() == DeviceCapability(8, 9)
    assert plat.has_device_capability(89)
    assert plat.has_device_capability((8, 0))
    assert not plat.has_device_capability(90)
    assert plat.get_current_memory_usage() == 0


def test_capability_unknown_means_no_capability_rule_applies(monkeypatch) -> None:
    # A real GPU whose capability nothing can tell (no NVML, no CUDA runtime).
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr("hwplug.platforms.vendor.torch_cuda_query", lambda what, query: None)
    plat = CudaPlatform([DeviceInfo("NVIDIA GPU [10de:ffff]", 0)])
    assert plat.supported_cache_dtypes() == CudaPlatform.cache_dtypes
    assert plat.supported_model_dtypes() == ("bfloat16", "float16", "float32")
