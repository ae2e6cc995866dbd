"""Behaviour of write_kv_cache / gather_kv_cache, pinned on the torch reference backend."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.kernels import (
    CACHE_DTYPES,
    FP8_FORMATS,
    INPUT_DTYPES,
    compute_kv_scales,
    gather_kv_cache,
    write_kv_cache,
)
from tests.kernels.helpers import assert_same_bytes, edge_values, nearest_even_oracle

FP8 = list(FP8_FORMATS)
SENTINEL = 3.0


def make_caches(
    num_blocks: int, block_size: int, heads: int, head_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (num_blocks, block_size, heads, head_size)
    return torch.full(shape, SENTINEL).to(dtype), torch.full(shape, SENTINEL).to(dtype)


def test_tokens_land_in_their_slots_and_padding_is_skipped() -> None:
    key = torch.arange(5 * 2 * 3, dtype=torch.float32).reshape(5, 2, 3) + 10
    value = -key
    key_cache, value_cache = make_caches(3, 4, 2, 3, torch.float32)
    slots = torch.tensor([5, -1, 0, 11, -7])
    write_kv_cache(key, value, key_cache, value_cache, slots, backend="torch")
    assert torch.equal(key_cache[1, 1], key[0])  # slot 5 = block 1, offset 1
    assert torch.equal(key_cache[0, 0], key[2])
    assert torch.equal(key_cache[2, 3], key[3])
    assert torch.equal(value_cache[2, 3], value[3])
    written = {5, 0, 11}
    flat = key_cache.reshape(12, 2, 3)
    for slot in set(range(12)) - written:
        assert (flat[slot] == SENTINEL).all(), f"slot {slot} was touched"


def test_gather_returns_zero_rows_for_padding() -> None:
    key_cache, value_cache = make_caches(2, 2, 1, 4, torch.bfloat16)
    key, value = gather_kv_cache(
        key_cache, value_cache, torch.tensor([3, -1, 0]), dtype=torch.float32, backend="torch"
    )
    assert key.shape == value.shape == (3, 1, 4)
    assert key.dtype == torch.float32
    assert (key[0] == SENTINEL).all()
    assert (key[2] == SENTINEL).all()
    assert (key[1] == 0).all()
    assert (value[1] == 0).all()


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
@pytest.mark.parametrize("input_dtype", INPUT_DTYPES, ids=str)
def test_fp8_round_trip_error_is_within_the_format_precision(
    cache_dtype: torch.dtype, input_dtype: torch.dtype
) -> None:
    torch.manual_seed(1)
    fmt = FP8_FORMATS[cache_dtype]
    key = (torch.randn(24, 2, 16) * torch.logspace(-3, 2, 24).view(24, 1, 1)).to(input_dtype)
    value = (torch.randn(24, 2, 16) * 7).to(input_dtype)
    k_scale, v_scale = compute_kv_scales(key, value, cache_dtype)
    key_cache, value_cache = make_caches(8, 4, 2, 16, cache_dtype)
    slots = torch.randperm(32)[:24]
    write_kv_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale, backend="torch")
    got_k, got_v = gather_kv_cache(
        key_cache, value_cache, slots, k_scale, v_scale, dtype=torch.float32, backend="torch"
    )
    for x, got, scale in ((key, got_k, k_scale), (value, got_v, v_scale)):
        exact = x.to(torch.float32)
        # half a unit in the last place of the format, relative for normal
        # numbers, absolute (in scaled units) for subnormals
        bound = torch.maximum(
            exact.abs() * 2.0 ** -(fmt.mantissa_bits + 1), scale * fmt.subnormal_step / 2
        )
        assert ((got - exact).abs() <= bound * (1 + 1e-6)).all()


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
def test_quantisation_is_saturating_round_to_nearest_even(cache_dtype: torch.dtype) -> None:
    values = edge_values(cache_dtype)
    n = values.numel()
    key = values.view(n, 1, 1)
    key_cache, value_cache = make_caches(n, 1, 1, 1, cache_dtype)
    write_kv_cache(key, key, key_cache, value_cache, torch.arange(n), backend="torch")
    assert_same_bytes(key_cache.view(n), nearest_even_oracle(values, cache_dtype), 1.0)


@pytest.mark.parametrize("cache_dtype", FP8, ids=str)
def test_huge_and_infinite_inputs_saturate(cache_dtype: torch.dtype) -> None:
    big = torch.tensor([1e6, -1e6, float("inf"), float("-inf"), 3e38]).view(5, 1, 1)
    key_cache, value_cache = make_caches(5, 1, 1, 1, cache_dtype)
    write_kv_cache(big, big, key_cache, value_cache, torch.arange(5), 0.5, 0.5, backend="torch")
    stored = key_cache.to(torch.float32).flatten()
    assert stored.isfinite().all()
    limit = FP8_FORMATS[cache_dtype].max_finite
    assert stored.tolist() == [limit, -limit, limit, -limit, limit]


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_non_fp8_caches_store_a_plain_cast_and_ignore_scales(cache_dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    key = torch.randn(6, 2, 4)
    value = torch.randn(6, 2, 4, dtype=torch.bfloat16)
    key_cache, value_cache = make_caches(2, 4, 2, 4, cache_dtype)
    slots = torch.tensor([0, 1, 2, 3, 4, 5])
    write_kv_cache(key, value, key_cache, value_cache, slots, 4.0, 0.25, backend="torch")
    assert torch.equal(key_cache.reshape(8, 2, 4)[:6], key.to(cache_dtype))
    assert torch.equal(value_cache.reshape(8, 2, 4)[:6], value.to(cache_dtype))
    got_k, _ = gather_kv_cache(
        key_cache, value_cache, slots, 4.0, 0.25, dtype=torch.float32, backend="torch"
    )
    assert torch.equal(got_k, key.to(cache_dtype).to(torch.float32))


def test_scales_may_be_floats_or_one_element_tensors() -> None:
    torch.manual_seed(3)
    key = torch.randn(4, 1, 8)
    results = []
    for scale in (0.05, torch.tensor(0.05), torch.tensor([0.05])):
        key_cache, value_cache = make_caches(1, 4, 1, 8, torch.float8_e4m3fn)
        write_kv_cache(
            key, key, key_cache, value_cache, torch.arange(4), scale, scale, backend="torch"
        )
        results.append(key_cache.view(torch.uint8))
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[0], results[2])


def test_strided_inputs_and_caches() -> None:
    torch.manual_seed(4)
    qkv = torch.randn(5, 3, 2, 8)
    key, value = qkv[:, 1], qkv[:, 2]  # views, not contiguous
    combined = torch.zeros(4, 2, 2, 2, 8, dtype=torch.float8_e5m2)  # [blocks, k|v, ...]
    key_cache, value_cache = combined[:, 0], combined[:, 1]
    slots = torch.tensor([7, 0, 3, -1, 4])
    write_kv_cache(key, value, key_cache, value_cache, slots, backend="torch")
    got_k, got_v = gather_kv_cache(
        key_cache, value_cache, slots, dtype=torch.float32, backend="torch"
    )
    keep = slots >= 0
    assert torch.equal(got_k[keep], key[keep].to(torch.float8_e5m2).float())
    assert torch.equal(got_v[keep], value[keep].to(torch.float8_e5m2).float())


@st.composite
def paged_batches(draw: st.DrawFn) -> dict[str, object]:
    """Small random shapes, with a slot mapping of distinct slots and some padding."""
    block_size = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(1, 4))
    heads = draw(st.integers(1, 3))
    head_size = draw(st.integers(1, 9))
    num_slots = num_blocks * block_size
    used = draw(st.lists(st.integers(0, num_slots - 1), unique=True, max_size=num_slots))
    padding = draw(st.lists(st.integers(-50, -1), max_size=3))
    slots = draw(st.permutations(used + padding))
    return {
        "shape": (num_blocks, block_size, heads, head_size),
        "slots": torch.tensor(slots, dtype=draw(st.sampled_from([torch.int32, torch.int64]))),
        "cache_dtype": draw(st.sampled_from(CACHE_DTYPES)),
        "input_dtype": draw(st.sampled_from(INPUT_DTYPES)),
        "scale": draw(st.sampled_from([1.0, 0.01, 3.5])),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None)
@given(batch=paged_batches())
def test_write_then_gather_round_trips_any_layout(batch: dict) -> None:
    num_blocks, block_size, heads, head_size = batch["shape"]
    slots: torch.Tensor = batch["slots"]
    gen = torch.Generator().manual_seed(batch["seed"])
    key = torch.randn(len(slots), heads, head_size, generator=gen).to(batch["input_dtype"])
    value = torch.randn(len(slots), heads, head_size, generator=gen).to(batch["input_dtype"])
    cache_dtype = batch["cache_dtype"]
    key_cache, value_cache = make_caches(num_blocks, block_size, heads, head_size, cache_dtype)
    scale = batch["scale"]
    write_kv_cache(key, value, key_cache, value_cache, slots, scale, scale, backend="torch")

    keep = slots >= 0
    fp8 = cache_dtype in FP8_FORMATS
    for x, cache in ((key, key_cache), (value, value_cache)):
        expected = x
        if fp8:
            limit = FP8_FORMATS[cache_dtype].max_finite
            expected = (x.float() / scale).clamp(-limit, limit)
        flat = cache.reshape(-1, heads, head_size)
        stored = flat[slots[keep].long()]
        assert_same_bytes(stored, expected[keep].to(cache_dtype), 1.0)
        untouched = torch.ones(flat.shape[0], dtype=torch.bool)
        untouched[slots[keep].long()] = False
        assert (flat[untouched].float() == SENTINEL).all()

    got_k, got_v = gather_kv_cache(
        key_cache, value_cache, slots, scale, scale, dtype=torch.float32, backend="torch"
    )
    assert got_k.shape == (len(slots), heads, head_size)
    assert (got_k[~keep] == 0).all()
    assert (got_v[~keep] == 0).all()
    stored_k = key_cache.reshape(-1, heads, head_size)[slots[keep].long()].float()
    assert torch.equal(got_k[keep], stored_k * scale if fp8 else stored_k)
