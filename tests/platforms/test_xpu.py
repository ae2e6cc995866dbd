"""The XPU (Intel GPU) platform: identity, detection, and every XPU cell of platforms.md."""

from __future__ import annotations

from importlib import metadata

import pytest

from hwplug import ConfigError
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
    ParallelConfig,
)
from hwplug.core.platform import DeviceInfo
from hwplug.platforms.xpu import XpuPlatform, xpu_dist_backend
from tests.platforms.fakes import empty_box, intel_discrete_box, intel_integrated_box
from tests.platforms.helpers import change, resolver

resolve = resolver("max-1550")

XPU_PROFILES = ("max-1550", "arc-a770", "arc-b580")


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("name", "xpu"),
        ("device_type", "xpu"),
        ("ray_device_key", "GPU"),
        ("device_control_env_var", "ZE_AFFINITY_MASK"),
        ("priority", 10),
        ("vendor", "Intel"),
        ("representative_profile", "max-1550"),
        ("supports_device_graphs", False),
        ("default_compilation_level", 3),
        ("fp8_dtype_name", "float8_e5m2"),
    ],
)
def test_identity_and_graph_attributes(attribute: str, value: object) -> None:
    assert getattr(XpuPlatform, attribute) == value


def test_dist_backend_follows_the_installed_torch() -> None:
    major, minor = (int(p) for p in metadata.version("torch").split(".")[:2])
    expected = "xccl" if (major, minor) >= (2, 8) else "ccl"
    assert XpuPlatform.dist_backend == expected


@pytest.fixture
def fresh_torch_version():
    """The torch version is read once per process: forget it around the test."""
    from hwplug.core.config._common import torch_version

    torch_version.cache_clear()
    yield
    torch_version.cache_clear()


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.8.0", "xccl"),
        ("2.13.0+cpu", "xccl"),
        ("3.0", "xccl"),
        ("2.7.1+xpu", "ccl"),
        ("2.6", "ccl"),
    ],
)
@pytest.mark.usefixtures("fresh_torch_version")
def test_xpu_dist_backend_by_version(monkeypatch, version: str, expected: str) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: version)
    assert xpu_dist_backend() == expected


@pytest.mark.usefixtures("fresh_torch_version")
def test_xpu_dist_backend_without_torch(monkeypatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert xpu_dist_backend() == "ccl"


def test_profiles_are_the_documented_devices() -> None:
    profiles = XpuPlatform.profiles()
    assert set(profiles) == set(XPU_PROFILES)
    assert profiles["max-1550"].name == "Intel(R) Data Center GPU Max 1550"
    assert XpuPlatform.simulate("arc-b580").is_xpu()


# -- detection -------------------------------------------------------------------------


def test_detect_finds_discrete_gpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(intel_discrete_box(tmp_path, count=2)))
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    devices = XpuPlatform.detect()
    assert [d.name for d in devices] == ["Intel(R) Data Center GPU Max 1550"] * 2
    assert devices[0].total_memory == 128 << 30


def test_detect_honours_ze_affinity_mask(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(intel_discrete_box(tmp_path, count=2)))
    monkeypatch.setenv("ZE_AFFINITY_MASK", "1.0")
    assert len(XpuPlatform.detect()) == 1


def test_detect_never_counts_an_integrated_gpu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(intel_integrated_box(tmp_path)))
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    assert XpuPlatform.detect() == []


def test_detect_finds_nothing_on_a_plain_box(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(empty_box(tmp_path)))
    assert XpuPlatform.detect() == []


def test_detected_arc_a770_has_no_bfloat16(tmp_path, monkeypatch) -> None:
    root = intel_discrete_box(tmp_path, device=0x56A0, count=1, tiles=1, vram_per_tile=16 << 30)
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(root))
    monkeypatch.delenv("ZE_AFFINITY_MASK", raising=False)
    plat = XpuPlatform(XpuPlatform.detect())
    assert "bfloat16" not in plat.supported_model_dtypes()


# -- block sizes -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", XPU_PROFILES)
def test_default_block_size_is_64(profile: str) -> None:
    res = resolve(profile)
    assert res.config.cache.block_size == 64
    assert change(res, "cache.block_size").source == "platform:xpu"


@pytest.mark.parametrize("size", [16, 32, 64])
def test_allowed_block_sizes(size: int) -> None:
    assert XpuPlatform.simulate("max-1550").supported_block_sizes() == (16, 32, 64)
    assert resolve(cache=CacheConfig(block_size=size)).config.cache.block_size == size


@pytest.mark.parametrize("size", [8, 128])
def test_other_block_sizes_are_errors(size: int) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(cache=CacheConfig(block_size=size))
    text = str(err.value)
    assert f"cache.block_size={size}" in text
    assert "Max 1550" in text
    assert "16, 32, 64" in text


# -- cache and model dtypes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("max-1550", ("auto", "bfloat16", "fp8", "fp8_e5m2")),
        ("arc-b580", ("auto", "bfloat16", "fp8", "fp8_e5m2")),
        ("arc-a770", ("auto", "fp8", "fp8_e5m2")),
    ],
)
def test_cache_dtypes(profile: str, expected: tuple[str, ...]) -> None:
    assert XpuPlatform.simulate(profile).supported_cache_dtypes() == expected


