"""KV-cache dtypes, page sizes, block budgets and prefix-cache block hashes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.core.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig
from hwplug.core.errors import ConfigError
from hwplug.core.kv_cache import (
    STR_DTYPE_TO_TORCH_DTYPE,
    KVCacheSpec,
    cache_dtype_to_torch,
    hash_block_tokens,
    hash_function,
    needs_memory_profile,
    num_blocks,
)
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.platforms.cpu import CpuPlatform
from hwplug.platforms.cuda import CudaPlatform
from hwplug.platforms.hpu import HpuPlatform
from hwplug.platforms.rocm import RocmPlatform

GiB = 1 << 30
MiB = 1 << 20


class TinyPlatform(Platform):
    """A vendor platform that overrides nothing about memory: the base-class rules."""

    name = "tiny"
    device_type = "cpu"


def tiny(total_memory: int = 10 * GiB) -> TinyPlatform:
    return TinyPlatform([DeviceInfo("Tiny NPU", total_memory=total_memory)], simulated=True)


def engine(
    *, model: dict[str, Any] | None = None, cache: dict[str, Any] | None = None, tp: int = 1
) -> EngineConfig:
    cache_fields: dict[str, Any] = {"block_size": 16, **(cache or {})}
    return EngineConfig(
        model=ModelConfig(**(model or {})),
        cache=CacheConfig(**cache_fields),
        parallel=ParallelConfig(tensor_parallel_size=tp),
    )


# -- cache dtypes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "cache_dtype", "expected"),
    [
        ("h100", "fp8", torch.float8_e4m3fn),
        ("h100", "fp8_e4m3", torch.float8_e4m3fn),
        ("h100", "fp8_e5m2", torch.float8_e5m2),
        ("h100", "bfloat16", torch.bfloat16),
        ("mi300x", "fp8", torch.float8_e4m3fnuz),
        ("mi300x", "fp8_e4m3", torch.float8_e4m3fnuz),
        ("mi355x", "fp8", torch.float8_e4m3fn),
        ("mi355x", "fp8_e4m3", torch.float8_e4m3fn),
        ("cpu-generic", "fp8", torch.float8_e5m2),
        ("gaudi2", "fp8_inc", torch.float8_e4m3fn),
    ],
)
def test_cache_dtype_strings_map_per_platform(
    profile: str, cache_dtype: str, expected: torch.dtype
) -> None:
    platform = next(
        cls.simulate(profile)
        for cls in (CudaPlatform, RocmPlatform, CpuPlatform, HpuPlatform)
        if profile in cls.profiles()
    )
    assert cache_dtype_to_torch(cache_dtype, "bfloat16", platform) == expected


def test_auto_follows_the_model_dtype() -> None:
    h100 = CudaPlatform.simulate("h100")
    assert cache_dtype_to_torch("auto", "float16", h100) == torch.float16
    assert cache_dtype_to_torch("auto", torch.float32, h100) == torch.float32
    assert cache_dtype_to_torch("auto", "bf16", h100) == torch.bfloat16
    # "auto" model dtype: the platform's first choice (no bfloat16 on a T4)
    assert cache_dtype_to_torch("auto", "auto", h100) == torch.bfloat16
    assert cache_dtype_to_torch("auto", "auto", CudaPlatform.simulate("t4")) == torch.float16


def test_cache_dtype_errors_say_what_works() -> None:
    h100 = CudaPlatform.simulate("h100")
    with pytest.raises(ConfigError, match=r"'fp8_inc' is the Intel Gaudi \(HPU\) format"):
        cache_dtype_to_torch("fp8_inc", "auto", h100)
    with pytest.raises(ConfigError, match=r"cache.cache_dtype='fp8' .* use fp8_inc"):
        cache_dtype_to_torch("fp8", "auto", HpuPlatform.simulate("gaudi3"))
    with pytest.raises(ConfigError, match=r"cache.cache_dtype='int8' .*auto, bfloat16, fp8"):
        cache_dtype_to_torch("int8", "auto", h100)
    with pytest.raises(ConfigError, match=r"model.dtype='int4' is not a model dtype"):
        cache_dtype_to_torch("auto", "int4", h100)
    with pytest.raises(ConfigError, match=r"model.dtype=torch.int8 cannot be a KV-cache dtype"):
        cache_dtype_to_torch("auto", torch.int8, h100)


def test_str_dtype_table() -> None:
    assert STR_DTYPE_TO_TORCH_DTYPE["half"] == torch.float16
    assert STR_DTYPE_TO_TORCH_DTYPE["bfloat16"] == torch.bfloat16
    assert STR_DTYPE_TO_TORCH_DTYPE["float"] == torch.float32
    assert {"float16", "bfloat16", "float32"} <= set(STR_DTYPE_TO_TORCH_DTYPE)
    assert "fp8" not in STR_DTYPE_TO_TORCH_DTYPE  # platform-dependent: cache_dtype_to_torch


def test_module_import_does_not_import_torch() -> None:
    script = (
        "import sys; import hwplug.core.kv_cache as k; "
        "k.hash_block_tokens(k.hash_function('sha256_cbor'), None, [1]); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- KVCacheSpec -------------------------------------------------------------------------


def test_page_size_counts_k_and_v_of_one_block_in_one_layer() -> None:
    spec = KVCacheSpec(32, 8, 128, 16, torch.bfloat16)
    assert spec.page_size_bytes == 2 * 16 * 8 * 128 * 2 == 65536
    assert spec.bytes_per_block == 32 * 65536
    fp8 = KVCacheSpec(32, 8, 128, 16, "float8_e4m3fn")
    assert fp8.dtype == torch.float8_e4m3fn
    assert fp8.page_size_bytes == spec.page_size_bytes // 2
    assert KVCacheSpec(1, 1, 1, 1, "torch.float32").page_size_bytes == 8


def test_mla_page_holds_one_latent_per_token() -> None:
    spec = KVCacheSpec(61, 1, 512 + 64, 64, torch.bfloat16, use_mla=True)
    assert spec.page_size_bytes == 64 * (512 + 64) * 2
    assert spec.bytes_per_block == 61 * spec.page_size_bytes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_layers": 0}, r"KVCacheSpec.num_layers must be a positive integer; got 0"),
        ({"block_size": 16.0}, r"KVCacheSpec.block_size must be a positive integer"),
        ({"num_kv_heads": True}, r"KVCacheSpec.num_kv_heads must be a positive integer"),
        ({"dtype": "fp8"}, r"KVCacheSpec.dtype must be a floating-point torch.dtype"),
        ({"dtype": torch.int8}, r"KVCacheSpec.dtype must be"),
        ({"sliding_window": 0}, r"KVCacheSpec.sliding_window must be a positive integer"),
        ({"use_mla": True}, r"num_kv_heads must be 1 with use_mla=True"),
    ],
)
def test_spec_validation(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {
        "num_layers": 2,
        "num_kv_heads": 4,
        "head_size": 64,
        "block_size": 16,
        "dtype": torch.float16,
    }
    fields.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        KVCacheSpec(**fields)


def test_spec_is_frozen() -> None:
    spec = KVCacheSpec(1, 1, 8, 16, torch.float16)
    with pytest.raises(AttributeError):
        spec.block_size = 32


def test_from_config_splits_heads_across_tensor_parallel_ranks() -> None:
    h100 = CudaPlatform.simulate("h100")
    model = {"num_layers": 4, "num_kv_heads": 8, "num_attention_heads": 32, "head_size": 128}
    base = KVCacheSpec.from_config(engine(model=model, cache={"cache_dtype": "fp8"}), h100)
    assert base == KVCacheSpec(4, 8, 128, 16, torch.float8_e4m3fn)
    assert KVCacheSpec.from_config(engine(model=model, tp=4), h100).num_kv_heads == 2
    # more ranks than KV heads: each rank keeps (a replica of) one head
    assert KVCacheSpec.from_config(engine(model=model, tp=16), h100).num_kv_heads == 1


def test_from_config_for_mla_models_is_not_split() -> None:
    config = engine(
        model={"use_mla": True, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_layers": 3},
        cache={"block_size": 64},
        tp=8,
    )
    spec = KVCacheSpec.from_config(config, CudaPlatform.simulate("h100"))
    assert spec.use_mla
    assert (spec.num_kv_heads, spec.head_size) == (1, 576)
    assert spec.page_size_bytes == 64 * 576 * 2  # bfloat16: the model dtype on an H100


def test_from_config_of_an_unresolved_config_takes_the_platform_default_block() -> None:
    config = EngineConfig()
    assert KVCacheSpec.from_config(config, CudaPlatform.simulate("h100")).block_size == 16
    mla = EngineConfig(model=ModelConfig(use_mla=True))
    assert KVCacheSpec.from_config(mla, CudaPlatform.simulate("h100")).block_size == 64
    assert KVCacheSpec.from_config(mla, CudaPlatform.simulate("b200")).block_size == 128


def test_from_config_of_an_attention_free_model() -> None:
    config = engine(model={"is_attention_free": True})
    with pytest.raises(ConfigError, match=r"model.is_attention_free=True.*no KV cache"):
        KVCacheSpec.from_config(config, CudaPlatform.simulate("h100"))
    assert num_blocks(config, CudaPlatform.simulate("h100")) == 0


# -- block budgets ---------------------------------------------------------------------


def small_model(**extra: Any) -> dict[str, Any]:
    """2 layers x 2 KV heads x 64: one bfloat16 block of 16 tokens is 16 KiB."""
    return {
        "num_layers": 2,
        "num_kv_heads": 2,
        "num_attention_heads": 4,
        "head_size": 64,
        "max_model_len": 1024,
        "dtype": "bfloat16",
        **extra,
    }


def test_budget_is_utilisation_times_device_memory_minus_used_bytes() -> None:
    config = engine(model=small_model(), cache={"gpu_memory_utilization": 0.5})
    block = KVCacheSpec.from_config(config, tiny()).bytes_per_block
    assert block == 2 * (2 * 16 * 2 * 64 * 2)
    assert num_blocks(config, tiny()) == (5 * GiB) // block
    assert num_blocks(config, tiny(), used_bytes=GiB) == (4 * GiB) // block


def test_explicit_memory_bytes_beat_the_utilisation_on_any_platform() -> None:
    config = engine(model=small_model(), cache={"kv_cache_memory_bytes": 64 * MiB})
    block = 16 * 1024
    assert num_blocks(config, tiny()) == 64 * MiB // block
    assert num_blocks(config, CudaPlatform.simulate("h100"), used_bytes=GiB) == 64 * MiB // block
    cpu_config = engine(
        model=small_model(),
        cache={"kv_cache_memory_bytes": 64 * MiB, "cpu_kvcache_space_bytes": GiB},
    )
    assert num_blocks(cpu_config, CpuPlatform.simulate("cpu-generic")) == 64 * MiB // block


def test_block_override_wins_unchecked() -> None:
    config = engine(
        model=small_model(max_model_len=8192),
        cache={"num_gpu_blocks_override": 3, "kv_cache_memory_bytes": 1},
    )
    assert num_blocks(config, tiny()) == 3  # far below one sequence, and that is fine
    config = engine(cache={"num_gpu_blocks_override": 10**9})
    assert num_blocks(config, tiny(total_memory=GiB)) == 10**9


def test_cpu_budget_is_the_cpu_kvcache_space(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = CpuPlatform.simulate("cpu-generic")
    config = engine(model=small_model(), cache={"cpu_kvcache_space_bytes": 32 * MiB})
    assert num_blocks(config, cpu, used_bytes=8 * GiB) == 32 * MiB // (16 * 1024)
    monkeypatch.setenv("HWPLUG_CPU_KVCACHE_SPACE", "0.5")
    assert num_blocks(engine(model=small_model()), cpu) == (GiB // 2) // (16 * 1024)


@pytest.mark.parametrize(
    "cache",
    [
        {},
        {"gpu_memory_utilization": 0.5},
        {"kv_cache_memory_bytes": 64 * MiB},
        {"num_gpu_blocks_override": 100},
        {"cpu_kvcache_space_bytes": 64 * MiB},
    ],
    ids=["defaults", "utilisation", "memory-bytes", "override", "cpu-space"],
)
@pytest.mark.parametrize("platform", ["tiny", "h100", "cpu-generic"])
def test_a_memory_profile_is_needed_exactly_when_memory_in_use_changes_the_blocks(
    cache: dict[str, Any], platform: str
) -> None:
    plat = {
        "tiny": tiny,
        "h100": lambda: CudaPlatform.simulate("h100"),
        "cpu-generic": lambda: CpuPlatform.simulate("cpu-generic"),
    }[platform]()
    config = engine(model=small_model(), cache=cache)
    changes = num_blocks(config, plat) != num_blocks(config, plat, used_bytes=GiB)
    assert needs_memory_profile(config, plat) is changes
    assert needs_memory_profile(config, plat) is (
        platform != "cpu-generic"
        and "kv_cache_memory_bytes" not in cache
        and "num_gpu_blocks_override" not in cache
    )


def test_an_attention_free_model_needs_no_memory_profile() -> None:
    config = engine(model={**small_model(), "is_attention_free": True})
    assert not needs_memory_profile(config, tiny())
    assert num_blocks(config, tiny()) == 0


def test_a_budget_below_one_sequence_says_what_is_needed_and_what_there_is() -> None:
    # 1024 tokens = 64 blocks of 16 KiB = 1 MiB needed; 0.5 MiB given
    config = engine(model=small_model(), cache={"kv_cache_memory_bytes": MiB // 2})
    with pytest.raises(ConfigError) as info:
        num_blocks(config, tiny())
    message = str(info.value)
    assert "model.max_model_len=1024" in message
    assert "64 blocks of 16 tokens = 0.00 GiB (1048576 bytes)" in message
    assert "there is 0.00 GiB (524288 bytes) (cache.kv_cache_memory_bytes)" in message
    assert "raise cache.kv_cache_memory_bytes" in message


def test_device_budget_error_names_utilisation_and_memory() -> None:
    config = engine(model=small_model(), cache={"gpu_memory_utilization": 0.1})
    with pytest.raises(ConfigError, match=r"0\.00 GiB \(0 bytes\).*gpu_memory_utilization=0\.1"):
        num_blocks(config, tiny(), used_bytes=2 * GiB)  # 1 GiB budget, 2 GiB already used
    with pytest.raises(ConfigError, match=r"H100 80GB HBM3.*cannot hold one sequence"):
        num_blocks(engine(model=small_model(max_model_len=10**8)), CudaPlatform.simulate("h100"))


def test_sliding_window_needs_the_window_plus_one_step() -> None:
    # 1 MiB for a full 1024-token sequence; a 256-token window with steps of at most
    # 16 tokens needs min(1024, 255 + 16) = 271 tokens = 17 blocks, plus one block
    budget = {"kv_cache_memory_bytes": 18 * 16 * 1024}
    with pytest.raises(ConfigError):
        num_blocks(engine(model=small_model(), cache=budget), tiny())
    config = engine(model=small_model(sliding_window=256), cache=budget)
    config.scheduler.max_num_batched_tokens = 16
    assert num_blocks(config, tiny()) == 18
    config.scheduler.max_num_batched_tokens = 18  # 273 tokens: one block more
    with pytest.raises(ConfigError, match=r"sliding window 256 - 1 \+ scheduler"):
        num_blocks(config, tiny())
    spec = KVCacheSpec.from_config(config, tiny())
    assert spec.tokens_per_sequence(1024, 16) == 271
    assert spec.blocks_per_sequence(1024, 16) == 18
    assert spec.tokens_per_sequence(100, 16) == 100
    assert spec.blocks_per_sequence(1024, 8192) == 65  # a long step: the whole sequence


def test_used_bytes_must_be_a_non_negative_integer() -> None:
    with pytest.raises(ValueError, match=r"used_bytes must be a non-negative integer; got -1"):
        num_blocks(engine(model=small_model()), tiny(), used_bytes=-1)


def test_resolved_config_on_simulated_devices() -> None:
    import hwplug

    for platform in (CudaPlatform.simulate("h100"), RocmPlatform.simulate("mi300x")):
        config = hwplug.resolve(
            EngineConfig(model=ModelConfig(**small_model())), platform=platform
        ).config
        spec = KVCacheSpec.from_config(config, platform)
        expected = int(0.9 * platform.get_device_total_memory()) // spec.bytes_per_block
        assert num_blocks(config, platform) == expected


# -- prefix-cache block hashes -------------------------------------------------------------


def test_sha256_is_pickle_then_sha256() -> None:
    import pickle

    fn = hash_function("sha256")
    obj = (None, (1, 2, 3), None)
    assert fn(obj) == hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def test_sha256_cbor_is_canonical_cbor_then_sha256() -> None:
    fn = hash_function("sha256_cbor")
    # (None, (1, 2, 3, 4), ("lora", 7)) in CBOR, encoded by hand
    encoded = b"\x83\xf6\x84\x01\x02\x03\x04\x82\x64lora\x07"
    assert fn((None, (1, 2, 3, 4), ("lora", 7))) == hashlib.sha256(encoded).digest()
    # canonical: dict key order does not matter
    assert fn({"b": 1, "a": 2}) == fn({"a": 2, "b": 1})


def test_sha256_cbor_is_identical_across_processes_and_hash_seeds() -> None:
    script = textwrap.dedent(
        """
        from hwplug.core.kv_cache import hash_block_tokens, hash_function
        fn = hash_function("sha256_cbor")
        first = hash_block_tokens(fn, None, range(16), ("salt", {"b": 1, "a": 2}))
        print(hash_block_tokens(fn, first, [7] * 16).hex())
        """
    )
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1
    fn = hash_function("sha256_cbor")
    first = hash_block_tokens(fn, None, range(16), ("salt", {"b": 1, "a": 2}))
    assert digests == {hash_block_tokens(fn, first, [7] * 16).hex()}


def test_unknown_algorithm_lists_both() -> None:
    with pytest.raises(ConfigError, match=r"'md5' .* use one of: sha256, sha256_cbor"):
        hash_function("md5")


def test_unencodable_values_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"sha256_cbor hashes only CBOR-encodable values"):
        hash_function("sha256_cbor")(object())
    with pytest.raises(ValueError, match=r"token_ids must be integers"):
        hash_block_tokens(hash_function("sha256"), None, [1.5])
    with pytest.raises(ValueError, match=r"extra_keys must be a tuple"):
        hash_block_tokens(hash_function("sha256"), None, [1], extra_keys="lora")


def test_block_hash_covers_parent_tokens_and_extra_keys() -> None:
    fn = hash_function("sha256_cbor")
    first = hash_block_tokens(fn, None, [1, 2, 3, 4])
    assert first == fn((None, (1, 2, 3, 4), None))
    assert hash_block_tokens(fn, None, (1, 2, 3, 4)) == first  # any iterable of ints
    second = hash_block_tokens(fn, first, [5, 6, 7, 8])
    assert second != hash_block_tokens(fn, None, [5, 6, 7, 8])
    assert second != hash_block_tokens(fn, first, [5, 6, 7, 9])
    assert hash_block_tokens(fn, first, [5, 6, 7, 8], ["lora-1"]) != second
    assert hash_block_tokens(fn, first, [5, 6, 7, 8], ["lora-1"]) == hash_block_tokens(
        fn, first, [5, 6, 7, 8], ("lora-1",)
    )


def chain(fn: Any, tokens: list[int], block: int) -> list[bytes]:
    hashes: list[bytes] = []
    parent = None
    for start in range(0, len(tokens) - block + 1, block):
        parent = hash_block_tokens(fn, parent, tokens[start : start + block])
        hashes.append(parent)
    return hashes


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(0, 3), max_size=24),
    b=st.lists(st.integers(0, 3), max_size=24),
    algo=st.sampled_from(["sha256", "sha256_cbor"]),
)
def test_chained_hashes_agree_exactly_on_shared_prefixes(
    a: list[int], b: list[int], algo: str
) -> None:
    fn = hash_function(algo)
    block = 4
    for i, (ha, hb) in enumerate(zip(chain(fn, a, block), chain(fn, b, block))):
        same_prefix = a[: (i + 1) * block] == b[: (i + 1) * block]
        assert (ha == hb) == same_prefix
