"""The HPU (Intel Gaudi) platform: identity, detection, and every HPU cell of platforms.md."""

from __future__ import annotations

import pytest

from hwplug import ConfigError
from hwplug.core.config import (
    CacheConfig,
    CompilationConfig,
    CUDAGraphMode,
    EngineConfig,
    ModelConfig,
)
from hwplug.platforms.hpu import HpuPlatform
from tests.platforms.fakes import empty_box, habana_box
from tests.platforms.helpers import change, resolver

resolve = resolver("gaudi2")


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("name", "hpu"),
        ("device_type", "hpu"),
        ("dist_backend", "hccl"),
        ("ray_device_key", "HPU"),
        ("device_control_env_var", "HABANA_VISIBLE_MODULES"),
        ("priority", 10),
        ("representative_profile", "gaudi2"),
        ("supports_device_graphs", True),
        ("supports_piecewise_graphs", False),
        ("graphs_need_compilation", False),
        ("default_compilation_level", 0),
        ("max_compilation_level", 2),
        ("fp8_dtype_name", "float8_e4m3fn"),
    ],
)
def test_identity_and_graph_attributes(attribute: str, value: object) -> None:
    assert getattr(HpuPlatform, attribute) == value


def test_profiles_are_the_documented_devices() -> None:
    profiles = HpuPlatform.profiles()
    assert set(profiles) == {"gaudi", "gaudi2", "gaudi3"}
    assert profiles["gaudi2"].total_memory == 96 << 30
    assert HpuPlatform.simulate("gaudi3").is_hpu()


# -- detection -------------------------------------------------------------------------


def test_detect_finds_gaudi2_cards(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(habana_box(tmp_path, count=8)))
    monkeypatch.delenv("HABANA_VISIBLE_MODULES", raising=False)
    devices = HpuPlatform.detect()
    assert len(devices) == 8
    assert {d.arch for d in devices} == {"gaudi2"}
    assert "fp8_inc" in HpuPlatform(devices).supported_cache_dtypes()


def test_detect_honours_habana_visible_modules(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(habana_box(tmp_path, count=8)))
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1,2")
    assert len(HpuPlatform.detect()) == 3


def test_detect_first_generation_gaudi(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(habana_box(tmp_path, count=2, device=0x1000)))
    monkeypatch.delenv("HABANA_VISIBLE_MODULES", raising=False)
    devices = HpuPlatform.detect()
    assert [d.arch for d in devices] == ["gaudi", "gaudi"]
    assert "fp8_inc" not in HpuPlatform(devices).supported_cache_dtypes()


def test_detect_finds_nothing_without_gaudi(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(empty_box(tmp_path)))
    assert HpuPlatform.detect() == []


# -- block sizes -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["gaudi", "gaudi2", "gaudi3"])
def test_default_block_size_is_128(profile: str) -> None:
    res = resolve(profile)
    assert res.config.cache.block_size == 128
    assert change(res, "cache.block_size").source == "platform:hpu"


def test_allowed_block_sizes() -> None:
    assert HpuPlatform.simulate("gaudi2").supported_block_sizes() == (128, 256)
    assert resolve(cache=CacheConfig(block_size=256)).config.cache.block_size == 256
    with pytest.raises(ConfigError) as err:
        resolve(cache=CacheConfig(block_size=16))
    text = str(err.value)
    assert "cache.block_size=16" in text
    assert "Intel Gaudi 2" in text
    assert "128, 256" in text


# -- cache dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("gaudi", ("auto", "bfloat16")),
        ("gaudi2", ("auto", "bfloat16", "fp8_inc")),
        ("gaudi3", ("auto", "bfloat16", "fp8_inc")),
    ],
)
def test_cache_dtypes(profile: str, expected: tuple[str, ...]) -> None:
    assert HpuPlatform.simulate(profile).supported_cache_dtypes() == expected


