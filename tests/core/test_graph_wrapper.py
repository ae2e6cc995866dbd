"""Graph wrapper bookkeeping on CPU (RecordingGraphBackend), and the device backends' CPU parts."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

import pytest
import torch

import hwplug
from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.graphs import (
    BatchDescriptor,
    GraphBackend,
    GraphDispatcher,
    GraphOptions,
    GraphWrapper,
    capture_graphs,
    capture_phase,
    graph_context,
    is_capture_enabled,
)
from hwplug.platforms import cuda_graphs
from hwplug.platforms.cuda_graphs import CudaGraphBackend, CUDAGraphWrapper, non_owning_alias
from hwplug.platforms.hpu import graphs as hpu_graphs
from hwplug.platforms.hpu.graphs import HpuGraphBackend, HPUGraphWrapper
from hwplug.testing import RecordingGraphBackend

NONE = CUDAGraphMode.NONE
PIECEWISE = CUDAGraphMode.PIECEWISE
FULL = CUDAGraphMode.FULL
K4, K8 = BatchDescriptor(4), BatchDescriptor(8)


def cfg(warmups: int = 0, copy_inputs: bool = False) -> CompilationConfig:
    return CompilationConfig(cudagraph_num_of_warmups=warmups, cudagraph_copy_inputs=copy_inputs)


class Counting:
    """A runnable that counts its calls: ``x * 2 + 1``."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2 + 1


@pytest.fixture
def backend() -> RecordingGraphBackend:
    return RecordingGraphBackend()


def test_recording_backend_satisfies_the_protocol(backend: RecordingGraphBackend) -> None:
    assert isinstance(backend, GraphBackend)


# -- construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode", [NONE, CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY]
)
def test_wrapper_mode_must_be_full_or_piecewise(
    mode: CUDAGraphMode, backend: RecordingGraphBackend
) -> None:
    with pytest.raises(ValueError, match="runtime_mode"):
        GraphWrapper(Counting(), cfg(), mode, backend)


def test_plain_wrapper_needs_a_backend() -> None:
    with pytest.raises(ValueError, match="GraphWrapper needs a backend"):
        GraphWrapper(Counting(), cfg(), FULL)


def test_wrapper_needs_a_callable(backend: RecordingGraphBackend) -> None:
    with pytest.raises(ValueError, match="needs a callable runnable"):
        GraphWrapper(42, cfg(), FULL, backend)  # type: ignore[arg-type]


def test_wrapper_accepts_the_mode_by_name(backend: RecordingGraphBackend) -> None:
    assert GraphWrapper(Counting(), cfg(), "piecewise", backend).runtime_mode is PIECEWISE


# -- eager passthrough -------------------------------------------------------------------


def test_outside_a_graph_context_the_runnable_runs_eagerly(
    backend: RecordingGraphBackend,
) -> None:
    run = Counting()
    w = GraphWrapper(run, cfg(), FULL, backend)
    x = torch.ones(4)
    assert torch.equal(w(x), x * 2 + 1)
    with graph_context(NONE):
        w(x)
    assert run.calls == 2
    assert backend.events == []


def test_a_context_of_another_mode_runs_eagerly(backend: RecordingGraphBackend) -> None:
    run = Counting()
    w = GraphWrapper(run, cfg(), FULL, backend)
    with capture_phase(), graph_context(PIECEWISE, K4):
        w(torch.ones(4))
    assert run.calls == 1
    assert backend.events == []
    assert w.captured_keys == ()


# -- warm-up, capture, replay ------------------------------------------------------------


def test_warmups_then_one_capture_then_replays(backend: RecordingGraphBackend) -> None:
    run = Counting()
    w = GraphWrapper(run, cfg(warmups=2), FULL, backend)
    x = torch.arange(4.0)
    with capture_phase(), graph_context(FULL, K4):
        w(x)
        w(x)
        assert backend.captures == []
        assert run.calls == 2
        out = w(x)
        assert backend.captures == [K4]
        assert torch.equal(out, x * 2 + 1)
    with graph_context(FULL, K4):
        assert torch.equal(w(x), x * 2 + 1)
        w(x)
    assert backend.captures == [K4]
    assert backend.replays == [K4, K4]
    assert w.captured_keys == (K4,)
    assert w.is_captured(K4)
    assert not w.is_captured(K8)


