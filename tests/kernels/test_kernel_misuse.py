"""Misuse of the KV-cache kernels that used to slip through or fail obscurely."""

from __future__ import annotations

import math

import pytest
import torch

from hwplug.kernels import compute_kv_scales, gather_kv_cache, write_kv_cache

UNSIGNED = [torch.uint8, torch.uint16, torch.uint32, torch.uint64]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_gives_a_non_finite_scale(bad: float) -> None:
    key = torch.ones(3, 2, 4)
    key[1, 0, 2] = bad
    k_scale, v_scale = compute_kv_scales(key, torch.ones(3, 2, 4), torch.float8_e4m3fn)
    assert not math.isfinite(k_scale.item())
    assert v_scale.item() == pytest.approx(1 / 448)


def test_a_nan_scale_is_rejected_by_the_write() -> None:
    key = torch.full((2, 1, 4), float("nan"))
    k_scale, v_scale = compute_kv_scales(key, key, torch.float8_e4m3fn)
    cache = torch.zeros(1, 4, 1, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k_scale must be a positive finite number"):
        write_kv_cache(
            key, key, cache, cache.clone(), torch.tensor([0, 1]), k_scale, v_scale, backend="torch"
        )


def test_all_zero_input_still_gives_scale_one() -> None:
    k_scale, _ = compute_kv_scales(torch.zeros(2, 1, 4), torch.zeros(2, 1, 4), torch.float8_e5m2)
    assert k_scale.item() == 1.0


@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
def test_unsigned_slot_mappings_are_rejected_clearly(dtype: torch.dtype) -> None:
    key = torch.ones(2, 1, 4)
    cache = torch.zeros(2, 2, 1, 4)
    slots = torch.tensor([0, 3], dtype=dtype)
    with pytest.raises(ValueError, match=r"slot_mapping must be a signed integer tensor.*uint"):
        write_kv_cache(key, key, cache, cache.clone(), slots, backend="torch")
    with pytest.raises(ValueError, match=r"slot_mapping must be a signed integer tensor"):
        gather_kv_cache(cache, cache.clone(), slots, dtype=torch.float32, backend="torch")


def test_one_tensor_as_both_caches_is_rejected() -> None:
    key = torch.ones(2, 1, 4)
    cache = torch.zeros(2, 2, 1, 4)
    with pytest.raises(ValueError, match="key_cache and value_cache share memory"):
        write_kv_cache(key, -key, cache, cache, torch.tensor([0, 1]), backend="torch")


def test_overlapping_views_as_caches_are_rejected() -> None:
    key = torch.ones(2, 1, 4)
    buffer = torch.zeros(5, 2, 1, 4)
    with pytest.raises(ValueError, match="key_cache and value_cache share memory"):
        write_kv_cache(key, -key, buffer[:3], buffer[2:], torch.tensor([0, 1]), backend="torch")


def test_interleaved_views_of_one_buffer_are_separate_caches() -> None:
    key = torch.ones(2, 1, 4)
    combined = torch.zeros(3, 2, 2, 1, 4)  # [blocks, k|v, block_size, heads, head_size]
    key_cache, value_cache = combined[:, 0], combined[:, 1]
    write_kv_cache(key, -key, key_cache, value_cache, torch.tensor([0, 5]), backend="torch")
    assert (key_cache[0, 0] == 1).all()
    assert (value_cache[2, 1] == -1).all()


def test_reading_both_caches_from_one_tensor_is_allowed() -> None:
    cache = torch.ones(1, 2, 1, 4)
    key, value = gather_kv_cache(cache, cache, torch.tensor([1]), dtype=torch.float32)
    assert torch.equal(key, value)
