"""The torch backend: work shared across a step's layers, never stale; float32 on CPUs.

A model calls attention once per layer with the same metadata; an engine then
refills the same buffers in place for its next step. Every call must attend
exactly what its metadata says now. 16-bit models on a CPU attend in float32. Each
test runs on both CPU decode paths: the native kernel and the gather.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hwplug.attention import AttentionMetadata, TorchAttentionBackend
from tests.attention.helpers import Batch, make_batch, reference_attention

HEADS, KV_HEADS, HEAD, BLOCK = 4, 2, 16, 4


@pytest.fixture(autouse=True, params=["pages in place", "gathered pages"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs twice on a CPU: decoding sequences attend through the native kernel
    (reading pages in place), then through the gather path (``HWPLUG_NATIVE_KERNELS=0``)."""
    if request.param == "gathered pages":
        monkeypatch.setenv("HWPLUG_NATIVE_KERNELS", "0")


def _batch(seq_lens: list[int], query_lens: list[int], **options: Any) -> Batch:
    return make_batch(
        seq_lens,
        query_lens,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD,
        block_size=BLOCK,
        **options,
    )


def _attend(batch: Batch, *, window: int | None = None) -> torch.Tensor:
    impl = TorchAttentionBackend(
        HEADS, HEAD, KV_HEADS, 0.25, sliding_window=window, cache_dtype=batch.key_cache.dtype
    )
    return impl.forward(*batch.args())


def _expected(batch: Batch, *, window: int | None = None) -> torch.Tensor:
    return reference_attention(
        batch.query,
        batch.key_cache,
        batch.value_cache,
        batch.metadata,
        scale=0.25,
        sliding_window=window,
    ).float()


def _refill(into: Batch, source: Batch) -> None:
    """Copy ``source``'s metadata into ``into``'s tensors in place (same shapes)."""
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
        getattr(into.metadata, name).copy_(getattr(source.metadata, name))


def test_layers_with_and_without_a_window_share_metadata() -> None:
    batch = _batch([13, 9, 20], [1, 1, 5], seed=1, num_blocks=16)
    rows = batch.metadata.query_start_loc[-1]
    for window in (None, 3, None, 6):  # layers alternating, as in Gemma-style models
        out = _attend(batch, window=window)
        torch.testing.assert_close(out[:rows], _expected(batch, window=window))


def _buffers(num_seqs: int, width: int, num_tokens: int) -> AttentionMetadata:
    """Persistent metadata buffers, as an engine keeps for its graphs."""
    return AttentionMetadata(
        torch.zeros(num_seqs + 1, dtype=torch.int32),
        torch.zeros(num_seqs, dtype=torch.int32),
        torch.zeros(num_seqs, width, dtype=torch.int32),
        torch.zeros(num_tokens, dtype=torch.int64),
    )


def _rebuilt(batch: Batch, out: AttentionMetadata) -> Batch:
    """``batch`` with its metadata built again from host values into ``out``."""
    meta = batch.metadata
    assert meta.query_lens is not None and meta.seq_lens_cpu is not None
    built = AttentionMetadata.build(
        meta.query_lens,
        meta.seq_lens_cpu,
        meta.block_table.tolist(),
        meta.slot_mapping.tolist(),
        device="cpu",
        out=out,
    )
    return Batch(batch.query, batch.key, batch.value, batch.key_cache, batch.value_cache, built)


@pytest.mark.parametrize("change", ["block_table", "slot_mapping", "lengths"])
def test_steps_built_into_the_same_buffers_each_attend_their_own_values(change: str) -> None:
    buffers = _buffers(4, 8, 16)
    first = _rebuilt(_batch([10, 7], [1, 1], seed=2, num_blocks=12), buffers)
    impl = TorchAttentionBackend(HEADS, HEAD, KV_HEADS, 0.25)
    first_step = TorchAttentionBackend.prepare(first.metadata, num_blocks=12, block_size=BLOCK)
    impl.forward(*first.args()[:5], first_step)
    if change == "lengths":
        nxt = _batch([11, 8], [1, 1], seed=3, num_blocks=12)
    else:
        nxt = _batch([10, 7], [1, 1], seed=3, num_blocks=12)
    nxt = _rebuilt(nxt, buffers)
    if change == "block_table":
        tables = (first.metadata.block_table_cpu, nxt.metadata.block_table_cpu)
        assert tables[0] is not None and tables[1] is not None
        assert not torch.equal(*tables)
    # the same memory, refilled: each step's own prepared plan reads its own values
    assert nxt.metadata.block_table.data_ptr() == first.metadata.block_table.data_ptr()
    step = TorchAttentionBackend.prepare(nxt.metadata, num_blocks=12, block_size=BLOCK)
    out = impl.forward(*nxt.args()[:5], step)
    torch.testing.assert_close(out[:2], _expected(nxt))
    slots = nxt.metadata.slot_mapping.tolist()
    flat_keys = nxt.key_cache.reshape(-1, KV_HEADS, HEAD)
    torch.testing.assert_close(flat_keys[slots], nxt.key[:2])