def test_each_key_is_captured_once(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(), PIECEWISE, backend)
    with capture_phase():
        for key in (K8, K4, K8, K4, K8):
            with graph_context(PIECEWISE, key):
                w(torch.zeros(key.num_tokens))
    assert backend.captures == [K8, K4]
    assert backend.replays == [K8, K4, K8]
    assert w.captured_keys == (K8, K4)


def test_uniform_and_non_uniform_keys_are_different_graphs(
    backend: RecordingGraphBackend,
) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend)
    with capture_phase():
        for key in (BatchDescriptor(4, True), BatchDescriptor(4, False)):
            with graph_context(FULL, key):
                w(torch.zeros(4))
    assert backend.captures == [BatchDescriptor(4, True), BatchDescriptor(4, False)]


def test_all_captures_share_one_pool(backend: RecordingGraphBackend) -> None:
    a = GraphWrapper(Counting(), cfg(), FULL, backend)
    b = GraphWrapper(Counting(), cfg(), FULL, backend)
    with capture_phase():
        for key in (K8, K4):
            with graph_context(FULL, key):
                a(torch.zeros(key.num_tokens))
                b(torch.zeros(key.num_tokens))
    assert len(backend.graphs) == 4
    assert {id(g.pool) for g in backend.graphs} == {id(backend.pool)}
    # Each wrapper asks for the pool once, at its first capture.
    assert backend.pool_requests == 2


def test_no_pool_is_requested_before_the_first_capture(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(warmups=1), FULL, backend)
    with capture_phase(), graph_context(FULL, K4):
        w(torch.zeros(4))
    assert backend.pool_requests == 0


# -- the capture phase -------------------------------------------------------------------


def test_capture_outside_the_capture_phase_is_an_error(backend: RecordingGraphBackend) -> None:
    run = Counting()
    w = GraphWrapper(run, cfg(warmups=1), FULL, backend)
    with (
        graph_context(FULL, K4),
        pytest.raises(RuntimeError, match="graph capture is closed") as info,
    ):
        w(torch.zeros(4))
    assert str(K4) in str(info.value)
    assert run.calls == 0
    assert backend.events == []


def test_captured_graphs_replay_after_the_phase_closes(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend)
    with capture_phase(), graph_context(FULL, K4):
        w(torch.zeros(4))
    assert not is_capture_enabled()
    with graph_context(FULL, K4):
        w(torch.zeros(4))
    with graph_context(FULL, K8), pytest.raises(RuntimeError, match="capture is closed"):
        w(torch.zeros(8))
    assert backend.replays == [K4]


# -- static inputs -----------------------------------------------------------------------


def test_copy_inputs_copies_new_values_into_the_static_buffer(
    backend: RecordingGraphBackend,
) -> None:
    w = GraphWrapper(Counting(), cfg(copy_inputs=True), FULL, backend)
    first = torch.zeros(4)
    with capture_phase(), graph_context(FULL, K4):
        w(first)
    static = w.static_inputs(K4)[0][0]
    assert static.data_ptr() != first.data_ptr()
    other = torch.arange(4.0)
    with graph_context(FULL, K4):
        out = w(other)
    assert torch.equal(out, other * 2 + 1)
    assert torch.equal(static, other)
    assert torch.equal(first, torch.zeros(4))  # the caller's tensor is never written


def test_copy_inputs_rejects_an_unpadded_input(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(copy_inputs=True), FULL, backend)
    with capture_phase(), graph_context(FULL, K4):
        w(torch.zeros(4))
    with graph_context(FULL, K4), pytest.raises(RuntimeError, match=r"shape \(3,\)"):
        w(torch.zeros(3))


def test_copy_inputs_handles_tensor_keyword_arguments(backend: RecordingGraphBackend) -> None:
    def run(x: torch.Tensor, *, scale: torch.Tensor, bias: float) -> torch.Tensor:
        return x * scale + bias

    w = GraphWrapper(run, cfg(copy_inputs=True), FULL, backend)
    with capture_phase(), graph_context(FULL, K4):
        w(torch.ones(4), scale=torch.full((4,), 2.0), bias=1.0)
    with graph_context(FULL, K4):
        out = w(torch.ones(4), scale=torch.full((4,), 5.0), bias=1.0)
    assert torch.equal(out, torch.full((4,), 6.0))


