"""The native CPU paged-decode kernel: exact attention read from the pages, every misuse refused.

It is judged against float64 attention over the same pages, gathered here by
hand; its build is exercised from a cold cache and with no compiler at all,
where it must say why and leave the torch backend on its gather path.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.attention import TorchAttentionBackend
from hwplug.kernels import (
    FP8_FORMATS,
    NATIVE_CACHE_DTYPES,
    NATIVE_MAX_BLOCK_SIZE,
    cpu_decode,
    native_decode_unavailable_reason,
    paged_decode_attention,
)
from tests.attention.helpers import make_batch, reference_attention

pytestmark = pytest.mark.skipif(
    native_decode_unavailable_reason() is not None,
    reason=f"the native kernel cannot be built here: {native_decode_unavailable_reason()}",
)


def _pages(
    lens: list[int],
    *,
    heads: int,
    kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_columns: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Query, caches (scattered pages), block table (with spare columns of junk) and lengths."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // block_size) for n in lens]
    blocks = sum(needed) + 3
    order = torch.randperm(blocks, generator=gen)
    width = max(needed, default=0) + spare_columns
    table = torch.full((len(lens), width), -7, dtype=torch.int64)  # junk past each row's own
    used = 0
    for i, count in enumerate(needed):
        table[i, :count] = order[used : used + count]
        used += count
    shape = (blocks, block_size, kv_heads, head_size)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    query = torch.randn(len(lens), heads, head_size, generator=gen)
    return query, key_cache, value_cache, table, torch.tensor(lens, dtype=torch.int64)


def _oracle(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Float64 attention of each last position over its visible positions."""
    n, heads, head_size = query.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    out = torch.empty(n, heads, head_size, dtype=torch.float64)
    for i in range(n):
        length = int(lens[i])
        first = 0 if window is None else max(0, length - window)
        positions = torch.arange(first, length)
        blocks = table[i, positions // block_size]
        k = key_cache[blocks, positions % block_size].to(torch.float64)  # [L, kv_heads, hd]
        v = value_cache[blocks, positions % block_size].to(torch.float64)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,lhd->hl", query[i].to(torch.float64), k) * scale
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v)
    return out


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 90), min_size=1, max_size=6),
    kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 2, 3, 4, 7, 8, 9]),  # 9: past the vector path's 8 rows
    # 64 and 128 take the vector path's specialised shapes, 32, 80 and 256 its general one
    head_size=st.sampled_from([1, 8, 17, 32, 64, 80, 128, 256]),
    block_size=st.sampled_from([1, 3, 16, 32, 48]),
    window=st.one_of(st.none(), st.integers(1, 100)),
    spare=st.integers(0, 2),
    threads=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_float32_pages_give_float64_attention(
    lens: list[int],
    kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    window: int | None,
    spare: int,
    threads: int,
    seed: int,
) -> None:
    query, key_cache, value_cache, table, seq_lens = _pages(
        lens,
        heads=kv_heads * group,
        kv_heads=kv_heads,
        head_size=head_size,
        block_size=block_size,
        seed=seed,
        spare_columns=spare,
    )
    scale = head_size**-0.5
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = paged_decode_attention(
            query, key_cache, value_cache, table, seq_lens, scale=scale, sliding_window=window
        )
    finally:
        torch.set_num_threads(before)
    assert out.dtype == torch.float32
    assert out.shape == query.shape
    expected = _oracle(query, key_cache, value_cache, table, seq_lens, scale=scale, window=window)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    "dtype", [torch.bfloat16, torch.float16, *sorted(FP8_FORMATS, key=str)], ids=str
)
def test_every_cache_dtype_is_decoded_exactly(dtype: torch.dtype) -> None:
    """The pages' values are what torch's cast reads from them (fp8 codes unscaled)."""
    assert dtype in NATIVE_CACHE_DTYPES
    query, key_cache, value_cache, table, lens = _pages(
        [1, 37, 200, 64], heads=8, kv_heads=2, head_size=64, block_size=16, dtype=dtype
    )
    out = paged_decode_attention(query, key_cache, value_cache, table, lens, scale=0.125)
    expected = _oracle(query, key_cache, value_cache, table, lens, scale=0.125)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("group", range(1, 10))
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_group_at_the_common_head_sizes(
    group: int, head_size: int, dtype: torch.dtype
) -> None:
    """Groups 1..8 at head sizes 64 and 128 run shapes the kernel specialises (9 runs the
    scalar path): each against float64, over full and partial pages and a window, with
    lengths that leave a page's last positions fewer than a vector's lanes."""
    query, key_cache, value_cache, table, lens = _pages(
        [1, 15, 17, 33, 100],
        heads=2 * group,
        kv_heads=2,
        head_size=head_size,
        block_size=32,
        dtype=dtype,
        seed=group,
    )
    scale = head_size**-0.5
    for window in (None, 21):
        out = paged_decode_attention(
            query, key_cache, value_cache, table, lens, scale=scale, sliding_window=window
        )
        expected = _oracle(query, key_cache, value_cache, table, lens, scale=scale, window=window)
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_special_codes_of_half_precision_pages() -> None:
    """Subnormal, zero, negative zero and large float16 keys read as their values."""
    query, key_cache, value_cache, table, lens = _pages(
        [20], heads=2, kv_heads=1, head_size=8, block_size=4, dtype=torch.float16
    )
    specials = torch.tensor([6e-8, -6e-8, 0.0, -0.0, 65504.0, -3e-5, 1e-4, 2.5])
    key_cache[:] = specials.to(torch.float16)
    query.fill_(1e-3)
    out = paged_decode_attention(query, key_cache, value_cache, table, lens, scale=1.0)
    expected = _oracle(query, key_cache, value_cache, table, lens, scale=1.0)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_a_non_contiguous_block_table_and_query_and_a_preallocated_out() -> None:
    query, key_cache, value_cache, table, lens = _pages(
        [5, 33], heads=4, kv_heads=2, head_size=16, block_size=4
    )
    wide = torch.zeros(2, table.shape[1] * 2, dtype=torch.int64)
    wide[:, ::2] = table
    strided_query = torch.randn(2, 4, 32)[:, :, ::2]
    strided_query.copy_(query)
    out = torch.full(query.shape, 5.0)
    got = paged_decode_attention(
        strided_query, key_cache, value_cache, wide[:, ::2], lens, scale=0.25, out=out
    )
    assert got is out
    expected = _oracle(query, key_cache, value_cache, table, lens, scale=0.25)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)