def test_fp8_inc_resolves_on_gaudi2() -> None:
    assert resolve(cache=CacheConfig(cache_dtype="fp8_inc")).config.cache.cache_dtype == "fp8_inc"


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_plain_fp8_suggests_fp8_inc_on_gaudi2(cache_dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("gaudi2", cache=CacheConfig(cache_dtype=cache_dtype))
    text = str(err.value)
    assert f"cache.cache_dtype={cache_dtype!r}" in text
    assert "Intel Gaudi 2" in text
    assert "use cache.cache_dtype='fp8_inc'" in text


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_plain_fp8_on_first_generation_suggests_auto_or_bfloat16(cache_dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("gaudi", cache=CacheConfig(cache_dtype=cache_dtype))
    text = str(err.value)
    assert "fp8_inc" in text
    assert "Gaudi2" in text
    assert "use cache.cache_dtype='auto' or 'bfloat16'" in text


def test_fp8_inc_on_first_generation_needs_gaudi2() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("gaudi", cache=CacheConfig(cache_dtype="fp8_inc"))
    text = str(err.value)
    assert "cache.cache_dtype='fp8_inc'" in text
    assert "Intel Gaudi" in text
    assert "needs Gaudi2 or later" in text
    assert "'auto' or 'bfloat16'" in text


def test_fp8_dtype_is_the_fp8_inc_storage_type() -> None:
    torch = pytest.importorskip("torch")
    plat = HpuPlatform.simulate("gaudi2")
    assert plat.fp8_dtype() is torch.float8_e4m3fn
    assert not plat.is_fp8_fnuz()


# -- model dtypes ----------------------------------------------------------------------


def test_auto_dtype_is_bfloat16() -> None:
    res = resolve()
    assert res.config.model.dtype == "bfloat16"
    assert HpuPlatform.simulate("gaudi3").supported_model_dtypes() == ("bfloat16",)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_other_model_dtypes_are_errors(dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(model=ModelConfig(dtype=dtype))
    text = str(err.value)
    assert f"model.dtype={dtype!r}" in text
    assert "Intel Gaudi 2" in text
    assert "use model.dtype='bfloat16'" in text


# -- compilation and graphs ------------------------------------------------------------


def test_defaults_are_no_compilation_with_full_hpu_graphs() -> None:
    res = resolve()
    comp = res.config.compilation
    assert comp.level == 0
    assert comp.cudagraph_mode == CUDAGraphMode.FULL
    assert comp.cudagraph_capture_sizes
    assert comp.custom_ops == ["all"]
    assert comp.backend == ""
    assert change(res, "compilation.custom_ops").source == "platform:hpu"
    assert change(res, "compilation.cudagraph_mode").source == "engine"


@pytest.mark.parametrize("level", [1, 2])
def test_hpu_backend_at_levels_1_and_2(level: int) -> None:
    res = resolve(compilation=CompilationConfig(level=level))
    assert res.config.compilation.backend == "hpu_backend"
    assert change(res, "compilation.backend").source == "platform:hpu"
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.FULL


def test_explicit_backend_and_custom_ops_are_kept() -> None:
    comp = CompilationConfig(level=2, backend="eager", custom_ops=["-rms_norm"])
    res = resolve(compilation=comp)
    assert res.config.compilation.backend == "eager"
    assert res.config.compilation.custom_ops == ["-rms_norm"]


def test_explicit_piecewise_level_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        resolve(compilation=CompilationConfig(level=3))
    text = str(err.value)
    assert "compilation.level=3" in text
    assert "Intel Gaudi 2" in text
    assert "0, 1 or 2" in text


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_explicit_piecewise_graph_modes_are_errors(mode: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(compilation=CompilationConfig(cudagraph_mode=mode))
    text = str(err.value)
    assert f"compilation.cudagraph_mode={mode}" in text
    assert "Intel Gaudi 2" in text
    assert "FULL" in text


@pytest.mark.parametrize("mode", ["FULL", "NONE", "FULL_DECODE_ONLY"])
def test_whole_forward_graph_modes_are_kept(mode: str) -> None:
    res = resolve(compilation=CompilationConfig(cudagraph_mode=mode))
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode[mode]


def test_enforce_eager_turns_graphs_off() -> None:
    res = resolve(model=ModelConfig(enforce_eager=True))
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.NONE
    assert res.config.compilation.cudagraph_capture_sizes == []


def test_graph_wrapper_is_the_hpu_graph_wrapper() -> None:
    from hwplug.platforms.hpu.graphs import HPUGraphWrapper

    assert HpuPlatform.simulate("gaudi2").graph_wrapper_cls() is HPUGraphWrapper


def test_executor_is_kept_as_given() -> None:
    assert resolve().config.parallel.distributed_executor_backend is None


def test_kv_budget_is_device_memory_times_utilisation() -> None:
    plat = HpuPlatform.simulate("gaudi3")
    config = EngineConfig(cache=CacheConfig(gpu_memory_utilization=0.5))
    assert plat.kv_cache_budget_bytes(config) == 64 << 30