def test_without_copy_the_caller_updates_the_captured_buffer_in_place(
    backend: RecordingGraphBackend,
) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend, options=GraphOptions(debug=True))
    buffer = torch.zeros(4)
    with capture_phase(), graph_context(FULL, K4):
        w(buffer)
    buffer.copy_(torch.arange(4.0))
    with graph_context(FULL, K4):
        assert torch.equal(w(buffer), torch.arange(4.0) * 2 + 1)


def test_debug_mode_catches_a_moved_input(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend, options=GraphOptions(debug=True))
    with capture_phase(), graph_context(FULL, K4):
        w(torch.zeros(4))
    with graph_context(FULL, K4), pytest.raises(RuntimeError, match="cudagraph_copy_inputs=True"):
        w(torch.zeros(4))


def test_without_debug_addresses_are_not_checked(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend, options=GraphOptions(debug=False))
    captured = torch.zeros(4)
    with capture_phase(), graph_context(FULL, K4):
        w(captured)
    with graph_context(FULL, K4):
        # The graph reads the buffer it was captured with, as a device graph would.
        assert torch.equal(w(torch.ones(4)), torch.ones(4))


def test_debug_defaults_to_the_logger_level(
    backend: RecordingGraphBackend, caplog: pytest.LogCaptureFixture
) -> None:
    assert not GraphWrapper(Counting(), cfg(), FULL, backend).debug
    caplog.set_level("DEBUG", logger="hwplug.core.graphs")
    assert GraphWrapper(Counting(), cfg(), FULL, backend).debug


# -- options -----------------------------------------------------------------------------


def test_weak_ref_output_keeps_only_the_backends_alias(backend: RecordingGraphBackend) -> None:
    strong = GraphWrapper(Counting(), cfg(), FULL, backend)
    weak = GraphWrapper(
        Counting(), cfg(), FULL, backend, options=GraphOptions(weak_ref_output=True)
    )
    with capture_phase(), graph_context(FULL, K4):
        strong(torch.zeros(4))
        assert backend.weak_refs == 0
        weak(torch.zeros(4))
    assert backend.weak_refs == 1


def test_gc_disable_makes_collection_a_no_op_during_capture(
    backend: RecordingGraphBackend,
) -> None:
    seen: list[object] = []

    def run(x: torch.Tensor) -> torch.Tensor:
        seen.append(gc.collect)
        return x

    original = gc.collect
    w = GraphWrapper(run, cfg(), FULL, backend, options=GraphOptions(gc_disable=True))
    with capture_phase(), graph_context(FULL, K4):
        w(torch.zeros(4))
    assert seen[0] is not original
    assert gc.collect is original


def test_capture_errors_propagate_and_leave_the_key_uncaptured(
    backend: RecordingGraphBackend,
) -> None:
    calls = {"n": 0}

    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("kernel failed")
        return x

    w = GraphWrapper(flaky, cfg(), FULL, backend)
    with capture_phase(), graph_context(FULL, K4):
        with pytest.raises(RuntimeError, match="kernel failed"):
            w(torch.zeros(4))
        assert not w.is_captured(K4)
        w(torch.zeros(4))
    assert w.is_captured(K4)


# -- nesting -----------------------------------------------------------------------------


