"""CacheConfig: fields, validation, derived values and methods."""

from __future__ import annotations

import hashlib
import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from hwplug.core.config import CacheConfig, ParallelConfig
from hwplug.core.errors import ConfigError

GiB = 1 << 30

DEFAULTS: dict[str, Any] = {
    "block_size": None,
    "gpu_memory_utilization": 0.9,
    "swap_space": 4,
    "cache_dtype": "auto",
    "is_attention_free": False,
    "num_gpu_blocks_override": None,
    "sliding_window": None,
    "enable_prefix_caching": None,
    "prefix_caching_hash_algo": "sha256",
    "cpu_offload_gb": 0,
    "calculate_kv_scales": False,
    "cpu_kvcache_space_bytes": None,
    "mamba_page_size_padded": None,
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "kv_sharing_fast_prefill": False,
    "kv_cache_memory_bytes": None,
}
CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")


def test_defaults_match_the_seed() -> None:
    cache = CacheConfig()
    assert {name: getattr(cache, name) for name in DEFAULTS} == DEFAULTS
    assert cache.num_gpu_blocks is None
    assert cache.num_cpu_blocks is None
    assert CacheConfig.init_field_names() == tuple(DEFAULTS)


@pytest.mark.parametrize("name", ["num_gpu_blocks", "num_cpu_blocks"])
def test_block_counts_are_not_constructor_arguments_but_can_be_set(name: str) -> None:
    with pytest.raises(ValueError, match=rf"cache\.{name}: unknown field.*allowed fields"):
        CacheConfig(**{name: 10})  # type: ignore[arg-type]
    cache = CacheConfig()
    setattr(cache, name, 10)
    assert getattr(cache, name) == 10
    with pytest.raises(ValueError, match=name):
        setattr(cache, name, -1)
    assert getattr(cache, name) == 10


@pytest.mark.parametrize("size", [1, 7, 16, 128, 4096])
def test_any_positive_block_size_is_accepted(size: int) -> None:
    assert CacheConfig(block_size=size).block_size == size


@pytest.mark.parametrize("size", [0, -16, True, 1.5, "big"])
def test_bad_block_sizes_are_rejected(size: object) -> None:
    with pytest.raises(ValueError, match="block_size"):
        CacheConfig(block_size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", CACHE_DTYPES)
def test_every_cache_dtype_is_accepted(dtype: str) -> None:
    assert CacheConfig(cache_dtype=dtype).cache_dtype == dtype  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["fp8_e4m3fn", "FP8", "int8", "", "float16"])
def test_unknown_cache_dtype_names_the_allowed_set(dtype: str) -> None:
    with pytest.raises(ValidationError) as info:
        CacheConfig(cache_dtype=dtype)  # type: ignore[arg-type]
    message = str(info.value)
    assert "cache_dtype" in message
    for allowed in CACHE_DTYPES:
        assert f"'{allowed}'" in message


@pytest.mark.parametrize("prefix_caching", [None, False, True])
def test_unknown_hash_algo_is_rejected_whether_or_not_prefix_caching_is_on(
    prefix_caching: bool | None,
) -> None:
    with pytest.raises(ValidationError, match=r"prefix_caching_hash_algo[\s\S]*'sha256_cbor'"):
        CacheConfig(enable_prefix_caching=prefix_caching, prefix_caching_hash_algo="md5")  # type: ignore[arg-type]
    assert CacheConfig(prefix_caching_hash_algo="sha256_cbor").prefix_caching_hash_algo == (
        "sha256_cbor"
    )


@pytest.mark.parametrize("field", ["mamba_cache_dtype", "mamba_ssm_cache_dtype"])
def test_mamba_dtypes(field: str) -> None:
    assert getattr(CacheConfig(**{field: "float32"}), field) == "float32"  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=rf"{field}[\s\S]*'auto' or 'float32'"):
        CacheConfig(**{field: "float16"})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1.0000001, 2, 0, -0.5])
def test_gpu_memory_utilization_must_be_in_0_1(value: float) -> None:
    with pytest.raises(ValidationError, match="gpu_memory_utilization") as info:
        CacheConfig(gpu_memory_utilization=value)
    assert ("less than or equal to 1" in str(info.value)) or ("greater than 0" in str(info.value))


def test_gpu_memory_utilization_of_one_is_allowed() -> None:
    assert CacheConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