def test_positions_a_sequence_does_not_see_are_never_read() -> None:
    """NaN past each length (a block's tail, unused blocks) and before a window changes nothing."""
    query, key_cache, value_cache, table, lens = _pages(
        [6, 13], heads=4, kv_heads=2, head_size=16, block_size=4
    )
    clean = paged_decode_attention(
        query, key_cache, value_cache, table, lens, scale=0.25, sliding_window=5
    )
    key_cache[int(table[0, 1]), 2:] = float("nan")  # positions 6, 7 of sequence 0
    value_cache[int(table[1, 3]), 1:] = float("inf")  # positions 13.. of sequence 1
    key_cache[int(table[1, 0])] = float("nan")  # positions 0..3: before sequence 1's window
    used = set(table[0, :2].tolist()) | set(table[1, :4].tolist())
    for block in set(range(key_cache.shape[0])) - used:
        key_cache[block] = value_cache[block] = float("nan")
    out = paged_decode_attention(
        query, key_cache, value_cache, table, lens, scale=0.25, sliding_window=5
    )
    assert torch.equal(out, clean)


@pytest.mark.parametrize("head_size", [8, 64])  # 64: the vector path of every width
def test_nan_in_a_query_row_or_a_visible_key_is_nan_in_that_row_only(head_size: int) -> None:
    query, key_cache, value_cache, table, lens = _pages(
        [9, 9], heads=4, kv_heads=2, head_size=head_size, block_size=4
    )
    query[0, 1, 3] = float("nan")
    key_cache[int(table[1, 0]), 2, 1, 0] = float("nan")  # sequence 1, position 2, kv head 1
    out = paged_decode_attention(query, key_cache, value_cache, table, lens, scale=0.3)
    nan_rows = out.isnan().any(-1)
    assert nan_rows.tolist() == [[False, True, False, False], [False, False, True, True]]