class TwoPieces:
    """A "model" of two piecewise-wrapped pieces, itself wrapped FULL."""

    def __init__(self, backend: GraphBackend, config: CompilationConfig) -> None:
        self.piece_runs = [Counting(), Counting()]
        self.pieces = [GraphWrapper(p, config, PIECEWISE, backend) for p in self.piece_runs]
        self.model = GraphWrapper(self.forward, config, FULL, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pieces[1](self.pieces[0](x))


def test_full_wrapper_nests_piecewise_wrappers(backend: RecordingGraphBackend) -> None:
    m = TwoPieces(backend, cfg())
    x = torch.ones(4)
    with capture_phase():
        with graph_context(PIECEWISE, K4):
            assert torch.equal(m.model(x), (x * 2 + 1) * 2 + 1)
        # Each piece captured the key; the FULL wrapper ran eagerly.
        assert [w.captured_keys for w in m.pieces] == [(K4,), (K4,)]
        assert m.model.captured_keys == ()
        with graph_context(FULL, K4):
            m.model(x)
    # The FULL capture ran the pieces eagerly inside it (no nested capture).
    assert m.model.captured_keys == (K4,)
    assert backend.captures == [K4, K4, K4]
    with graph_context(FULL, K4):
        m.model(x)
    with graph_context(PIECEWISE, K4):
        m.model(x)
    assert backend.replays == [K4, K4, K4]


# -- capture_graphs ----------------------------------------------------------------------


def test_capture_graphs_goes_piecewise_first_then_largest_first(
    backend: RecordingGraphBackend,
) -> None:
    m = TwoPieces(backend, cfg(warmups=1))
    plan = {
        FULL: [BatchDescriptor(2, True), BatchDescriptor(8, True)],
        PIECEWISE: [BatchDescriptor(2), BatchDescriptor(16), BatchDescriptor(8)],
    }
    done = capture_graphs(lambda key: m.model(torch.zeros(key.num_tokens)), plan, num_warmups=1)
    assert done == [
        (PIECEWISE, BatchDescriptor(16)),
        (PIECEWISE, BatchDescriptor(8)),
        (PIECEWISE, BatchDescriptor(2)),
        (FULL, BatchDescriptor(8, True)),
        (FULL, BatchDescriptor(2, True)),
    ]
    assert [k.num_tokens for k in m.pieces[0].captured_keys] == [16, 8, 2]
    assert m.model.captured_keys == (BatchDescriptor(8, True), BatchDescriptor(2, True))
    assert not is_capture_enabled()
    assert gc.isenabled()
    # One warm-up per key and wrapper, then one capture: the pieces ran eagerly
    # twice per FULL key (warm-up + inside the FULL capture).
    assert m.piece_runs[0].calls == 3 * 2 + 2 * 2


def test_capture_graphs_skips_none_and_deduplicates(backend: RecordingGraphBackend) -> None:
    w = GraphWrapper(Counting(), cfg(), FULL, backend)
    done = capture_graphs(lambda key: w(torch.zeros(key.num_tokens)), {NONE: [K4], FULL: [K4, K4]})
    assert done == [(FULL, K4)]
    assert backend.captures == [K4]


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_capture_graphs_rejects_bad_warmup_counts(bad: object) -> None:
    with pytest.raises(ValueError, match="num_warmups"):
        capture_graphs(lambda key: None, {FULL: [K4]}, num_warmups=bad)  # type: ignore[arg-type]


def test_capture_graphs_restores_state_after_a_failure(backend: RecordingGraphBackend) -> None:
    def boom(key: BatchDescriptor) -> None:
        raise RuntimeError("dummy run failed")

    with pytest.raises(RuntimeError, match="dummy run failed"):
        capture_graphs(boom, {FULL: [K4]})
    assert not is_capture_enabled()
    assert gc.isenabled()


def test_dispatcher_capture_and_serving_end_to_end(backend: RecordingGraphBackend) -> None:
    """Capture what the dispatcher plans, then serve batches of every size with graphs."""
    config = CompilationConfig(
        level=3,
        cudagraph_mode="FULL_AND_PIECEWISE",
        cudagraph_num_of_warmups=1,
        cudagraph_copy_inputs=True,
    )
    config.init_with_cudagraph_sizes([1, 2, 4, 8])
    dispatcher = GraphDispatcher(config, max_num_seqs=4)
    m = TwoPieces(backend, config)

    def padded_run(key: BatchDescriptor) -> torch.Tensor:
        return m.model(torch.zeros(key.num_tokens))

    capture_graphs(padded_run, dispatcher.capture_keys(), num_warmups=1)
    captured = len(backend.captures)
    for n in range(0, 12):
        for uniform in (False, True):
            x = torch.arange(float(n))
            mode, key = dispatcher.dispatch(BatchDescriptor(n, uniform))
            padded = torch.zeros(key.num_tokens)
            padded[:n] = x
            with graph_context(mode, key):
                out = m.model(padded)[:n]
            assert torch.equal(out, (x * 2 + 1) * 2 + 1)
    assert len(backend.captures) == captured  # nothing captured while serving
    assert backend.replays


# -- device backends: the parts that run without the device ------------------------------


def test_non_owning_alias_shares_memory_and_structure() -> None:
    base = torch.arange(6.0).reshape(2, 3)
    out = {"a": base[:, 1:], "b": [base, 7]}
    alias = non_owning_alias(out)
    assert alias["b"][1] == 7
    assert alias["a"].data_ptr() == base[:, 1:].data_ptr()
    assert alias["a"].stride() == base[:, 1:].stride()
    base.add_(1)
    assert torch.equal(alias["a"], base[:, 1:])
    assert torch.equal(alias["b"][0], base)


def test_cuda_wrapper_binds_the_shared_cuda_backend_without_touching_cuda() -> None:
    w = CUDAGraphWrapper(Counting(), cfg(), PIECEWISE)
    assert w.backend is CudaGraphBackend.shared()
    assert isinstance(w.backend, GraphBackend)
    assert torch.equal(w(torch.ones(2)), torch.full((2,), 3.0))  # eager outside a context


def test_hpu_backend_without_habana_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "habana_frameworks", None)
    monkeypatch.setattr(HPUGraphWrapper, "_shared", None)
    with pytest.raises(RuntimeError, match=r"habana_frameworks\.torch"):
        HpuGraphBackend()
    with pytest.raises(RuntimeError, match="cudagraph_mode=NONE"):
        HPUGraphWrapper(Counting(), cfg(), FULL)


