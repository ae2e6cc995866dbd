"""``unified_attention(..., out=buffer)``: the op variant that writes into a buffer.

Under piecewise graphs the piece after attention replays reading the buffers
it was captured with; a buffer made inside the compiled piece before the op
keeps one address, so replays read this step's attention.
"""

from __future__ import annotations

import torch

import hwplug
from hwplug.attention import register_unified_attention, unified_attention
from hwplug.compilation import PiecewiseBackend
from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.graphs import BatchDescriptor, capture_graphs, graph_context
from hwplug.platforms.cuda import CudaPlatform
from hwplug.testing import RecordingGraphBackend
from tests.attention.helpers import make_batch

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 32


def test_out_gets_the_same_values_as_the_returning_op() -> None:
    batch = make_batch(
        [7, 3], [2, 3], num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, block_size=4
    )
    args = (batch.query, batch.key, batch.value)
    first = (batch.key_cache.clone(), batch.value_cache.clone())
    second = (batch.key_cache.clone(), batch.value_cache.clone())
    want = unified_attention(*args, *first, batch.metadata, backend="torch", scale=0.5)
    out = torch.empty_like(batch.query)
    got = unified_attention(*args, *second, batch.metadata, backend="torch", scale=0.5, out=out)
    assert got is out
    n = batch.metadata.num_tokens
    torch.testing.assert_close(out[:n], want[:n])
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_a_buffer_over_the_query_or_of_another_dtype_still_gets_the_answer() -> None:
    """The backend writes straight into the buffer only where that is safe: a buffer
    that is the query itself (read to the end) or of another dtype gets a copy."""
    batch = make_batch(
        [9, 5, 3],
        [1, 1, 1],
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD_SIZE,
        block_size=4,
    )
    caches = [(batch.key_cache.clone(), batch.value_cache.clone()) for _ in range(3)]
    args = (batch.key, batch.value)
    want = unified_attention(
        batch.query, *args, *caches[0], batch.metadata, backend="torch", scale=0.5
    )
    query = batch.query.clone()
    got = unified_attention(
        query, *args, *caches[1], batch.metadata, backend="torch", scale=0.5, out=query
    )
    assert got is query
    torch.testing.assert_close(query, want)
    wide = torch.empty(batch.query.shape, dtype=torch.float64)
    unified_attention(
        batch.query, *args, *caches[2], batch.metadata, backend="torch", scale=0.5, out=wide
    )
    torch.testing.assert_close(wide, want.double())


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HEADS * HEAD_SIZE, (HEADS + 2 * KV_HEADS) * HEAD_SIZE)
        self.out = torch.nn.Linear(HEADS * HEAD_SIZE, HEADS * HEAD_SIZE)

    def forward(self, x, key_cache, value_cache, metadata):  # type: ignore[no-untyped-def]
        q, k, v = self.qkv(x).split(
            [HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE], dim=-1
        )
        q = q.view(-1, HEADS, HEAD_SIZE)
        buffer = torch.empty_like(q)
        attn = unified_attention(
            q,
            k.view(-1, KV_HEADS, HEAD_SIZE),
            v.view(-1, KV_HEADS, HEAD_SIZE),
            key_cache,
            value_cache,
            metadata,
            backend="torch",
            scale=HEAD_SIZE**-0.5,
            out=buffer,
        )
        return self.out(attn.view(-1, HEADS * HEAD_SIZE))


def test_piecewise_graphs_replay_this_step_s_attention() -> None:
    register_unified_attention()
    batch = make_batch(
        [5, 9], [5, 1], num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD_SIZE, block_size=4
    )
    n = batch.metadata.num_tokens
    config = CompilationConfig(
        level=3,
        use_inductor=False,
        cudagraph_mode="PIECEWISE",
        splitting_ops=["hwplug.unified_attention_with_output"],
    )
    config.init_with_cudagraph_sizes([n])
    recorder = RecordingGraphBackend()
    backend = PiecewiseBackend(
        config, platform=CudaPlatform.simulate("h100"), graph_backend=recorder
    )
    model = Layer()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    static_x = torch.zeros(n, HEADS * HEAD_SIZE)
    caches = (batch.key_cache.clone(), batch.value_cache.clone())
    key = BatchDescriptor(n)
    with torch.no_grad():
        captured = capture_graphs(
            lambda k: compiled(static_x, *caches, batch.metadata),
            {CUDAGraphMode.PIECEWISE: [key]},
            num_warmups=0,
        )
        assert captured == [(CUDAGraphMode.PIECEWISE, key)]
        assert len(backend.splitting_piece_names) == 1
        for step in range(3):
            x = torch.randn(n, HEADS * HEAD_SIZE, generator=torch.Generator().manual_seed(step))
            static_x.copy_(x)
            eager_caches = (caches[0].clone(), caches[1].clone())
            want = model(x, *eager_caches, batch.metadata)
            with graph_context(CUDAGraphMode.PIECEWISE, key):
                got = compiled(static_x, *caches, batch.metadata)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert recorder.replays  # the pieces replayed; the attention ran between them
    assert hwplug.attention.ops.OP_WITH_OUTPUT_NAME == "hwplug::unified_attention_with_output"
