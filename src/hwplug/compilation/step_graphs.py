"""Host step graphs: a whole step compiled ahead for one batch shape.

A device graph (a CUDA graph) removes a step's host work by replaying the
kernels it recorded. A CPU has no such graphs, and its host work is Python:
Dynamo checking its guards, Inductor's Python wrapper calling each kernel and
computing the sizes of a dynamic-shape graph, the custom ops' dispatch. Its
counterpart here is a step compiled for one graph key's static shapes, with
Inductor's C++ wrapper: the kernels are called from C++, every size is a
constant, and a step is one call.

:class:`InductorStepBackend` is that backend, written once for every platform
whose device has no graphs: it implements
:class:`~hwplug.core.graphs.CallableGraphBackend`, so the usual
:class:`~hwplug.core.graphs.GraphWrapper`, :class:`~hwplug.core.graphs.GraphDispatcher`
and :func:`~hwplug.core.graphs.capture_graphs` drive it. A platform offers it
through :meth:`hwplug.core.platform.Platform.step_graph_wrapper_cls` (the CPU
platform does; a vendor's CPU platform can return a wrapper on its own backend)
and names the keys with :meth:`~hwplug.core.platform.Platform.step_graph_sizes`.

Each key is compiled once, from a code object of its own (so keys do not share
Dynamo's cache or its recompilation limit), and never again: a call whose
inputs would need another compilation (a shape the key does not have, another
dtype) runs the step's Python eagerly (the same result, slower) instead of
stalling the engine for a recompilation. Engines call a graph only for the
key it was built for, so that is a safety net, not a path a step takes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwplug.compilation.compile import _constant_floats, _private_forward
from hwplug.compilation.serving import prime_compiler
from hwplug.core.graphs import BatchDescriptor, GraphWrapper

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig, CUDAGraphMode
    from hwplug.core.graphs import GraphBackend, GraphOptions

__all__ = ["InductorStepBackend", "StepGraph", "StepGraphWrapper"]

logger = logging.getLogger(__name__)


class StepGraph:
    """One key's compiled step: call it with the step's inputs.

    Calls run Dynamo in run-only mode: the compiled code when the inputs pass
    the key's guards, the step's own Python (eager, the same result) when they
    do not, and never a compilation.
    """

    __slots__ = ("compile_seconds", "compiled", "key", "run")

    def __init__(
        self, compiled: Callable[..., Any], key: BatchDescriptor, compile_seconds: float
    ) -> None:
        import torch

        self.compiled = compiled
        self.key = key
        self.compile_seconds = compile_seconds
        self.run: Callable[..., Any] = torch._dynamo.run(compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return f"StepGraph({self.key}, compiled in {self.compile_seconds:.1f} s)"


class InductorStepBackend:
    """Host graphs from Inductor: each key's step compiled for its static shapes.

    ``InductorStepBackend(inductor_options=None, *, cpp_wrapper=True)``.
    ``inductor_options`` are Inductor's options for every key (usually the
    resolved ``compilation.inductor_compile_config``); ``cpp_wrapper`` calls
    the kernels from generated C++ rather than Python. Python floats (norm
    epsilons, attention scales) are traced as constants.
    """

    name = "inductor-step"

    def __init__(
        self, inductor_options: dict[str, Any] | None = None, *, cpp_wrapper: bool = True
    ) -> None:
        options = dict(inductor_options or {})
        if not isinstance(cpp_wrapper, bool):
            raise ValueError(f"cpp_wrapper must be True or False, got {cpp_wrapper!r}")
        options.setdefault("cpp_wrapper", cpp_wrapper)
        self.options = options
        self.compiles = 0
        """Keys compiled so far (each exactly once)."""

    # -- GraphBackend --------------------------------------------------------------
    def graph_pool_handle(self) -> None:
        """No memory pool: host graphs allocate as eager code does."""
        return None

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        """A graph of ``fn`` alone (no inputs): :meth:`capture_call` with none."""
        graph, output = self.capture_call(fn, (), {}, key=key)
        return graph, output

    def replay(self, graph: Any, output: Any) -> Any:
        """Run a graph captured by :meth:`capture` (it takes no inputs)."""
        return graph()

    def weak_ref(self, output: Any) -> Any:
        return output

    def synchronize(self) -> None:
        """Nothing to wait for: host graphs run synchronously."""

    # -- CallableGraphBackend --------------------------------------------------------
    def capture_call(
        self,
        runnable: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: BatchDescriptor,
    ) -> tuple[StepGraph, Any]:
        """Compile ``runnable`` for ``args``' static shapes and run it once on them."""
        import torch

        # a code object of this key's own: Dynamo keeps graphs (and counts
        # recompilations) per code object
        name = f"step_graph_{key.num_tokens}{'_decode' if key.uniform_decode else ''}"
        entry = _private_forward(runnable, name)
        prime_compiler()  # before Inductor's trace could meet another thread mid-step
        compiled = torch.compile(
            entry, backend="inductor", fullgraph=True, dynamic=False, options=self.options
        )
        started = time.perf_counter()
        output = _constant_floats(compiled)(*args, **kwargs)
        seconds = time.perf_counter() - started
        self.compiles += 1
        logger.info("compiled the step graph for %s in %.1f s", key, seconds)
        return StepGraph(compiled, key, seconds), output

    def call(self, graph: StepGraph, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return graph(*args, **kwargs)

    def __repr__(self) -> str:
        wrapper = self.options["cpp_wrapper"]
        return f"InductorStepBackend(cpp_wrapper={wrapper}, compiles={self.compiles})"


class StepGraphWrapper(GraphWrapper):
    """A :class:`~hwplug.core.graphs.GraphWrapper` of host step graphs.

    Without a ``backend`` it builds an :class:`InductorStepBackend` with the
    config's ``inductor_compile_config``. Platforms return it (or a subclass
    on a backend of their own) from ``Platform.step_graph_wrapper_cls()``.
    """

    def __init__(
        self,
        runnable: Callable[..., Any],
        compilation_config: CompilationConfig,
        runtime_mode: CUDAGraphMode | str = "FULL",
        backend: GraphBackend | None = None,
        *,
        options: GraphOptions | None = None,
    ) -> None:
        if backend is None:
            backend = self.backend_for(compilation_config)
        super().__init__(runnable, compilation_config, runtime_mode, backend, options=options)

    @classmethod
    def backend_for(cls, compilation_config: CompilationConfig) -> GraphBackend:
        """The backend a wrapper builds when given none."""
        return InductorStepBackend(dict(compilation_config.inductor_compile_config or {}))

    @classmethod
    def default_backend(cls) -> GraphBackend:
        return InductorStepBackend()