@pytest.mark.parametrize(
    "field",
    [
        "cpu_offload_gb",
        "swap_space",
        "num_gpu_blocks_override",
        "cpu_kvcache_space_bytes",
        "kv_cache_memory_bytes",
        "mamba_page_size_padded",
    ],
)
def test_negative_amounts_are_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match=rf"{field}[\s\S]*greater than or equal to 0"):
        CacheConfig(**{field: -1})  # type: ignore[arg-type]
    assert getattr(CacheConfig(**{field: 0}), field) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_rejected(value: float) -> None:
    with pytest.raises(ValidationError, match="swap_space"):
        CacheConfig(swap_space=value)


def test_swap_space_bytes_follows_swap_space() -> None:
    cache = CacheConfig()
    assert cache.swap_space_bytes == 4 * GiB
    cache.swap_space = 2.5
    assert cache.swap_space_bytes == 2.5 * GiB
    with pytest.raises(ValueError, match="read-only"):
        cache.swap_space_bytes = 1  # type: ignore[misc]


def test_compute_hash_is_md5_of_the_seed_factors() -> None:
    cache = CacheConfig(cache_dtype="fp8", mamba_ssm_cache_dtype="float32")
    expected = hashlib.md5(str(["fp8", "auto", "float32"]).encode()).hexdigest()
    assert cache.compute_hash() == expected


def test_compute_hash_ignores_per_rank_knobs() -> None:
    base = CacheConfig().compute_hash()
    assert CacheConfig(gpu_memory_utilization=0.5, swap_space=1, block_size=32).compute_hash() == (
        base
    )
    assert CacheConfig(cache_dtype="bfloat16").compute_hash() != base


def test_metrics_info_has_every_attribute_as_strings() -> None:
    cache = CacheConfig(block_size=16)
    cache.num_gpu_blocks = 100
    info = cache.metrics_info()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in info.items())
    assert set(info) == {*DEFAULTS, "num_gpu_blocks", "num_cpu_blocks", "swap_space_bytes"}
    assert info["block_size"] == "16"
    assert info["num_gpu_blocks"] == "100"
    assert info["num_cpu_blocks"] == "None"
    assert info["swap_space_bytes"] == str(4 * GiB)


@pytest.fixture
def cpu_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(total=100 * GiB))


@pytest.mark.usefixtures("cpu_memory")
def test_swap_space_over_70_percent_of_cpu_memory_is_an_error() -> None:
    cache = CacheConfig(swap_space=36)
    with pytest.raises(ConfigError) as info:
        cache.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=2))
    message = str(info.value)
    assert "cache.swap_space" in message
    assert "72.00 GiB" in message
    assert "100.00 GiB" in message


@pytest.mark.usefixtures("cpu_memory")
def test_swap_space_over_40_percent_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hwplug.config"):
        CacheConfig(swap_space=50).verify_with_parallel_config(ParallelConfig())
    assert any("50.00 GiB" in r.getMessage() and r.name == "hwplug.config" for r in caplog.records)


@pytest.mark.usefixtures("cpu_memory")
def test_modest_swap_space_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hwplug.config"):
        CacheConfig(swap_space=10).verify_with_parallel_config(
            ParallelConfig(tensor_parallel_size=4)
        )
    assert not caplog.records


def test_fp8_cache_logs_an_accuracy_note(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hwplug.config"):
        CacheConfig(cache_dtype="fp8_e5m2")
    assert any("fp8_e5m2" in r.getMessage() for r in caplog.records)


def test_unknown_fields_list_the_allowed_ones() -> None:
    with pytest.raises(ConfigError) as info:
        CacheConfig(blocksize=16)  # type: ignore[call-arg]
    message = str(info.value)
    assert "cache.blocksize" in message
    assert "did you mean 'block_size'" in message
    assert "gpu_memory_utilization" in message
    cache = CacheConfig()
    with pytest.raises(ConfigError, match=r"cache\.blok_size: unknown field"):
        cache.blok_size = 16  # type: ignore[attr-defined]


def test_assignment_is_validated_and_a_rejected_value_is_not_kept() -> None:
    cache = CacheConfig()
    cache.cache_dtype = "fp8"
    assert cache.cache_dtype == "fp8"
    with pytest.raises(ValidationError, match="cache_dtype"):
        cache.cache_dtype = "fp4"  # type: ignore[assignment]
    assert cache.cache_dtype == "fp8"
    cache.block_size = "32"  # type: ignore[assignment]
    assert cache.block_size == 32