@pytest.mark.parametrize(
    ("group", "head_size", "cache_dtype"),
    [
        (2, 64, torch.bfloat16),
        (3, 128, torch.float32),
        (9, 64, torch.bfloat16),
        (2, 8, torch.float16),
    ],
)  # the specialised vector shapes, the scalar path past 8 rows and at head size 8
def test_a_bfloat16_query_gives_the_float32_result_rounded_to_nearest_even(
    group: int, head_size: int, cache_dtype: torch.dtype
) -> None:
    """The kernel widens a bfloat16 query itself and rounds its result as torch's
    ``.to(torch.bfloat16)`` does, bit for bit, into ``out``; a NaN query row is NaN."""
    query, key_cache, value_cache, table, lens = _pages(
        [1, 15, 40, 77], heads=2 * group, kv_heads=2, head_size=head_size, block_size=16,
        dtype=cache_dtype, seed=group,
    )  # fmt: skip
    query = (query * 3).to(torch.bfloat16)
    query[1, 0, 0] = float("nan")
    # results far from 1, rounded at large exponents too (float16 stays finite)
    value_cache[:, :, 1] *= 1e4 if cache_dtype == torch.float16 else 1e30
    out = torch.full(query.shape, 7.0, dtype=torch.bfloat16)
    got = cpu_decode.run(
        query, key_cache, value_cache, table, lens, scale=0.2, sliding_window=None, out=out
    )
    assert got is out and got.dtype == torch.bfloat16
    wide = cpu_decode.run(
        query.float(), key_cache, value_cache, table, lens, scale=0.2, sliding_window=None
    )
    assert wide.dtype == torch.float32
    rounded = wide.to(torch.bfloat16)
    nan = rounded.isnan()
    assert torch.equal(got.isnan(), nan) and nan[1, 0].all() and nan.sum() == head_size
    assert rounded[~nan].abs().max() > 1e3
    # bit for bit elsewhere (a NaN's payload is not part of the contract)
    assert torch.equal(got[~nan].view(torch.int16), rounded[~nan].view(torch.int16))


