"""The level-3 piecewise backend, run for real on CPU."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

import hwplug
from hwplug.compilation import PiecewiseBackend
from hwplug.compilation.piecewise import CompiledPiece, op_names, split_graph
from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.errors import ConfigError
from hwplug.core.graphs import (
    BatchDescriptor,
    GraphDispatcher,
    capture_graphs,
    graph_context,
)
from hwplug.platforms.cuda import CudaPlatform
from hwplug.platforms.cuda_graphs import CUDAGraphWrapper
from hwplug.testing import RecordingGraphBackend

HIDDEN = 8


def _attention_op() -> Any:
    """``vllm::unified_attention`` (causal attention), registered once per process."""
    try:
        return torch.ops.vllm.unified_attention
    except (AttributeError, RuntimeError):
        pass

    @torch.library.custom_op("vllm::unified_attention", mutates_args=())
    def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[0]
        scores = (q @ k.transpose(0, 1)) / q.shape[-1] ** 0.5
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        return torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v

    @unified_attention.register_fake
    def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(q)

    return torch.ops.vllm.unified_attention


ATTENTION = _attention_op()


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x + self.out(ATTENTION(q, k, v))


class TinyModel(torch.nn.Module):
    """Embedding-ish prologue, ``layers`` attention layers, an epilogue."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 2
        for layer in self.layers:
            x = layer(x)
        return torch.relu(x)


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def level3(**kwargs: Any) -> CompilationConfig:
    config = CompilationConfig(level=3, use_inductor=False, **kwargs)
    config.set_splitting_ops_for_v1()
    return config


def inputs(n: int) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(n))


# -- op names and splitting --------------------------------------------------------------


def test_op_names_cover_packets_and_overloads() -> None:
    assert op_names(ATTENTION) == {"vllm.unified_attention", "vllm.unified_attention.default"}
    assert op_names(ATTENTION.default) == {
        "vllm.unified_attention",
        "vllm.unified_attention.default",
    }
    assert op_names(torch.relu) == frozenset()
    assert op_names("relu") == frozenset()


def positions(names: list[str], subset: list[str]) -> list[int]:
    """Where the pieces of ``subset`` stand among ``names`` (not torch's piece names)."""
    return [names.index(name) for name in subset]


def test_split_graph_isolates_each_splitting_op() -> None:
    gm = torch.fx.symbolic_trace(TinyModel())
    split_gm, names, splitting = split_graph(gm, ["vllm.unified_attention"])
    assert len(names) == 5
    assert positions(names, splitting) == [1, 3]
    for name in splitting:
        calls = [n for n in getattr(split_gm, name).graph.nodes if n.op == "call_function"]
        assert len(calls) == 1
    x = inputs(4)
    torch.testing.assert_close(split_gm(x), gm(x))


