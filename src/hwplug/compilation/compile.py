"""Compiling an engine's model as the resolved compilation config says.

:func:`compile_model` is what an engine calls once its model and KV cache are
built: level 0 returns the model unchanged; levels 1 and 2 wrap it in
``torch.compile`` with the resolved backend (``init_backend()``, Inductor's
options from ``inductor_compile_config``); level 3 uses hwplug's piecewise
backend for the engine's platform, which splits the graph at the attention op
and wraps each compiled piece in the platform's graph wrapper.

Each call compiles a private copy of the model's ``forward`` code. Dynamo
keeps compiled graphs per code object, with a limit of eight
(``recompile_limit``): engines built one after another in one process for
models of other shapes or settings would otherwise pile their graphs onto
the one ``forward`` of the model class and, past eight, fail with
``fullgraph=True``. A private code object gives each engine its own cache,
which goes away with the engine.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hwplug.compilation.serving import prime_compiler

if TYPE_CHECKING:
    import torch

    from hwplug.core.config import EngineConfig
    from hwplug.core.graphs import GraphBackend
    from hwplug.core.platform import Platform

__all__ = ["compile_model"]


def compile_model(
    model: torch.nn.Module,
    config: EngineConfig,
    *,
    platform: Platform,
    graph_backend: GraphBackend | None = None,
    dynamic: bool = True,
) -> Callable[..., Any]:
    """``model`` compiled as ``config.compilation`` says (level 0: ``model`` itself).

    ``config`` is the resolved engine config; ``platform`` the platform it was
    resolved for (the piecewise backend of level 3 captures with its graph
    wrapper, through ``graph_backend`` when given: a test double on CPU
    tensors). The model is compiled whole (``fullgraph=True``) with dynamic
    shapes, so one graph serves every step size.

    :raises ConfigError: the compilation backend cannot be built (see
        :meth:`~hwplug.core.config.CompilationConfig.init_backend`).
    """
    import torch

    comp = config.compilation
    level = int(comp.level or 0)
    if level == 0:
        return model
    backend: Any
    if level == 3:
        # lazy: torch; importing hwplug.compilation stays light
        from hwplug.compilation.piecewise import PiecewiseBackend

        backend = PiecewiseBackend(comp, config, platform=platform, graph_backend=graph_backend)
    else:
        backend = comp.init_backend(config)
    if not (isinstance(backend, str) and backend in ("eager", "aot_eager")):
        # Inductor's process-wide placeholder trace, made now with no thread serving
        # (another engine of the process may be mid-step): see hwplug.compilation.serving
        prime_compiler()
    options = None
    if backend == "inductor" and comp.inductor_compile_config:
        # Levels 1-2 hand Inductor a name: its options travel with torch.compile.
        options = dict(comp.inductor_compile_config)
    forward = _private_forward(model)
    compiled = torch.compile(
        forward, backend=backend, fullgraph=True, dynamic=dynamic, options=options
    )
    return _constant_floats(compiled)


def _constant_floats(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` tracing a model's float attributes (norm epsilons, attention
    scales) as constants.

    With dynamic shapes Dynamo first makes each Python float it meets a symbol,
    then finds that the graph cannot take them as inputs and restarts its whole
    analysis with them specialised: the restart is a third or more of an
    engine's compile time. Specialising them from the start gives the same graph.

    The setting is set and restored by hand around each call (8 us), not with
    ``config.patch`` (about 100 us): every step of the engine pays it.
    """
    import functools

    import torch

    config = torch._dynamo.config

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        before = config.specialize_float
        config.specialize_float = True
        try:
            return compiled(*args, **kwargs)
        finally:
            config.specialize_float = before

    return run


def _entry_for(model: torch.nn.Module | Callable[..., Any]) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return model(*args, **kwargs)  # the module's call: its hooks run too

    return forward


def _private_forward(
    model: torch.nn.Module | Callable[..., Any], name: str | None = None
) -> Callable[..., Any]:
    """A function calling ``model`` whose code object is this model's alone (see the
    module's docstring): Dynamo's graphs for it belong to this model. ``name`` is its
    qualified name in Dynamo's messages (default: the model's class's ``forward``)."""
    entry = _entry_for(model)
    code = entry.__code__.replace()  # equal, but a distinct object: its own Dynamo cache
    private = types.FunctionType(
        code, entry.__globals__, entry.__name__, entry.__defaults__, entry.__closure__
    )
    private.__qualname__ = name or f"{type(model).__qualname__}.forward"
    return private