@pytest.fixture
def fake_habana(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in for habana_frameworks.torch.hpu whose graphs re-run the captured code."""
    log: list[str] = []

    class HPUGraph:
        def capture_begin(self) -> None:
            log.append("begin")

        def capture_end(self) -> None:
            log.append("end")

        def replay(self) -> None:
            log.append("replay")

    class Stream:
        pass

    class StreamContext:
        def __init__(self, stream: Stream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            log.append("stream")

        def __exit__(self, *exc: Any) -> None:
            return None

    hpu = types.ModuleType("habana_frameworks.torch.hpu")
    hpu.HPUGraph = HPUGraph  # type: ignore[attr-defined]
    hpu.Stream = Stream  # type: ignore[attr-defined]
    hpu.stream = StreamContext  # type: ignore[attr-defined]
    hpu.synchronize = lambda: log.append("sync")  # type: ignore[attr-defined]
    root = types.ModuleType("habana_frameworks")
    torch_pkg = types.ModuleType("habana_frameworks.torch")
    root.torch = torch_pkg  # type: ignore[attr-defined]
    torch_pkg.hpu = hpu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "habana_frameworks", root)
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch", torch_pkg)
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch.hpu", hpu)
    monkeypatch.setattr(HPUGraphWrapper, "_shared", None)
    return types.SimpleNamespace(log=log)


def test_hpu_backend_captures_with_hpu_graphs(fake_habana: types.SimpleNamespace) -> None:
    w = HPUGraphWrapper(Counting(), cfg(), FULL)
    assert isinstance(w.backend, HpuGraphBackend)
    assert w.backend.graph_pool_handle() is None
    with capture_phase(), graph_context(FULL, K4):
        out = w(torch.ones(4))
    assert torch.equal(out, torch.full((4,), 3.0))
    assert fake_habana.log == ["stream", "begin", "end", "replay"]
    with graph_context(FULL, K4):
        assert w(torch.ones(4)) is out
    assert fake_habana.log[-1] == "replay"
    w.backend.synchronize()
    assert fake_habana.log[-1] == "sync"
    assert HPUGraphWrapper(Counting(), cfg(), FULL).backend is w.backend


def test_hpu_capture_ends_even_when_the_model_fails(fake_habana: types.SimpleNamespace) -> None:
    def fail(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("bad op")

    w = HPUGraphWrapper(fail, cfg(), FULL)
    with capture_phase(), graph_context(FULL, K4), pytest.raises(RuntimeError, match="bad op"):
        w(torch.ones(4))
    assert fake_habana.log == ["stream", "begin", "end"]


@pytest.mark.parametrize(
    ("profile", "wrapper"),
    [
        ("h100", CUDAGraphWrapper),
        ("mi300x", CUDAGraphWrapper),
        ("gaudi2", HPUGraphWrapper),
        ("xeon-spr", None),
        ("max-1550", None),
    ],
)
def test_platforms_hand_out_their_graph_wrapper(profile: str, wrapper: type | None) -> None:
    with hwplug.use_platform(profile) as platform:
        assert platform.graph_wrapper_cls() is wrapper


def test_graph_backend_modules_import_no_device_stack() -> None:
    assert cuda_graphs.__all__ and hpu_graphs.__all__
    assert "habana_frameworks" not in sys.modules or sys.modules["habana_frameworks"] is None
