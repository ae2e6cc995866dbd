"""CUDA graphs on a real GPU (CUDA or ROCm): capture, replay, shared pool, piecewise capture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import hwplug
from hwplug.compilation.piecewise import PiecewiseBackend
from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.graphs import (
    BatchDescriptor,
    GraphDispatcher,
    GraphOptions,
    capture_graphs,
    capture_phase,
    graph_context,
)
from hwplug.platforms.cuda_graphs import CudaGraphBackend, CUDAGraphWrapper

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]

FULL = CUDAGraphMode.FULL
PIECEWISE = CUDAGraphMode.PIECEWISE
HIDDEN = 64


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch.cuda.synchronize()


def graphs_config(**kwargs: object) -> CompilationConfig:
    config = CompilationConfig(level=3, **kwargs)  # type: ignore[arg-type]
    config.init_with_cudagraph_sizes([1, 2, 4, 8, 16])
    return config


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


def test_backend_captures_and_replays_on_the_device() -> None:
    backend = CudaGraphBackend()
    static = torch.ones(8, device="cuda")
    graph, out = backend.capture(
        lambda: static * 3 + 1, pool=backend.graph_pool_handle(), key=BatchDescriptor(8)
    )
    assert isinstance(graph, torch.cuda.CUDAGraph)
    torch.testing.assert_close(out, torch.full((8,), 4.0, device="cuda"))  # real values at capture
    static.fill_(2.0)
    replayed = backend.replay(graph, out)
    backend.synchronize()
    assert replayed is out
    torch.testing.assert_close(out, torch.full((8,), 7.0, device="cuda"))


def test_one_pool_per_process() -> None:
    a, b = CudaGraphBackend(), CudaGraphBackend()
    assert a.graph_pool_handle() == b.graph_pool_handle()
    assert CudaGraphBackend.shared() is CudaGraphBackend.shared()


def test_wrapper_serves_dispatched_batches_from_graphs() -> None:
    model = Mlp().cuda()
    config = graphs_config(
        cudagraph_mode="FULL", cudagraph_num_of_warmups=1, cudagraph_copy_inputs=True
    )
    wrapper = CUDAGraphWrapper(model, config, FULL, options=GraphOptions(debug=True))
    dispatcher = GraphDispatcher(config)
    with torch.inference_mode():
        capture_graphs(
            lambda key: wrapper(torch.zeros(key.num_tokens, HIDDEN, device="cuda")),
            dispatcher.capture_keys(),
            num_warmups=1,
        )
        assert [k.num_tokens for k in wrapper.captured_keys] == [16, 8, 4, 2, 1]
        for n in (1, 3, 7, 16, 17):
            x = torch.randn(n, HIDDEN, device="cuda")
            mode, key = dispatcher.dispatch(BatchDescriptor(n))
            padded = torch.zeros(key.num_tokens, HIDDEN, device="cuda")
            padded[:n] = x
            with graph_context(mode, key):
                out = wrapper(padded)[:n].clone()
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


def test_weak_output_aliases_the_graphs_memory() -> None:
    static = torch.ones(4, device="cuda")
    wrapper = CUDAGraphWrapper(
        lambda x: x * 2, graphs_config(), FULL, options=GraphOptions(weak_ref_output=True)
    )
    key = BatchDescriptor(4)
    with capture_phase(), graph_context(FULL, key):
        first = wrapper(static)
    pointer = first.data_ptr()
    del first
    static.fill_(5.0)
    with graph_context(FULL, key):
        again = wrapper(static)
    torch.cuda.synchronize()
    assert again.data_ptr() == pointer
    torch.testing.assert_close(again, torch.full((4,), 10.0, device="cuda"))


def test_piecewise_backend_captures_pieces_on_the_device() -> None:
    try:
        attention = torch.ops.vllm.unified_attention
    except (AttributeError, RuntimeError):

        @torch.library.custom_op("vllm::unified_attention", mutates_args=())
        def attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            n = q.shape[0]
            scores = (q @ k.transpose(0, 1)) / q.shape[-1] ** 0.5
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v

        @attention_impl.register_fake
        def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(q)

        attention = torch.ops.vllm.unified_attention

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
            self.mlp = Mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            return self.mlp(x + attention(q, k, v))

    model = Block().cuda()
    config = graphs_config(
        cudagraph_mode="PIECEWISE",
        use_inductor=False,
        cudagraph_num_of_warmups=1,
        cudagraph_copy_inputs=True,
    )
    config.set_splitting_ops_for_v1()
    backend = PiecewiseBackend(config)
    dispatcher = GraphDispatcher(config)
    with hwplug.use_platform("cuda"), torch.inference_mode():
        compiled = torch.compile(model, backend=backend, dynamic=True)
        compiled(torch.randn(3, HIDDEN, device="cuda"))
        assert backend.wrapped_piece_names == backend.compiled_piece_names
        capture_graphs(
            lambda key: compiled(torch.zeros(key.num_tokens, HIDDEN, device="cuda")),
            dispatcher.capture_keys(),
            num_warmups=1,
        )
        for n in (2, 5, 16):
            x = torch.randn(n, HIDDEN, device="cuda")
            mode, key = dispatcher.dispatch(BatchDescriptor(n))
            assert mode is PIECEWISE
            padded = torch.zeros(key.num_tokens, HIDDEN, device="cuda")
            padded[:n] = x
            with graph_context(mode, key):
                out = compiled(padded)[:n].clone()
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


def test_a_capture_after_every_graph_was_freed_still_works() -> None:
    """The shared pool outlives the graphs: freeing them all must not break the next capture."""
    import gc

    for value in (2.0, 3.0):
        static = torch.ones(4, device="cuda")
        wrapper = CUDAGraphWrapper(lambda x, v=value: x * v, graphs_config(), FULL)
        key = BatchDescriptor(4)
        with capture_phase(), graph_context(FULL, key):
            out = wrapper(static)
        torch.testing.assert_close(out, torch.full((4,), value, device="cuda"))
        del wrapper, out, static
        gc.collect()
        torch.cuda.synchronize()
