"""The ROCm platform: identity, detection, and every ROCm cell of platforms.md."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug import ConfigError
from hwplug.core.config import CacheConfig, CUDAGraphMode, EngineConfig, ModelConfig
from hwplug.core.platform import DeviceCapability, DeviceInfo
from hwplug.platforms.rocm import RocmPlatform
from hwplug.platforms.rocm.gfx import gfx_capability, gfx_version
from tests.platforms.fakes import amd_box, empty_box
from tests.platforms.helpers import resolver

resolve = resolver()

ROCM_PROFILES = ("mi300x", "mi325x", "mi355x", "mi250x", "rx7900xtx")


def device(arch: str, name: str = "AMD GPU") -> RocmPlatform:
    """A simulated device of ``arch`` that has no profile (older or newer parts)."""
    info = DeviceInfo(name, 32 << 30, arch=arch, vendor="AMD")
    return RocmPlatform([info], simulated=True, profile=arch)


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("name", "rocm"),
        ("device_type", "cuda"),
        ("dist_backend", "nccl"),
        ("ray_device_key", "GPU"),
        ("device_control_env_var", "HIP_VISIBLE_DEVICES"),
        ("priority", 10),
        ("vendor", "AMD"),
        ("representative_profile", "mi300x"),
        ("supports_device_graphs", True),
        ("supports_piecewise_graphs", True),
        ("graphs_need_compilation", True),
        ("default_compilation_level", 3),
    ],
)
def test_identity_and_graph_attributes(attribute: str, value: object) -> None:
    assert getattr(RocmPlatform, attribute) == value


def test_identity_helpers() -> None:
    plat = RocmPlatform.simulate("mi300x")
    assert plat.is_rocm()
    assert plat.is_cuda_alike()
    assert not plat.is_cuda()


def test_profiles_are_the_documented_devices() -> None:
    profiles = RocmPlatform.profiles()
    assert set(profiles) == set(ROCM_PROFILES)
    assert profiles["mi300x"].arch == "gfx942"
    assert profiles["mi355x"].arch == "gfx950"
    assert profiles["mi250x"].arch == "gfx90a"
    assert profiles["rx7900xtx"].arch == "gfx1100"


# -- detection -------------------------------------------------------------------------


def test_detect_reads_the_kfd_topology(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(amd_box(tmp_path, count=4)))
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    devices = RocmPlatform.detect()
    assert len(devices) == 4
    assert {d.arch for d in devices} == {"gfx942"}
    plat = RocmPlatform(devices)
    assert plat.fp8_dtype_name == "float8_e4m3fnuz"
    assert plat.get_device_capability() == DeviceCapability(9, 4)


def test_detect_honours_hip_visible_devices(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(amd_box(tmp_path, count=4)))
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")
    assert len(RocmPlatform.detect()) == 1


def test_detect_finds_nothing_without_amd_gpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(empty_box(tmp_path)))
    assert RocmPlatform.detect() == []


# -- gfx arch parsing ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "version"),
    [
        ("gfx90a", (9, 0, 10)),
        ("gfx942", (9, 4, 2)),
        ("gfx950", (9, 5, 0)),
        ("gfx1100", (11, 0, 0)),
        ("gfx1201", (12, 0, 1)),
        ("gfx942:sramecc+:xnack-", (9, 4, 2)),
        ("GFX908", (9, 0, 8)),
        ("sm_90", None),
        ("", None),
        (None, None),
    ],
)
def test_gfx_version(arch: str | None, version: tuple[int, int, int] | None) -> None:
    assert gfx_version(arch) == version


@given(major=st.integers(9, 12), minor=st.integers(0, 15), step=st.integers(0, 15))
def test_gfx_version_round_trips(major: int, minor: int, step: int) -> None:
    arch = f"gfx{major}{minor:x}{step:x}"
    assert gfx_version(arch) == (major, minor, step)
    assert gfx_capability(arch) == DeviceCapability(major, minor)


# -- block sizes -----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ROCM_PROFILES)
def test_default_block_size_is_16(profile: str) -> None:
    res = resolve(profile)
    assert res.config.cache.block_size == 16
    assert res.changes_to("cache.block_size")[0].source == "platform:rocm"
    assert resolve(profile, model=ModelConfig(use_mla=True)).config.cache.block_size == 16


def test_allowed_block_sizes() -> None:
    plat = RocmPlatform.simulate("mi300x")
    assert plat.supported_block_sizes() == (16, 32)
    assert plat.supported_block_sizes(ModelConfig(use_mla=True)) == (1, 16, 32)


def test_block_size_1_only_for_mla() -> None:
    res = resolve("mi300x", model=ModelConfig(use_mla=True), cache=CacheConfig(block_size=1))
    assert res.config.cache.block_size == 1
    with pytest.raises(ConfigError) as err:
        resolve("mi300x", cache=CacheConfig(block_size=1))
    text = str(err.value)
    assert "cache.block_size=1" in text
    assert "AMD Instinct MI300X" in text
    assert "16, 32" in text


@settings(max_examples=30, deadline=None)
@given(block_size=st.sampled_from([1, 8, 16, 32, 64, 128]), use_mla=st.booleans())
def test_block_size_resolves_exactly_when_allowed(block_size: int, use_mla: bool) -> None:
    allowed = (1, 16, 32) if use_mla else (16, 32)
    sections = {"cache": CacheConfig(block_size=block_size), "model": ModelConfig(use_mla=use_mla)}
    if block_size in allowed:
        assert resolve("mi355x", **sections).config.cache.block_size == block_size
    else:
        with pytest.raises(ConfigError, match=rf"cache\.block_size={block_size}\b"):
            resolve("mi355x", **sections)


# -- cache dtypes and fp8 --------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("mi300x", ("auto", "bfloat16", "fp8", "fp8_e4m3")),
        ("mi325x", ("auto", "bfloat16", "fp8", "fp8_e4m3")),
        ("mi355x", ("auto", "bfloat16", "fp8", "fp8_e4m3")),
        ("mi250x", ("auto", "bfloat16")),
        ("rx7900xtx", ("auto", "bfloat16")),
    ],
)
def test_cache_dtypes_follow_the_gfx_arch(profile: str, expected: tuple[str, ...]) -> None:
    assert RocmPlatform.simulate(profile).supported_cache_dtypes() == expected


def test_rdna4_has_fp8() -> None:
    plat = device("gfx1201", "AMD Radeon RX 9070 XT")
    assert "fp8" in plat.supported_cache_dtypes()
    assert plat.fp8_dtype_name == "float8_e4m3fn"


@pytest.mark.parametrize(
    ("profile", "dtype_name", "fnuz"),
    [
        ("mi300x", "float8_e4m3fnuz", True),
        ("mi325x", "float8_e4m3fnuz", True),
        ("mi355x", "float8_e4m3fn", False),
        ("rx7900xtx", "float8_e4m3fn", False),
    ],
)
def test_fp8_dtype_depends_on_the_arch(profile: str, dtype_name: str, fnuz: bool) -> None:
    plat = RocmPlatform.simulate(profile)
    assert plat.fp8_dtype_name == dtype_name
    assert plat.is_fp8_fnuz() is fnuz


def test_fp8_dtype_is_the_torch_dtype() -> None:
    torch = pytest.importorskip("torch")
    assert RocmPlatform.simulate("mi300x").fp8_dtype() is torch.float8_e4m3fnuz
    assert RocmPlatform.simulate("mi355x").fp8_dtype() is torch.float8_e4m3fn


def test_e5m2_suggests_e4m3() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("mi300x", cache=CacheConfig(cache_dtype="fp8_e5m2"))
    text = str(err.value)
    assert "cache.cache_dtype='fp8_e5m2'" in text
    assert "AMD Instinct MI300X" in text
    assert "use cache.cache_dtype='fp8_e4m3'" in text


@pytest.mark.parametrize("cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_before_mi300_suggests_auto_or_bfloat16(cache_dtype: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve("mi250x", cache=CacheConfig(cache_dtype=cache_dtype))
    text = str(err.value)
    assert f"cache.cache_dtype={cache_dtype!r}" in text
    assert "AMD Instinct MI250X" in text
    assert "gfx90a" in text
    assert "use cache.cache_dtype='auto' or 'bfloat16'" in text


def test_fp8_inc_is_the_gaudi_format() -> None:
    with pytest.raises(ConfigError, match=r"Intel Gaudi \(HPU\) format.*fp8_e4m3"):
        resolve("mi355x", cache=CacheConfig(cache_dtype="fp8_inc"))


@pytest.mark.parametrize("profile", ["mi300x", "mi355x"])
def test_fp8_resolves_on_mi300_and_later(profile: str) -> None:
    res = resolve(profile, cache=CacheConfig(cache_dtype="fp8"))
    assert res.config.cache.cache_dtype == "fp8"


# -- model dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ROCM_PROFILES)
def test_bfloat16_on_gfx90a_and_later(profile: str) -> None:
    res = resolve(profile)
    assert res.config.model.dtype == "bfloat16"


def test_no_bfloat16_before_gfx90a() -> None:
    mi100 = device("gfx908", "AMD Instinct MI100")
    assert mi100.supported_model_dtypes() == ("float16", "float32")
    assert resolve(mi100).config.model.dtype == "float16"
    with pytest.raises(ConfigError) as err:
        resolve(mi100, model=ModelConfig(dtype="bfloat16"))
    text = str(err.value)
    assert "model.dtype='bfloat16'" in text
    assert "gfx908" in text
    assert "use model.dtype='float16'" in text
    with pytest.raises(ConfigError, match=r"cache\.cache_dtype='bfloat16'.*gfx908"):
        resolve(mi100, cache=CacheConfig(cache_dtype="bfloat16"))


def test_capability_comes_from_the_arch_when_the_profile_has_none() -> None:
    assert device("gfx1201").get_device_capability() == DeviceCapability(12, 0)
    assert RocmPlatform.simulate("mi300x").get_device_capability() == DeviceCapability(9, 4)


# -- graphs and memory -----------------------------------------------------------------


def test_default_is_piecewise_with_hip_graphs() -> None:
    res = resolve("mi300x")
    assert res.config.compilation.level == 3
    assert res.config.compilation.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE


def test_graph_wrapper_is_the_cuda_graph_wrapper() -> None:
    from hwplug.platforms.cuda_graphs import CUDAGraphWrapper

    assert RocmPlatform.simulate("mi300x").graph_wrapper_cls() is CUDAGraphWrapper


def test_kv_budget_is_device_memory_times_utilisation() -> None:
    plat = RocmPlatform.simulate("mi300x")
    config = EngineConfig(cache=CacheConfig(gpu_memory_utilization=0.25))
    assert plat.kv_cache_budget_bytes(config) == (192 << 30) // 4