def test_e4m3_suggests_e5m2() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(cache=CacheConfig(cache_dtype="fp8_e4m3"))
    text = str(err.value)
    assert "cache.cache_dtype='fp8_e4m3'" in text
    assert "Intel(R) Data Center GPU Max 1550" in text
    assert "use cache.cache_dtype='fp8_e5m2'" in text


def test_fp8_inc_is_the_gaudi_format() -> None:
    with pytest.raises(ConfigError, match=r"Intel Gaudi \(HPU\) format.*fp8_e5m2"):
        resolve(cache=CacheConfig(cache_dtype="fp8_inc"))


def test_bfloat16_cache_on_arc_a_series_suggests_auto() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("arc-a770", cache=CacheConfig(cache_dtype="bfloat16"))
    text = str(err.value)
    assert "cache.cache_dtype='bfloat16'" in text
    assert "Arc(TM) A770" in text
    assert "use cache.cache_dtype='auto'" in text


def test_model_dtypes_on_arc_a_series() -> None:
    a770 = XpuPlatform.simulate("arc-a770")
    assert a770.supported_model_dtypes() == ("float16", "float32")
    assert resolve("arc-a770").config.model.dtype == "float16"
    with pytest.raises(ConfigError) as err:
        resolve("arc-a770", model=ModelConfig(dtype="bfloat16"))
    text = str(err.value)
    assert "model.dtype='bfloat16'" in text
    assert "Arc(TM) A770" in text
    assert "use model.dtype='float16'" in text


@pytest.mark.parametrize("profile", ["max-1550", "arc-b580"])
def test_bfloat16_elsewhere(profile: str) -> None:
    assert resolve(profile).config.model.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("name", "has_bf16"),
    [
        ("Intel(R) Arc(TM) A770 Graphics", False),
        ("Intel(R) Arc(TM) A380 Graphics", False),
        ("Intel Arc A750", False),
        ("Intel(R) Arc(TM) B580 Graphics", True),
        ("Intel(R) Data Center GPU Flex 170", True),
        ("Intel(R) Arc(TM) Pro B60 Graphics", True),
        ("Intel(R) Arc(TM) Pro A60 Graphics", False),
    ],
)
def test_arc_a_series_is_recognised_by_name(name: str, has_bf16: bool) -> None:
    plat = XpuPlatform([DeviceInfo(name, 16 << 30)], simulated=True)
    assert plat.supports_dtype("bfloat16") is has_bf16


def test_fp8_is_e5m2() -> None:
    torch = pytest.importorskip("torch")
    assert XpuPlatform.simulate("max-1550").fp8_dtype() is torch.float8_e5m2


# -- compilation, graphs and executor --------------------------------------------------


def test_compilation_defaults() -> None:
    res = resolve()
    comp = res.config.compilation
    assert comp.level == 3
    assert comp.cudagraph_mode == CUDAGraphMode.NONE
    assert comp.cudagraph_capture_sizes == []
    assert comp.compile_sizes == []
    assert change(res, "compilation.compile_sizes").source == "platform:xpu"


def test_explicit_compile_sizes_are_kept() -> None:
    res = resolve(compilation=CompilationConfig(compile_sizes=[4, 1]))
    assert sorted(res.config.compilation.compile_sizes) == [1, 4]
    assert not [
        c
        for c in res.changes
        if c.source == "platform:xpu" and c.path == "compilation.compile_sizes"
    ]


def test_device_graphs_are_an_error() -> None:
    with pytest.raises(ConfigError, match=r"compilation\.cudagraph_mode=FULL .*Max 1550.*NONE"):
        resolve(compilation=CompilationConfig(cudagraph_mode="FULL"))


def test_no_graph_wrapper() -> None:
    assert XpuPlatform.simulate("max-1550").graph_wrapper_cls() is None


@pytest.mark.parametrize(("tp", "expected"), [(1, "uni"), (2, "ray"), (4, "ray")])
def test_executor_defaults(tp: int, expected: str) -> None:
    res = resolve(parallel=ParallelConfig(tensor_parallel_size=tp))
    assert res.config.parallel.distributed_executor_backend == expected
    assert change(res, "parallel.distributed_executor_backend").source == "platform:xpu"


@pytest.mark.parametrize("backend", ["mp", "ray", "external_launcher"])
def test_explicit_multi_process_executors_are_kept(backend: str) -> None:
    res = resolve(
        parallel=ParallelConfig(tensor_parallel_size=2, distributed_executor_backend=backend)
    )
    assert res.config.parallel.distributed_executor_backend == backend


def test_uni_with_several_ranks_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(
            parallel=ParallelConfig(pipeline_parallel_size=2, distributed_executor_backend="uni")
        )
    text = str(err.value)
    assert "parallel.distributed_executor_backend='uni'" in text
    assert "parallel.world_size=2" in text
    assert "'ray'" in text


def test_kv_budget_is_device_memory_times_utilisation() -> None:
    plat = XpuPlatform.simulate("max-1550")
    config = EngineConfig(cache=CacheConfig(gpu_memory_utilization=0.5))
    assert plat.kv_cache_budget_bytes(config) == 64 << 30
