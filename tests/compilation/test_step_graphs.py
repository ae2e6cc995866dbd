"""Host step graphs: a step compiled per graph key, driven by the graph abstraction."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import hwplug
from hwplug import ConfigError
from hwplug.compilation import InductorStepBackend, StepGraph, StepGraphWrapper
from hwplug.core.config import CompilationConfig, CUDAGraphMode, EngineConfig
from hwplug.core.graphs import (
    BatchDescriptor,
    CallableGraphBackend,
    GraphWrapper,
    capture_graphs,
    graph_context,
)
from hwplug.platforms.cpu import DEFAULT_STEP_GRAPH_SIZES, STEP_GRAPHS_ENV

FULL = CUDAGraphMode.FULL


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.silu(self.up(x))
        out = self.down(h) + x
        return out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)


def _wrapper(module: torch.nn.Module, backend: Any = None) -> StepGraphWrapper:
    return StepGraphWrapper(module, CompilationConfig(), FULL, backend)


def _capture(wrapper: GraphWrapper, sizes: list[int]) -> list[Any]:
    def run(key: BatchDescriptor) -> None:
        wrapper(torch.randn(key.num_tokens, 8))

    plan = {FULL: [BatchDescriptor(n, True) for n in sizes]}
    return capture_graphs(run, plan, pause_gc=False)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_inductor_backend_is_a_callable_graph_backend() -> None:
    backend = InductorStepBackend()
    assert isinstance(backend, CallableGraphBackend)
    assert backend.options["cpp_wrapper"] is True
    assert InductorStepBackend(cpp_wrapper=False).options["cpp_wrapper"] is False
    # the config's options travel; an explicit cpp_wrapper there wins
    wrapper = StepGraphWrapper(
        _Mlp(), CompilationConfig(inductor_compile_config={"cpp_wrapper": False}), FULL
    )
    assert wrapper.calls_with_inputs
    assert wrapper.backend.options["cpp_wrapper"] is False  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="cpp_wrapper must be True or False"):
        InductorStepBackend(cpp_wrapper="yes")  # type: ignore[arg-type]


@torch.inference_mode()
def test_a_step_graph_computes_what_the_module_does_on_each_call_s_inputs() -> None:
    module = _Mlp().eval()
    wrapper = _wrapper(module)
    captured = _capture(wrapper, [4, 1])
    assert captured == [(FULL, BatchDescriptor(4, True)), (FULL, BatchDescriptor(1, True))]
    assert wrapper.backend.compiles == 2  # type: ignore[attr-defined]
    for n in (4, 1):
        key = BatchDescriptor(n, True)
        for _ in range(3):  # new inputs every call: the graph reads them, not old buffers
            x = torch.randn(n, 8)
            with graph_context(FULL, key):
                got = wrapper(x)
            torch.testing.assert_close(got, module(x), rtol=1e-5, atol=1e-5)
    assert wrapper.backend.compiles == 2  # type: ignore[attr-defined]


@torch.inference_mode()
def test_outside_its_mode_the_wrapper_runs_the_module_itself() -> None:
    module = _Mlp().eval()
    wrapper = _wrapper(module)
    x = torch.randn(3, 8)
    torch.testing.assert_close(wrapper(x), module(x))
    assert wrapper.backend.compiles == 0  # type: ignore[attr-defined]
    with (
        pytest.raises(RuntimeError, match="graph capture is closed"),
        graph_context(FULL, BatchDescriptor(3, True)),
    ):
        wrapper(x)


@torch.inference_mode()
def test_inputs_a_graph_was_not_compiled_for_run_eagerly_and_never_recompile() -> None:
    module = _Mlp().eval()
    wrapper = _wrapper(module)
    _capture(wrapper, [2])
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    x = torch.randn(5, 8)  # not the key's shape
    with graph_context(FULL, BatchDescriptor(2, True)):
        got = wrapper(x)
    torch.testing.assert_close(got, module(x))
    assert wrapper.backend.compiles == 1  # type: ignore[attr-defined]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == frames_before


@torch.inference_mode()
def test_every_key_has_a_cache_of_its_own_past_dynamo_s_recompile_limit() -> None:
    module = _Mlp().eval()
    wrapper = _wrapper(module)
    sizes = [1, 2, 3, 4]
    with torch._dynamo.config.patch(recompile_limit=1):
        before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        captured = _capture(wrapper, sizes)
        after = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert len(captured) == len(sizes)
    assert after - before == len(sizes)  # one compiled graph per key, none refused
    graphs = [wrapper.graph_for(BatchDescriptor(n, True)) for n in sizes]
    assert all(isinstance(g, StepGraph) and g.compile_seconds > 0 for g in graphs)
    assert len({g.key for g in graphs}) == len(sizes)


@torch.inference_mode()
def test_a_key_whose_compilation_fails_is_left_out_of_the_capture(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(InductorStepBackend):
        def capture_call(self, runnable: Any, args: Any, kwargs: Any, *, key: Any) -> Any:
            if key.num_tokens == 2:
                raise RuntimeError("the C++ compiler is out of order")
            return super().capture_call(runnable, args, kwargs, key=key)

    module = _Mlp().eval()
    wrapper = _wrapper(module, Failing())

    def run(key: BatchDescriptor) -> None:
        try:
            wrapper(torch.randn(key.num_tokens, 8))
        except RuntimeError as error:
            logging.getLogger("test").warning("no graph for %s: %s", key, error)

    with caplog.at_level(logging.WARNING):
        captured = capture_graphs(
            run, {FULL: [BatchDescriptor(n, True) for n in (1, 2)]}, pause_gc=False
        )
    assert captured == [(FULL, BatchDescriptor(1, True))]
    assert not wrapper.is_captured(BatchDescriptor(2, True))
    assert "out of order" in caplog.text


# -- the platform's side ----------------------------------------------------------------------
def _resolved(**sections: Any) -> EngineConfig:
    config = EngineConfig(**{"model": {"dtype": "float32"}, **sections})
    return hwplug.resolve(config, platform="cpu").config


def _cpu() -> Any:
    return hwplug.resolve(EngineConfig(model={"dtype": "float32"}), platform="cpu").platform


def test_the_cpu_platform_offers_step_graphs_for_small_decode_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(STEP_GRAPHS_ENV, "1")
    cpu = _cpu()
    assert cpu.step_graph_wrapper_cls() is StepGraphWrapper
    config = _resolved(scheduler={"max_num_seqs": 16})
    assert cpu.step_graph_sizes(config) == DEFAULT_STEP_GRAPH_SIZES == (1,)
    # the reference's sizes for Inductor to specialise for win, within max_num_seqs
    sized = _resolved(scheduler={"max_num_seqs": 16}, compilation={"compile_sizes": [8, 1, 64]})
    assert cpu.step_graph_sizes(sized) == (8, 1)

    default = cpu.step_graph_dispatcher(config)
    assert default is not None
    assert default.dispatch(BatchDescriptor(1, True)) == (FULL, BatchDescriptor(1, True))
    assert default.dispatch(BatchDescriptor(2, True))[0] is CUDAGraphMode.NONE
    assert default.capture_keys()[FULL] == (BatchDescriptor(1, True),)

    four = _resolved(scheduler={"max_num_seqs": 16}, compilation={"compile_sizes": [4, 2, 1]})
    dispatcher = cpu.step_graph_dispatcher(four)
    assert dispatcher is not None
    assert dispatcher.dispatch(BatchDescriptor(3, True)) == (FULL, BatchDescriptor(4, True))
    assert dispatcher.dispatch(BatchDescriptor(1, True)) == (FULL, BatchDescriptor(1, True))
    # prompts and batches above the largest size run on the compiled model
    assert dispatcher.dispatch(BatchDescriptor(3, False))[0] is CUDAGraphMode.NONE
    assert dispatcher.dispatch(BatchDescriptor(5, True))[0] is CUDAGraphMode.NONE
    assert dispatcher.capture_keys()[FULL] == tuple(BatchDescriptor(n, True) for n in (4, 2, 1))


@pytest.mark.parametrize(
    "sections",
    [
        {"compilation": {"level": 0}},
        {"model": {"dtype": "float32", "enforce_eager": True}},
        {"compilation": {"level": 1}},
    ],
    ids=["level-0", "enforce-eager", "level-1"],
)
def test_no_step_graphs_where_inductor_does_not_compile(
    sections: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STEP_GRAPHS_ENV, "1")
    cpu = _cpu()
    config = _resolved(**sections)
    assert cpu.step_graph_sizes(config) == ()
    assert cpu.step_graph_dispatcher(config) is None


def test_the_switch_turns_them_off_and_refuses_other_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = _cpu()
    config = _resolved()
    monkeypatch.setenv(STEP_GRAPHS_ENV, "0")
    assert cpu.step_graph_sizes(config) == ()
    monkeypatch.setenv(STEP_GRAPHS_ENV, "on")
    with pytest.raises(ConfigError, match="HWPLUG_CPU_STEP_GRAPHS='on' is not allowed: 0"):
        cpu.step_graph_sizes(config)


def test_platforms_with_device_graphs_or_without_a_wrapper_have_none() -> None:
    resolution = hwplug.resolve(EngineConfig(model={"dtype": "bfloat16"}), platform="h100")
    cuda, config = resolution.platform, resolution.config
    assert cuda.has_device_graphs()
    assert cuda.step_graph_wrapper_cls() is None
    assert cuda.step_graph_dispatcher(config) is None
