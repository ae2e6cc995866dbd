"""The compiled Triton kernels on a real GPU (skipped without CUDA/ROCm)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hwplug.kernels import (
    CACHE_DTYPES,
    compute_kv_scales,
    gather_kv_cache,
    select_backend,
    write_kv_cache,
)
from tests.kernels.helpers import assert_same_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
    pytest.mark.usefixtures("no_interpret"),
]


def random_batch(tokens: int, heads: int, head_size: int, num_slots: int) -> tuple:
    gen = torch.Generator(device="cuda").manual_seed(0)
    mags = torch.logspace(-6, 4, tokens, device="cuda").view(tokens, 1, 1)
    key = torch.randn(tokens, heads, head_size, device="cuda", generator=gen) * mags
    value = torch.randn(tokens, heads, head_size, device="cuda", generator=gen)
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:tokens]
    slots[::13] = -1
    return key.to(torch.bfloat16), value, slots


def test_auto_picks_triton_on_the_gpu() -> None:
    pytest.importorskip("triton")
    assert select_backend("auto", "cuda") == "triton"


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=str)
def test_compiled_kernels_store_the_same_bytes_as_torch(cache_dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    key, value, slots = random_batch(4096, 8, 128, 8192)
    k_scale, v_scale = compute_kv_scales(key, value, torch.float8_e4m3fn)
    shape = (512, 16, 8, 128)
    caches = {}
    for backend in ("torch", "triton"):
        key_cache = torch.full(shape, 3.0, device="cuda").to(cache_dtype)
        value_cache = key_cache.clone()
        try:
            write_kv_cache(
                key, value, key_cache, value_cache, slots, k_scale, v_scale, backend=backend
            )
        except (RuntimeError, NotImplementedError) as exc:
            if backend == "torch":
                pytest.skip(f"torch cannot convert to {cache_dtype} on this GPU: {exc}")
            raise
        caches[backend] = (key_cache, value_cache)
    for ref, got in zip(caches["torch"], caches["triton"]):
        assert_same_bytes(got.cpu(), ref.cpu())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        ref = gather_kv_cache(
            *caches["torch"], slots, k_scale, v_scale, dtype=dtype, backend="torch"
        )
        got = gather_kv_cache(
            *caches["torch"], slots, k_scale, v_scale, dtype=dtype, backend="triton"
        )
        assert_same_bytes(got[0].cpu(), ref[0].cpu())
        assert_same_bytes(got[1].cpu(), ref[1].cpu())


def _seconds(fn: Callable[[], object], repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def test_write_bandwidth_is_a_fair_share_of_a_device_copy() -> None:
    """The Triton write moves bytes at least a quarter as fast as the device copies them."""
    pytest.importorskip("triton")
    tokens, heads, head_size = 65536, 8, 128
    key = torch.randn(tokens, heads, head_size, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    shape = (tokens // 16, 16, heads, head_size)
    key_cache = torch.empty(shape, dtype=torch.float8_e4m3fn, device="cuda")
    value_cache = torch.empty_like(key_cache)
    slots = torch.randperm(tokens, device="cuda")
    moved = key.nbytes + value.nbytes + key_cache.nbytes + value_cache.nbytes + slots.nbytes

    t_write = _seconds(
        lambda: write_kv_cache(
            key, value, key_cache, value_cache, slots, 0.01, 0.01, backend="triton"
        )
    )
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t_copy = _seconds(lambda: dst.copy_(src))  # reads and writes `moved` bytes in all
    write_gbps = moved / t_write / 1e9
    copy_gbps = moved / t_copy / 1e9
    assert write_gbps >= 0.25 * copy_gbps, (write_gbps, copy_gbps)
