"""The attention backends on a real GPU (skipped without CUDA/ROCm).

The Triton kernel runs compiled here (no interpreter): 16-bit queries take
the tensor-core dot path that the CPU tests cannot reach. The forward is
also checked to synchronise with the host nowhere and to capture and replay
in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from hwplug.attention import AttentionMetadata, TorchAttentionBackend, TritonAttentionBackend
from tests.attention.helpers import Batch, make_batch, reference_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
    pytest.mark.usefixtures("no_interpret"),
]

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
MIXED = ([300, 17, 64, 1, 129], [1, 17, 9, 1, 40])  # decode, prefill, chunks


def forward(
    backend: type, batch: Batch, *, window: int | None, k_scale: object, v_scale: object
) -> torch.Tensor:
    heads, head_size = batch.query.shape[1:]
    impl = backend(
        heads,
        head_size,
        batch.key.shape[1],
        head_size**-0.5,
        sliding_window=window,
        cache_dtype=batch.key_cache.dtype,
    )
    return impl.forward(
        batch.query,
        batch.key,
        batch.value,
        batch.key_cache,
        batch.value_cache,
        batch.metadata,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def check(batch: Batch, out: torch.Tensor, *, window: int | None, ks: object, vs: object) -> None:
    want = reference_attention(
        batch.query.cpu(),
        batch.key_cache.cpu(),
        batch.value_cache.cpu(),
        batch.metadata.to("cpu"),
        scale=batch.query.shape[2] ** -0.5,
        sliding_window=window,
        k_scale=ks.cpu() if isinstance(ks, torch.Tensor) else ks,
        v_scale=vs.cpu() if isinstance(vs, torch.Tensor) else vs,
    )
    got = out[: want.shape[0]].cpu().to(torch.float64)
    error = (got - want).abs().max().item()
    assert error <= TOLERANCE[out.dtype], f"max abs error {error:.3g}"


@pytest.mark.parametrize("backend", [TritonAttentionBackend, TorchAttentionBackend])
@pytest.mark.parametrize(
    ("dtype", "cache_dtype"),
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.float8_e4m3fn),
        (torch.float16, torch.float8_e5m2),
        (torch.float32, torch.float8_e4m3fnuz),
        (torch.bfloat16, torch.float32),
    ],
    ids=str,
)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size", "block_size", "window"),
    [(32, 8, 128, 16, None), (12, 4, 80, 5, 33), (8, 8, 256, 32, None), (16, 1, 64, 1, 7)],
)
def test_backends_match_the_reference_on_the_gpu(
    backend: type,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    head_size: int,
    block_size: int,
    window: int | None,
) -> None:
    batch = make_batch(
        *MIXED,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_size=head_size,
        block_size=block_size,
        dtype=dtype,
        cache_dtype=cache_dtype,
        padding=5,
        device="cuda",
    )
    fp8 = cache_dtype.itemsize == 1
    ks = torch.tensor(0.02, device="cuda") if fp8 else 1.0
    vs = 0.03 if fp8 else 1.0
    out = forward(backend, batch, window=window, k_scale=ks, v_scale=vs)
    check(batch, out, window=window, ks=ks, vs=vs)


def test_triton_forward_never_synchronises_with_the_host() -> None:
    batch = make_batch(
        *MIXED,
        num_heads=8,
        num_kv_heads=2,
        head_size=64,
        block_size=16,
        dtype=torch.bfloat16,
        cache_dtype=torch.float8_e4m3fn,
        device="cuda",
    )
    ks = torch.tensor(0.02, device="cuda")
    vs = torch.tensor(0.03, device="cuda")
    forward(TritonAttentionBackend, batch, window=None, k_scale=ks, v_scale=vs)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward(TritonAttentionBackend, batch, window=None, k_scale=ks, v_scale=vs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_triton_forward_captures_and_replays_in_a_cuda_graph() -> None:
    """Capture once; replay with new tokens, new lengths and new scales in the same buffers."""
    shapes = {"num_heads": 8, "num_kv_heads": 2, "head_size": 128, "block_size": 16}
    static = make_batch(
        [40, 7, 100],
        [1, 7, 5],
        **shapes,
        dtype=torch.bfloat16,
        cache_dtype=torch.float8_e4m3fn,
        padding=3,
        device="cuda",
        num_blocks=24,
    )
    ks = torch.tensor(0.02, device="cuda")
    vs = torch.tensor(0.03, device="cuda")
    impl = TritonAttentionBackend(8, 128, 2, 128**-0.5, cache_dtype=torch.float8_e4m3fn)

    def step() -> torch.Tensor:
        return impl.forward(
            static.query,
            static.key,
            static.value,
            static.key_cache,
            static.value_cache,
            static.metadata,
            k_scale=ks,
            v_scale=vs,
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()

    # the next step: other lengths and tokens, same shapes (3 sequences, 16 rows)
    nxt = make_batch(
        [41, 12, 3],
        [1, 5, 3],
        **shapes,
        dtype=torch.bfloat16,
        cache_dtype=torch.float8_e4m3fn,
        padding=7,
        device="cuda",
        num_blocks=24,
        seed=7,
    )
    assert nxt.query.shape == static.query.shape
    assert nxt.metadata.block_table.shape[1] <= static.metadata.block_table.shape[1]
    eager_caches = (nxt.key_cache.clone(), nxt.value_cache.clone())
    for name in ("query", "key", "value", "key_cache", "value_cache"):
        getattr(static, name).copy_(getattr(nxt, name))
    for field in ("query_start_loc", "seq_lens", "slot_mapping"):
        getattr(static.metadata, field).copy_(getattr(nxt.metadata, field))
    table = static.metadata.block_table
    table.zero_()
    table[:, : nxt.metadata.block_table.shape[1]].copy_(nxt.metadata.block_table)
    ks.fill_(0.05)
    vs.fill_(0.01)

    graph.replay()
    torch.cuda.synchronize()

    eager = impl.forward(
        nxt.query, nxt.key, nxt.value, *eager_caches, nxt.metadata, k_scale=ks, v_scale=vs
    )
    rows = int(nxt.metadata.query_start_loc[-1])
    torch.testing.assert_close(static_out[:rows], eager[:rows], rtol=0, atol=0)
    assert torch.equal(static.key_cache.view(torch.uint8), eager_caches[0].view(torch.uint8))
    assert torch.equal(static.value_cache.view(torch.uint8), eager_caches[1].view(torch.uint8))
    check(
        Batch(
            nxt.query,
            nxt.key,
            nxt.value,
            static.key_cache,
            static.value_cache,
            AttentionMetadata(
                static.metadata.query_start_loc,
                static.metadata.seq_lens,
                static.metadata.block_table,
                static.metadata.slot_mapping,
            ),
        ),
        static_out,
        window=None,
        ks=0.05,
        vs=0.01,
    )