class OverloadModel(TinyModel):
    """Calls the attention op through its ``.default`` overload."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.layers[0].qkv(x).chunk(3, dim=-1)
        return ATTENTION.default(q, k, v) + 1


@pytest.mark.parametrize(
    "spelling",
    [
        "vllm.unified_attention",
        "vllm::unified_attention",
        "vllm.unified_attention.default",
        "vllm::unified_attention.default",
    ],
)
@pytest.mark.parametrize("model_cls", [TinyModel, OverloadModel])
def test_split_graph_accepts_every_spelling(spelling: str, model_cls: type[TinyModel]) -> None:
    gm = torch.fx.symbolic_trace(model_cls(layers=1))
    _, names, splitting = split_graph(gm, [spelling])
    assert positions(names, splitting) == [1]
    assert len(names) == 3


def test_other_overload_names_do_not_match() -> None:
    gm = torch.fx.symbolic_trace(TinyModel(layers=1))
    _, names, splitting = split_graph(gm, ["vllm.unified_attention.out", "vllm.other_op"])
    assert splitting == []
    assert len(names) == 1


def test_no_splitting_ops_means_one_piece() -> None:
    gm = torch.fx.symbolic_trace(TinyModel())
    _, names, splitting = split_graph(gm, [])
    assert len(names) == 1
    assert splitting == []


# -- the backend -------------------------------------------------------------------------


def test_init_backend_at_level_3_is_the_piecewise_backend() -> None:
    config = level3()
    backend = config.init_backend()
    assert isinstance(backend, PiecewiseBackend)
    assert backend.compilation_config is config
    assert backend.num_pieces == 0


def test_compiled_model_matches_eager_with_five_pieces() -> None:
    model = TinyModel(layers=2)
    backend = level3().init_backend()
    compiled = torch.compile(model, backend=backend)
    for n in (4, 7, 1, 4):
        x = inputs(n)
        torch.testing.assert_close(compiled(x), model(x))
    assert isinstance(backend, PiecewiseBackend)
    assert backend.num_pieces == 5
    assert positions(backend.piece_names, backend.splitting_piece_names) == [1, 3]
    assert positions(backend.piece_names, backend.compiled_piece_names) == [0, 2, 4]
    assert backend.wrapped_piece_names == []  # CPU has no graph wrapper
    assert backend.split_gm is not None
    assert backend.num_graphs >= 1


def test_backend_called_directly_returns_the_split_module() -> None:
    model = TinyModel(layers=1)
    gm = torch.fx.symbolic_trace(model)
    backend = PiecewiseBackend(level3())
    split = backend(gm, [inputs(3)])
    assert split is backend.split_gm
    assert backend.num_pieces == 3
    x = inputs(5)
    torch.testing.assert_close(split(x), model(x))


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(lambda: level3(splitting_ops=[]), id="empty-splitting-ops"),
        pytest.param(
            lambda: level3(use_inductor_graph_partition=True), id="inductor-graph-partition"
        ),
        pytest.param(lambda: level3(pass_config={"enable_attn_fusion": True}), id="attn-fusion"),
    ],
)
def test_variants_without_an_fx_split_compile_one_piece(
    config: Callable[[], CompilationConfig],
) -> None:
    model = TinyModel()
    backend = PiecewiseBackend(config())
    compiled = torch.compile(model, backend=backend)
    x = inputs(6)
    torch.testing.assert_close(compiled(x), model(x))
    assert backend.num_pieces == 1
    assert backend.splitting_piece_names == []


def test_unfinalised_splitting_ops_default_to_attention_without_touching_the_config() -> None:
    config = CompilationConfig(level=3, use_inductor=False)
    assert config.splitting_ops is None
    backend = PiecewiseBackend(config)
    assert "vllm.unified_attention" in backend.splitting_ops()
    torch.compile(TinyModel(), backend=backend)(inputs(3))
    assert backend.num_pieces == 5
    assert config.splitting_ops is None


def test_custom_splitting_ops_split_elsewhere() -> None:
    config = level3(splitting_ops=["aten.relu"])

    class ReluModel(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.relu(x * 3) + 1

    backend = PiecewiseBackend(config)
    out = torch.compile(ReluModel(), backend=backend)(torch.tensor([-1.0, 2.0]))
    assert torch.equal(out, torch.tensor([1.0, 7.0]))
    assert backend.num_pieces == 3
    assert positions(backend.piece_names, backend.splitting_piece_names) == [1]


# -- wrapping pieces in graph wrappers ---------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "mode", "wrapped"),
    [
        ("h100", "PIECEWISE", True),
        ("mi300x", "FULL_AND_PIECEWISE", True),
        ("h100", "FULL", False),
        ("h100", "FULL_DECODE_ONLY", False),
        ("h100", "NONE", False),
        ("xeon-spr", "PIECEWISE", False),
        ("gaudi2", "PIECEWISE", False),
    ],
)
def test_pieces_are_wrapped_only_for_piecewise_graphs_on_graph_platforms(
    profile: str, mode: str, wrapped: bool
) -> None:
    model = TinyModel()
    with hwplug.use_platform(profile) as platform:
        backend = PiecewiseBackend(level3(cudagraph_mode=mode), platform=platform)
        compiled = torch.compile(model, backend=backend)
        x = inputs(4)
        # No graph context: the wrappers run their pieces eagerly, on CPU too.
        torch.testing.assert_close(compiled(x), model(x))
    if wrapped:
        assert positions(backend.piece_names, backend.wrapped_piece_names) == [0, 2, 4]
        pieces = [backend.pieces[n] for n in backend.wrapped_piece_names]
        assert all(isinstance(p, CUDAGraphWrapper) for p in pieces)
        assert [p.options.weak_ref_output for p in pieces] == [False, False, True]
        assert [p.options.gc_disable for p in pieces] == [False, True, True]
        assert all(p.runtime_mode is CUDAGraphMode.PIECEWISE for p in pieces)
    else:
        assert backend.wrapped_piece_names == []


def test_piecewise_capture_and_replay_end_to_end() -> None:
    """Compile, capture every planned key, then serve padded batches from the graphs."""
    recorder = RecordingGraphBackend()
    config = level3(
        cudagraph_mode="PIECEWISE", cudagraph_num_of_warmups=1, cudagraph_copy_inputs=True
    )
    config.init_with_cudagraph_sizes([1, 2, 4, 8])
    model = TinyModel()
    backend = PiecewiseBackend(
        config, platform=CudaPlatform.simulate("h100"), graph_backend=recorder
    )
    dispatcher = GraphDispatcher(config)

    with hwplug.use_platform("h100"):
        compiled = torch.compile(model, backend=backend, dynamic=True)
        compiled(inputs(3))  # compiles; no context, so no capture
        assert recorder.captures == []
        capture_graphs(
            lambda key: compiled(torch.zeros(key.num_tokens, HIDDEN)),
            dispatcher.capture_keys(),
            num_warmups=1,
        )
        assert len(recorder.captures) == 3 * 4  # three compiled pieces x four sizes
        assert [k.num_tokens for k in recorder.captures[::3]] == [8, 4, 2, 1]

        for n in (1, 3, 5, 8, 9):
            x = inputs(n)
            mode, key = dispatcher.dispatch(BatchDescriptor(n))
            padded = torch.zeros(key.num_tokens, HIDDEN)
            padded[:n] = x
            with graph_context(mode, key):
                out = compiled(padded)[:n]
            torch.testing.assert_close(out, model(x))
    assert len(recorder.captures) == 12
    assert len(recorder.replays) == 3 * 4  # n = 9 is above the largest size: eager


def test_capture_without_a_device_says_how_to_capture_on_cpu() -> None:
    config = level3(cudagraph_mode="PIECEWISE")
    config.init_with_cudagraph_sizes([4])
    backend = PiecewiseBackend(config, platform=CudaPlatform.simulate("h100"))
    compiled = torch.compile(TinyModel(), backend=backend, dynamic=True)
    compiled(inputs(3))
    if torch.cuda.is_available():
        pytest.skip("a real GPU would capture")
    with pytest.raises(RuntimeError, match="RecordingGraphBackend"):
        capture_graphs(
            lambda key: compiled(torch.zeros(key.num_tokens, HIDDEN)),
            GraphDispatcher(config).capture_keys(),
        )


# -- Inductor ----------------------------------------------------------------------------


def test_compile_sizes_get_their_own_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    compiles: list[tuple[str, tuple[Any, ...]]] = []

    def fake_inductor(
        self: PiecewiseBackend, graph: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        sizes = tuple(
            a if isinstance(a, int) else str(a)
            for a in example_inputs
            if not isinstance(a, torch.Tensor)
        )
        compiles.append((str(graph.graph.find_nodes(op="placeholder")[0]), sizes))
        return graph

    monkeypatch.setattr(PiecewiseBackend, "_inductor_compile", fake_inductor)
    config = CompilationConfig(level=3, use_inductor=True, compile_sizes=[4])
    config.init_with_cudagraph_sizes([4, 8])
    config.set_splitting_ops_for_v1()
    model = TinyModel()
    backend = PiecewiseBackend(config)
    compiled = torch.compile(model, backend=backend, dynamic=True)

    torch.testing.assert_close(compiled(inputs(5)), model(inputs(5)))
    general = len(compiles)
    assert general == 3  # one general-shape compile per compiled piece
    assert all("s" in "".join(map(str, c[1])) for c in compiles)  # symbolic sizes
    torch.testing.assert_close(compiled(inputs(4)), model(inputs(4)))
    assert len(compiles) == 6  # first size-4 call: one specialised compile per piece
    assert [c[1] for c in compiles[3:]] == [(4,), (4,), (4,)]
    compiled(inputs(4))
    compiled(inputs(6))
    assert len(compiles) == 6
    piece = backend.pieces[backend.compiled_piece_names[0]]
    assert isinstance(piece, CompiledPiece)
    assert set(piece.specialised) == {4}


def test_unknown_inductor_options_are_a_config_error_at_init_backend() -> None:
    config = CompilationConfig(
        level=3, use_inductor=True, inductor_compile_config={"no_such_option": 1}
    )
    with pytest.raises(ConfigError, match=r"compilation\.inductor_compile_config.*no_such_option"):
        config.init_backend()
    # Without Inductor the options are not used, so not checked.
    PiecewiseBackend(
        CompilationConfig(level=3, use_inductor=False, inductor_compile_config={"x": 1})
    )


def test_inductor_compiles_the_pieces_for_real() -> None:
    model = TinyModel(layers=1)
    config = CompilationConfig(level=3, use_inductor=True)
    config.set_splitting_ops_for_v1()
    backend = PiecewiseBackend(config)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = inputs(4)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert backend.num_pieces == 3
    assert all(isinstance(backend.pieces[n], CompiledPiece) for n in backend.compiled_piece_names)


def test_repr_summarises_the_latest_graph() -> None:
    backend = PiecewiseBackend(level3())
    torch.compile(TinyModel(), backend=backend)(inputs(2))
    assert "pieces=5" in repr(backend)
    assert "splitting=2" in repr(backend)
    assert len(copy.copy(backend.piece_names)) == 5


def test_a_float_computed_for_a_splitting_op_is_computed_in_its_piece() -> None:
    """A compiled piece cannot return a Python float: a float that only feeds a splitting
    op (a module's float attribute read back with item()) goes with the op."""
    import torch

    from hwplug.compilation.piecewise import split_graph

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    t = graph.placeholder("t")
    scale = graph.call_method("item", (t,))
    scale.meta["example_value"] = 0.5
    y = graph.call_function(torch.ops.aten.relu.default, (x,))
    z = graph.call_function(torch.ops.aten.mul.Scalar, (y, scale))
    w = graph.call_function(torch.ops.aten.relu.default, (z,))
    graph.output(w)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    split_gm, names, splitting = split_graph(gm, ["aten.mul"])
    assert len(splitting) == 1
    assert "item" in getattr(split_gm, splitting[0]).code
    first = getattr(split_gm, names[0]).code
    assert "item" not in first
    out = split_gm(torch.tensor([-1.0, 2.0]), torch.tensor(3.0))
    assert out.tolist() == [0.0, 6.0]