def test_a_bad_value_in_a_later_step_is_caught_when_it_is_prepared() -> None:
    batch = _batch([6, 5], [1, 1], seed=4, num_blocks=6)
    _attend(batch)
    table = batch.metadata.block_table.tolist()
    table[1][0] = 77
    meta = batch.metadata
    bad = AttentionMetadata.build(
        meta.query_lens or [], meta.seq_lens_cpu or [], table, [3, 4], device="cpu"
    )
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 77, but the cache has 6 blocks"):
        TorchAttentionBackend.prepare(bad, num_blocks=6, block_size=BLOCK)


def test_the_same_metadata_against_a_smaller_cache_is_checked_again() -> None:
    batch = _batch([6, 5], [1, 1], seed=5, num_blocks=8)
    _attend(batch)
    top = int(batch.metadata.block_table.max())
    small = Batch(
        batch.query,
        batch.key,
        batch.value,
        batch.key_cache[:top].clone(),
        batch.value_cache[:top].clone(),
        batch.metadata,
    )
    with pytest.raises(ValueError, match=f"= {top}, but the cache has {top} blocks"):
        _attend(small)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float8_e4m3fn),
        (torch.bfloat16, torch.float8_e5m2),
    ],
)
def test_layers_taking_turns_each_attend_their_own_cache(
    dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    """Gathers reuse buffers from layer to layer: no layer may see another's pages."""
    layers = [
        _batch([21, 9, 14], [1, 1, 6], dtype=dtype, cache_dtype=cache_dtype, seed=10 + i)
        for i in range(3)
    ]
    # every layer shares the first one's metadata, as the layers of one model do
    shared = layers[0].metadata
    steps = [Batch(b.query, b.key, b.value, b.key_cache, b.value_cache, shared) for b in layers]
    tol = {"rtol": 5e-2, "atol": 5e-2} if dtype == torch.bfloat16 else {}
    for _ in range(2):
        for step in steps:
            out = _attend(step)[:8].float()
            torch.testing.assert_close(out, _expected(step), **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_model_on_the_cpu_decodes_in_float32(dtype: torch.dtype) -> None:
    """A decoding row is the float64 answer rounded once to the model's dtype (nearly
    everywhere), as attention computed in float32 gives and 16-bit attention does not;
    a prefill's rows are within the contract's 2e-2 whatever dtype they attend in
    (bfloat16 where the CPU has bfloat16 dot products)."""
    batch = make_batch(
        [300, 257, 400, 40],
        [1, 1, 1, 40],
        num_heads=8,
        num_kv_heads=2,
        head_size=64,
        block_size=16,
        dtype=dtype,
        seed=1,
    )
    impl = TorchAttentionBackend(8, 64, 2, 0.125)
    out = impl.forward(*batch.args())
    assert out.dtype == dtype
    wide = reference_attention(
        batch.query, batch.key_cache, batch.value_cache, batch.metadata, scale=0.125
    )
    exact = wide.to(dtype)
    assert (out[:3] == exact[:3]).float().mean().item() > 0.99
    assert (out[3:43].double() - wide[3:43]).abs().max().item() <= 2e-2


def _cpu_has_bfloat16_dot_products() -> bool:
    return any(
        bool(getattr(torch.cpu, probe, lambda: False)())
        for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


@pytest.mark.skipif(
    not _cpu_has_bfloat16_dot_products(), reason="the CPU has no bfloat16 dot products"
)
def test_a_bfloat16_prefill_attends_in_bfloat16_where_the_cpu_multiplies_it() -> None:
    """SDPA's bfloat16 kernel, 1.7-2.3x its float32 one on such CPUs, on the gathered pages:
    the prefill's rows are its result bit for bit, not the float32 result rounded."""
    batch = make_batch(
        [200], [200], num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
        dtype=torch.bfloat16, seed=3,
    )  # fmt: skip
    out = TorchAttentionBackend(8, 64, 2, 0.125).forward(*batch.args())
    table = batch.metadata.block_table[0, :13].long()
    key = batch.key_cache[table].reshape(-1, 2, 64)[:200].transpose(0, 1)[None]
    value = batch.value_cache[table].reshape(-1, 2, 64)[:200].transpose(0, 1)[None]
    query = batch.query[:200].transpose(0, 1)[None]

    def sdpa(dtype: torch.dtype) -> torch.Tensor:
        result = torch.nn.functional.scaled_dot_product_attention(
            query.to(dtype),
            key.to(dtype).contiguous(),
            value.to(dtype).contiguous(),
            is_causal=True,
            scale=0.125,
            enable_gqa=True,
        )
        return result[0].transpose(0, 1).to(torch.bfloat16)

    assert torch.equal(out[:200], sdpa(torch.bfloat16))
    assert not torch.equal(out[:200], sdpa(torch.float32))


# ---------------------------------------------------------------------------
# Values a model can produce: NaN rows, stale pages, calls outside inference_mode
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq_lens", "query_lens"),
    [
        ([9], [9]),  # one whole prefill
        ([9], [1]),  # one lone decode
        ([9, 5], [1, 1]),  # a decode batch
        ([9, 5], [9, 1]),  # mixed
        ([9, 5], [3, 5]),  # chunked prefill beside a prefill
    ],
)
def test_a_nan_query_row_gives_nan_in_every_batch_shape(
    seq_lens: list[int], query_lens: list[int]
) -> None:
    batch = _batch(seq_lens, query_lens)
    batch.query[0, 1] = float("nan")
    out = _attend(batch)
    assert out[0, 1].isnan().all(), "the NaN query's output must be NaN"
    # every other head and row is the reference's
    expected = _expected(batch)
    out[0, 1] = expected[0, 1] = 0
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def _clone(batch: Batch) -> Batch:
    return Batch(*(t.clone() for t in batch.args()[:5]), batch.metadata)  # type: ignore[union-attr]


def test_nan_in_pages_a_sequence_does_not_see_changes_nothing() -> None:
    """Positions past a sequence's length (another step's stale pages) hold anything."""
    batch = _batch([9, 5], [1, 1], num_blocks=8)
    clean = _attend(_clone(batch))
    table = batch.metadata.block_table
    # the rest of sequence 1's last block (positions 5..7) and every unused block
    last = int(table[1, 1])
    batch.key_cache[last, 1:] = float("nan")
    batch.value_cache[last, 1:] = float("inf")
    used = set(table[0, :3].tolist()) | set(table[1, :2].tolist())
    for block in set(range(8)) - used:
        batch.key_cache[block] = float("nan")
        batch.value_cache[block] = float("nan")
    out = _attend(batch)
    assert not out.isnan().any()
    torch.testing.assert_close(out, clean)
    torch.testing.assert_close(out, _expected(batch), atol=1e-4, rtol=1e-4)


def test_nan_before_a_window_changes_nothing() -> None:
    batch = _batch([12], [1])
    clean = _attend(_clone(batch), window=4)
    first = int(batch.metadata.block_table[0, 0])
    batch.key_cache[first] = float("nan")
    batch.value_cache[first] = float("nan")
    out = _attend(batch, window=4)
    assert not out.isnan().any()
    torch.testing.assert_close(out, clean)


def test_a_call_outside_inference_mode_follows_one_inside_it() -> None:
    big = _batch([40, 33], [1, 1], seed=3)
    with torch.inference_mode():
        inside = _attend(_batch([40, 33], [1, 1], seed=3))
    # the same thread, now outside inference_mode, with the same and larger shapes
    outside = _attend(big)
    torch.testing.assert_close(inside, outside)
    larger = _batch([70, 60, 50], [1, 1, 1], seed=4)
    torch.testing.assert_close(_attend(larger), _expected(larger), atol=1e-4, rtol=1e-4)