def test_an_empty_batch_returns_an_empty_result() -> None:
    query, key_cache, value_cache, _, _ = _pages(
        [3], heads=2, kv_heads=1, head_size=8, block_size=4
    )
    out = paged_decode_attention(
        query[:0],
        key_cache,
        value_cache,
        torch.zeros(0, 1, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        scale=1.0,
    )
    assert out.shape == (0, 2, 8)


# ---------------------------------------------------------------------------
# Misuse
# ---------------------------------------------------------------------------


def _good() -> dict[str, object]:
    query, key_cache, value_cache, table, lens = _pages(
        [5, 9], heads=4, kv_heads=2, head_size=8, block_size=4
    )
    return {
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": table,
        "seq_lens": lens,
        "scale": 0.5,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda a: a.update(query=a["query"][0]),
            "query must be [n, num_heads, head_size] (3 dimensions); got shape [4, 8]",
        ),
        (
            lambda a: a.update(value_cache=a["value_cache"][:, :2]),
            "value_cache has block_size = 2 (shape [8, 2, 2, 8]), but key_cache's block_size is 4",
        ),
        (
            lambda a: a.update(value_cache=a["value_cache"].half()),
            "value_cache must have key_cache's dtype (float32); got float16",
        ),
        (
            lambda a: a.update(
                key_cache=a["key_cache"].double(), value_cache=a["value_cache"].double()
            ),
            "key_cache must be one of bfloat16, float16, float32, float8_e4m3fn",
        ),
        (lambda a: a.update(query=torch.randn(2, 3, 8)), "3 heads must be a multiple of the"),
        (lambda a: a.update(query=torch.randn(2, 4, 9)), "key_cache has head_size = 8"),
        (
            lambda a: a.update(block_table=a["block_table"].float()),
            "block_table must be an integer tensor (not bool); got float32",
        ),
        (
            lambda a: a.update(block_table=a["block_table"] > 0),
            "block_table must be an integer tensor (not bool); got bool",
        ),
        (lambda a: a.update(block_table=a["block_table"][:1]), "block_table has n = 1"),
        (lambda a: a.update(seq_lens=torch.tensor([5])), "seq_lens has n = 1"),
        (
            lambda a: a.update(seq_lens=torch.tensor([5, 9]) > 0),
            "seq_lens must be an integer tensor (not bool); got bool",
        ),
        (
            lambda a: a.update(seq_lens=torch.tensor([5, 0])),
            "seq_lens[1] = 0 is not a length the block table covers: lengths must lie in 1..12",
        ),
        (lambda a: a.update(seq_lens=torch.tensor([5, 13])), "seq_lens[1] = 13"),
        (lambda a: a.update(sliding_window=0), "sliding_window must be >= 1; got 0"),
        (lambda a: a.update(scale=float("nan")), "scale must be finite; got nan"),
        (lambda a: a.update(out=torch.empty(2, 4, 4)), "out has head_size = 4"),
        (
            lambda a: a.update(out=torch.empty(2, 4, 8, dtype=torch.float64)),
            "out must be one of float32; got float64",
        ),
        (
            lambda a: a.update(out=a["query"]),
            "out shares memory with query; the kernel writes out while it reads query",
        ),
        (
            lambda a: a.update(query=a["query"].int()),
            "query must be a floating-point tensor; got int32",
        ),
    ],
)
def test_bad_arguments_are_refused_with_what_is_allowed(change, message: str) -> None:
    arguments = _good()
    change(arguments)
    with pytest.raises(ValueError, match=re.escape(message)):
        paged_decode_attention(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda a: a.update(sliding_window=2.5), TypeError, "sliding_window must be an integer"),
        (lambda a: a.update(sliding_window=True), TypeError, "sliding_window must be an integer"),
        (lambda a: a.update(scale="0.5"), TypeError, "scale must be a real number"),
        (lambda a: a.update(query=[[1.0]]), TypeError, "query must be a torch.Tensor; got list"),
    ],
)
def test_arguments_of_the_wrong_type_are_type_errors(change, error, message: str) -> None:
    arguments = _good()
    change(arguments)
    with pytest.raises(error, match=re.escape(message)):
        paged_decode_attention(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad_id", [-1, 99, 2**30])
def test_a_block_id_out_of_range_within_a_length_is_refused(bad_id: int) -> None:
    arguments = _good()
    table = arguments["block_table"]
    assert isinstance(table, torch.Tensor)
    table[1, 2] = bad_id  # sequence 1 (length 9) reads its third block
    with pytest.raises(ValueError, match=re.escape(f"block_table[1, 2] = {bad_id} is not a block")):
        paged_decode_attention(**arguments)  # type: ignore[arg-type]


def test_a_block_size_over_the_kernels_limit_is_refused() -> None:
    query, key_cache, value_cache, table, lens = _pages(
        [3], heads=1, kv_heads=1, head_size=4, block_size=NATIVE_MAX_BLOCK_SIZE + 1
    )
    with pytest.raises(ValueError, match=f"block_size must lie in 1..{NATIVE_MAX_BLOCK_SIZE}; got"):
        paged_decode_attention(query, key_cache, value_cache, table, lens, scale=1.0)


def test_meta_tensors_are_not_cpu_tensors() -> None:
    assert "runs on CPU tensors, not meta" in str(native_decode_unavailable_reason("meta"))
    arguments = _good()
    arguments["query"] = torch.empty(2, 4, 8, device="meta")
    with pytest.raises(ValueError, match="query is on meta; the native kernels take CPU tensors"):
        paged_decode_attention(**arguments)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Building, and the torch backend's fallback
# ---------------------------------------------------------------------------


_PROBE = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from hwplug.kernels import native_decode_unavailable_reason
print("REASON", native_decode_unavailable_reason())
"""


def _probe(cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A new process asking whether the kernel runs, with a kernel cache under ``cache``."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache), **env}
    return subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=True,
    )


def test_a_cold_cache_builds_the_kernel_once_and_a_later_process_loads_it(
    tmp_path: Path,
) -> None:
    first = _probe(tmp_path)
    assert "REASON None" in first.stdout
    assert "built the native CPU kernels" in first.stderr
    built = list((tmp_path / "hwplug" / "kernels").glob("hwplug_cpu-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    second = _probe(tmp_path)
    assert "REASON None" in second.stdout
    assert "built the" not in second.stderr, "a later process must load, not build"
    assert built[0].stat().st_mtime_ns == stamp
    assert not list((tmp_path / "hwplug" / "kernels").glob(".hwplug_cpu-*")), "no leftovers"


def test_without_a_compiler_it_says_why_and_the_engine_path_still_works(tmp_path: Path) -> None:
    done = _probe(tmp_path, CC=str(tmp_path / "no-such-compiler"))
    reason = done.stdout.split("REASON", 1)[1]
    assert "did not build" in reason and "no-such-compiler" in reason
    assert "WARNING" in done.stderr and "gathers pages instead" in done.stderr
    assert not list((tmp_path / "hwplug" / "kernels").glob("*.so"))


def test_the_backend_gathers_when_the_kernel_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch(
        [40, 7, 19], [1, 1, 19], num_heads=4, num_kv_heads=2, head_size=16, block_size=4, seed=2
    )
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")
    with pytest.raises(RuntimeError, match="cannot run: HWPLUG_NATIVE_KERNELS=0 is set"):
        paged_decode_attention(
            batch.query[:2],
            batch.key_cache,
            batch.value_cache,
            batch.metadata.block_table[:2],
            batch.metadata.seq_lens[:2],
            scale=0.25,
        )
    out = TorchAttentionBackend(4, 16, 2, 0.25).forward(*batch.args())
    expected = reference_attention(
        batch.query, batch.key_cache, batch.value_cache, batch.metadata, scale=0.25
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_the_environment_switch_turns_it_off_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")
    assert native_decode_unavailable_reason() == "HWPLUG_NATIVE_KERNELS=0 is set"
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "1")
    assert native_decode_unavailable_reason() is None


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("window", [None, 9])
@pytest.mark.parametrize(
    ("seq_lens", "query_lens"),
    [
        ([70, 3, 33, 16, 12], [1, 1, 1, 1, 12]),  # the decodes lead: their rows are 0..3
        ([12, 70, 3, 33, 40], [12, 1, 1, 1, 5]),  # a prefill first, a chunk last
        ([70, 3, 33], [1, 1, 1]),  # decodes only
    ],
)
def test_the_backend_gives_the_same_answer_with_and_without_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
    cache_dtype: torch.dtype,
    window: int | None,
    seq_lens: list[int],
    query_lens: list[int],
) -> None:
    batch = make_batch(
        seq_lens,
        query_lens,
        num_heads=6,
        num_kv_heads=2,
        head_size=32,
        block_size=8,
        cache_dtype=cache_dtype,
        padding=3,
        seed=4,
    )
    impl = TorchAttentionBackend(6, 32, 2, 0.2, sliding_window=window, cache_dtype=cache_dtype)
    k_scale = torch.tensor(0.7) if cache_dtype in FP8_FORMATS else torch.tensor(1.0)
    native = impl.forward(*batch.args(), k_scale=k_scale, v_scale=k_scale)
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")
    gathered = impl.forward(*batch.args(), k_scale=k_scale, v_scale=k_scale)
    torch.testing.assert_close(native, gathered, atol=2e-6, rtol=2e-6)
    assert not native[-3:].any(), "padding rows stay zero"
    expected = reference_attention(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.metadata,
        scale=0.2,
        sliding_window=window,
        k_scale=k_scale,
        v_scale=k_scale,
    )
    torch.testing.assert_close(native[: sum(query_lens)].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cache_dtype", ["model", torch.float8_e4m3fn])
def test_a_16_bit_model_attends_alike_with_and_without_the_kernel(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, cache_dtype: object
) -> None:
    """A bfloat16 query goes to the kernel as it is, a float16 one (and any query of an fp8
    cache, scaled) through float32: either way the result is the gather path's, in the
    query's dtype, within a rounding of it."""
    cache = dtype if cache_dtype == "model" else cache_dtype
    assert isinstance(cache, torch.dtype)
    batch = make_batch(
        [70, 3, 33, 16, 12],
        [1, 1, 1, 1, 12],
        num_heads=8,
        num_kv_heads=2,
        head_size=64,
        block_size=16,
        dtype=dtype,
        cache_dtype=cache,
        padding=2,
        seed=5,
    )
    impl = TorchAttentionBackend(8, 64, 2, 0.125, cache_dtype=cache)
    scale = torch.tensor(0.5 if cache in FP8_FORMATS else 1.0)
    native = impl.forward(*batch.args(), k_scale=scale, v_scale=scale)
    monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")
    gathered = impl.forward(*batch.args(), k_scale=scale, v_scale=scale)
    assert native.dtype == gathered.dtype == dtype
    resolution = torch.finfo(dtype).eps
    torch.testing.assert_close(native, gathered, atol=2 * resolution, rtol=2 * resolution)
    assert not native[-2:].any(), "padding rows stay zero"


# ---------------------------------------------------------------------------
# The step's rows, stored by the kernel's own call
# ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 5)), min_size=1, max_size=5),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    block_size=st.sampled_from([1, 4, 16]),
    padding=st.integers(0, 3),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_step_s_rows_land_in_the_caches_as_the_reference_writes_them(
    lens: list[tuple[int, int]],
    dtype: torch.dtype,
    block_size: int,
    padding: int,
    transposed: bool,
    seed: int,
) -> None:
    """Where the kernel stores the step's keys and values itself (a cache in the model's
    dtype), every slot it stores, and every other, ends as the gather path (the reference
    write) leaves it: decodes and prefills mixed, padding rows not stored, and keys that
    are not contiguous taking the reference write."""
    seq_lens = [n + q - 1 for n, q in lens]
    query_lens = [1 if i % 2 == 0 else q for i, (_, q) in enumerate(lens)]
    seq_lens = [max(s, q) for s, q in zip(seq_lens, query_lens)]
    batch = make_batch(
        seq_lens,
        query_lens,
        num_heads=4,
        num_kv_heads=2,
        head_size=64,
        block_size=block_size,
        dtype=dtype,
        padding=padding,
        seed=seed,
    )
    key, value = batch.key, batch.value
    if transposed:  # same values, other strides
        key = key.transpose(0, 1).contiguous().transpose(0, 1)
    impl = TorchAttentionBackend(4, 64, 2, 0.125)
    caches = [(batch.key_cache.clone(), batch.value_cache.clone()) for _ in range(2)]
    args = (batch.query, key, value)
    native = impl.forward(*args, *caches[0], batch.metadata)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HWPLUG_NATIVE_KERNELS", "0")
        gathered = impl.forward(*args, *caches[1], batch.metadata)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    rows = sum(query_lens)
    tolerance = 2e-6 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(native[:rows], gathered[:rows], atol=tolerance, rtol=tolerance)


def test_rows_stored_by_the_kernel_are_refused_where_it_cannot_store_them() -> None:
    query, key_cache, value_cache, table, lens = _pages(
        [5, 9], heads=4, kv_heads=2, head_size=64, block_size=4
    )
    rows = torch.randn(2, 2, 64)
    slots = torch.tensor([3, 20])
    run = functools.partial(cpu_decode.run, query, scale=0.1, sliding_window=None)
    codes = key_cache.to(torch.float8_e4m3fn), value_cache.to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="cache's own dtype"):
        run(*codes, table, lens, write=(rows.to(codes[0].dtype), rows.to(codes[0].dtype), slots))
    with pytest.raises(ValueError, match="keys must be one of bfloat16, float16, float32"):
        run(key_cache, value_cache, table, lens, write=(rows.double(), rows.double(), slots))
    with pytest.raises(
        ValueError, match=re.escape("keys has num_kv_heads = 64 (shape [2, 64, 2])")
    ):
        run(key_cache, value_cache, table, lens, write=(rows.transpose(1, 2), rows, slots))
    with pytest.raises(ValueError, match=re.escape("slots has rows = 1 (shape [1]), but keys's")):
        run(key_cache, value_cache, table, lens, write=(rows, rows, slots[:1]))
    with pytest.raises(ValueError, match="slots must be an integer tensor"):
        run(key_cache, value_cache, table, lens, write=(rows, rows, slots.float()))
    slot_count = key_cache.shape[0] * key_cache.shape[1]
    before = key_cache.clone()
    with pytest.raises(
        ValueError, match=f"slot {slot_count} of new row 1 is past the caches' {slot_count} slots"
    ):
        run(key_cache, value_cache, table, lens, write=(rows, rows, torch.tensor([3, slot_count])))
    assert torch.equal(key_cache, before), "nothing is stored when a slot is out of range"
    # rows of any strides and int32 slots are taken (copied for the kernel)
    strided = rows.transpose(0, 1).contiguous().transpose(0, 1)
    run(key_cache, value_cache, table, lens, write=(strided, strided, slots.int()))
    assert torch.equal(key_cache.view(-1, 2, 64)[20], rows[1])
    other = value_cache.transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match="one layout"):
        run(key_cache, other, table, lens, write=(rows, rows, slots))
    before = key_cache.clone()
    run(key_cache, value_cache, table, lens, write=(rows, rows, torch.tensor([-1, 20])))
    flat = key_cache.view(-1, 2, 64)
    assert torch.equal(flat[20], rows[1]), "slot 20 is stored"
    assert torch.equal(flat[:20], before.view(-1, 2, 64)[:20]), "a negative slot is not"
