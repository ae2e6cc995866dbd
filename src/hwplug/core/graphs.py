"""Graph capture and replay, written once for every platform.

* :class:`GraphWrapper` captures a callable once per graph key and replays it,
  against a small :class:`GraphBackend` interface. The device backends (CUDA
  graphs, HPU graphs) live with their platforms
  (:mod:`hwplug.platforms.cuda_graphs`, :mod:`hwplug.platforms.hpu.graphs`);
  :class:`hwplug.testing.RecordingGraphBackend` is the CPU stand-in.
* :func:`graph_context` says which runtime mode and key run now, so a FULL
  wrapper around a whole model can nest PIECEWISE wrappers around its
  pieces: each wrapper captures only when the context's mode is its own.
* :func:`capture_graphs` captures a dispatcher's plan inside the capture phase.
* :class:`CallableGraphBackend` is the other kind of backend: a host graph
  (a step compiled for the key's static shapes, run without per-step Python
  where the device has no graphs, as on CPUs) called with each step's inputs
  instead of replaying static buffers.

Dispatch (:class:`GraphDispatcher`) and mode fitting
(:func:`resolve_runtime_graph_mode`) have modules of their own and are
re-exported here. Nothing here imports torch at import time; capture imports
it lazily to find the tensors among the arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from hwplug.core.config import CUDAGraphMode
from hwplug.core.graph_dispatch import (
    BatchDescriptor,
    GraphDispatcher,
    as_runtime_mode,
    descending,
)
from hwplug.core.graph_modes import AttentionGraphSupport, resolve_runtime_graph_mode

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig

__all__ = [
    "AttentionGraphSupport",
    "BatchDescriptor",
    "CallableGraphBackend",
    "GraphBackend",
    "GraphContext",
    "GraphDispatcher",
    "GraphOptions",
    "GraphWrapper",
    "capture_graphs",
    "capture_phase",
    "current_graph_context",
    "graph_context",
    "is_capture_enabled",
    "resolve_runtime_graph_mode",
    "set_capture_enabled",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# The ambient graph context and the capture phase
# ---------------------------------------------------------------------------


class GraphContext(NamedTuple):
    """The runtime mode and graph key of the step being run."""

    runtime_mode: CUDAGraphMode
    batch_descriptor: BatchDescriptor | None


_NO_GRAPH = GraphContext(CUDAGraphMode.NONE, None)
_GRAPH_CONTEXT: ContextVar[GraphContext] = ContextVar("hwplug_graph_context", default=_NO_GRAPH)


@contextlib.contextmanager
def graph_context(
    runtime_mode: CUDAGraphMode | str,
    batch_descriptor: BatchDescriptor | None = None,
) -> Iterator[GraphContext]:
    """Run the enclosed forward pass with ``runtime_mode`` and graph key ``batch_descriptor``.

    Usually fed straight from :meth:`GraphDispatcher.dispatch`. Graph wrappers
    whose own mode equals ``runtime_mode`` capture or replay the key; every
    other wrapper calls its runnable eagerly. Nests; restores the outer
    context on exit (also per thread and per asyncio task).
    """
    mode = as_runtime_mode(runtime_mode)
    if mode is not CUDAGraphMode.NONE and batch_descriptor is None:
        raise ValueError(f"graph_context({mode.name}) needs the batch_descriptor to use as key")
    ctx = GraphContext(mode, batch_descriptor)
    token = _GRAPH_CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _GRAPH_CONTEXT.reset(token)


def current_graph_context() -> GraphContext:
    """The innermost :func:`graph_context` (runtime mode NONE outside any)."""
    return _GRAPH_CONTEXT.get()


_capture_open: ContextVar[bool] = ContextVar("hwplug_capture_open", default=False)
"""Whether graph capture is open, per thread (and asyncio task): an engine that captures
its device graphs in the foreground while its background compilation builds host step
graphs in another thread must not have one close the other's capture phase."""


def set_capture_enabled(enabled: bool) -> bool:
    """Open or close graph capture in this thread (or asyncio task); returns the previous
    state. A new thread starts closed.

    Capture is closed by default: graphs are captured in a dedicated phase
    before serving, so a graph key first met while serving is an error rather
    than a silent stall.
    """
    previous = _capture_open.get()
    _capture_open.set(bool(enabled))
    return previous


def is_capture_enabled() -> bool:
    """Whether graph capture is currently open in this thread (or asyncio task)."""
    return _capture_open.get()


@contextlib.contextmanager
def capture_phase() -> Iterator[None]:
    """Open graph capture for the enclosed block, then restore the previous state."""
    previous = set_capture_enabled(True)
    try:
        yield
    finally:
        set_capture_enabled(previous)


# What wrappers did during capture_graphs: ("warmup" | "capture", mode, key).
_capture_log: ContextVar[list[tuple[str, CUDAGraphMode, BatchDescriptor]] | None] = ContextVar(
    "hwplug_capture_log", default=None
)
_MAX_WARMUP_ROUNDS = 16


def _note_capture_event(event: str, mode: CUDAGraphMode, key: BatchDescriptor) -> None:
    log = _capture_log.get()
    if log is not None:
        log.append((event, mode, key))


def capture_graphs(
    run: Callable[[BatchDescriptor], object],
    plan: Mapping[CUDAGraphMode, Iterable[BatchDescriptor]],
    *,
    num_warmups: int = 0,
    pause_gc: bool = True,
) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
    """Capture every planned graph, PIECEWISE keys first, each mode largest key first.

    ``run(key)`` runs one forward pass shaped like ``key`` (a dummy batch)
    inside ``graph_context(mode, key)``: ``num_warmups + 1`` times, and again
    while the wrappers are still warming up (``cudagraph_num_of_warmups``)
    without having captured. Largest first lets smaller graphs reuse the
    shared memory pool. Capture is open during the call and the garbage
    collector is paused (unless ``pause_gc`` is False: host graphs built in a
    worker thread while the engine serves). ``plan`` is usually
    :meth:`GraphDispatcher.capture_keys`.

    :returns: The ``(mode, key)`` pairs a wrapper really captured, in order;
        a planned key that no wrapper captured (no wrapper of that mode ran)
        is left out and logged.
    """
    if isinstance(num_warmups, bool) or not isinstance(num_warmups, int) or num_warmups < 0:
        raise ValueError(f"num_warmups must be an integer >= 0, got {num_warmups!r}")
    order = sorted(
        (as_runtime_mode(m) for m in plan), key=lambda m: m is not CUDAGraphMode.PIECEWISE
    )
    keys = [
        (mode, key)
        for mode in order
        if mode is not CUDAGraphMode.NONE
        for key in descending(plan[mode])
    ]
    if keys:
        counts = Counter(mode.name for mode, _ in keys)
        each = ", ".join(f"{n} {name}" for name, n in counts.items())
        logger.info("capturing %d graphs (%s)", len(keys), each)
    started = time.perf_counter()
    done: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
    log: list[tuple[str, CUDAGraphMode, BatchDescriptor]] = []
    token = _capture_log.set(log)
    gc_was_enabled = gc.isenabled() and pause_gc
    if pause_gc:
        gc.collect()
        gc.disable()
    try:
        with capture_phase():
            for number, (mode, key) in enumerate(keys, 1):
                # one record a graph, with the count, for a progress display (at DEBUG:
                # a model may have hundreds)
                logger.debug(
                    "capturing graph %d of %d (%s, %d tokens)",
                    number,
                    len(keys),
                    mode.name,
                    key.num_tokens,
                )
                start = len(log)
                with graph_context(mode, key):
                    for _ in range(num_warmups + 1):
                        run(key)
                    for _ in range(_MAX_WARMUP_ROUNDS):
                        events = {event for event, _, _ in log[start:]}
                        if "capture" in events or "warmup" not in events:
                            break
                        start = len(log)
                        run(key)
                if any(event == "capture" for event, m, k in log if (m, k) == (mode, key)):
                    done.append((mode, key))
                else:
                    logger.debug("no %s graph was captured for %s", mode.name, key)
    finally:
        _capture_log.reset(token)
        if gc_was_enabled:
            gc.enable()
    if keys:
        logger.info("captured %d graphs in %.1f s", len(done), time.perf_counter() - started)
    return done


# ---------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------


@runtime_checkable
class GraphBackend(Protocol):
    """What a device must provide for :class:`GraphWrapper` to capture and replay.

    One instance may serve many wrappers; :meth:`graph_pool_handle` returns
    the same pool to all of them.
    """

    name: str
    """Short name for messages (``"cuda"``, ``"hpu"``, ``"recording"``)."""

    def graph_pool_handle(self) -> Any:
        """The memory pool every capture of this backend shares (per process).

        May initialise the device runtime. None where the device has no pools.
        """
        ...

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        """Capture ``fn()`` into a graph using ``pool``; return ``(graph, output)``.

        ``output`` holds the values of this call (as if ``fn()`` had run
        eagerly) and is the buffer later replays write to.
        """
        ...

    def replay(self, graph: Any, output: Any) -> Any:
        """Replay ``graph``; return the refreshed ``output``."""
        ...

    def weak_ref(self, output: Any) -> Any:
        """An alias of ``output`` that does not keep its memory alive (or ``output``)."""
        ...

    def synchronize(self) -> None:
        """Wait until the device has finished the work queued so far."""
        ...


@runtime_checkable
class CallableGraphBackend(GraphBackend, Protocol):
    """A :class:`GraphBackend` whose graphs are functions of the step's inputs.

    A device graph replays the kernels it recorded on the buffers it recorded
    them with. A host graph (a step compiled ahead for one key's static shapes:
    :class:`hwplug.compilation.InductorStepBackend`) is called with the step's
    tensors instead, so it needs neither static buffers nor copies, and may be
    captured on buffers of its own while the engine serves on others.
    :class:`GraphWrapper` uses these two methods in place of ``capture`` and
    ``replay`` when its backend has them.
    """

    def capture_call(
        self,
        runnable: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        key: BatchDescriptor,
    ) -> tuple[Any, Any]:
        """Build the graph of ``runnable`` for ``key`` and run it on ``args``;
        return ``(graph, output)``."""
        ...

    def call(self, graph: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run ``graph`` on this step's ``args``; return its output."""
        ...


# ---------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GraphOptions:
    """Per-wrapper capture options.

    ``debug`` checks on every replay that uncopied tensor inputs still live at
    the addresses recorded at capture (default: when this module's logger is
    at DEBUG). ``weak_ref_output`` keeps only a non-owning alias of the
    output, which is safe when nothing captured later reads it (the last piece
    of a split graph, a whole model). ``gc_disable`` turns ``gc.collect`` into
    a no-op during capture (it is slow and capture runs many times).
    """

    debug: bool | None = None
    weak_ref_output: bool = False
    gc_disable: bool = False


@dataclasses.dataclass
class _Entry:
    """Capture state of one graph key."""

    warmups: int = 0
    graph: Any = None
    output: Any = None
    static_args: tuple[Any, ...] = ()
    static_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    arg_positions: tuple[int, ...] = ()
    kwarg_names: tuple[str, ...] = ()
    addresses: tuple[int, ...] = ()


@contextlib.contextmanager
def _gc_collect_disabled() -> Iterator[None]:
    original = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = original


class GraphWrapper:
    """Captures ``runnable`` once per graph key and replays it afterwards.

    ``runtime_mode`` (FULL or PIECEWISE) is the mode this wrapper serves: under
    a :func:`graph_context` with another mode (NONE included) the runnable is
    called eagerly. Under its own mode, per key: ``cudagraph_num_of_warmups``
    eager calls, then one capture (only while :func:`capture_phase` is open),
    then replays. Tensor arguments are copied into static buffers before each
    replay when ``cudagraph_copy_inputs`` is set; otherwise the caller must
    pass the same buffers every time (checked in debug mode).

    Subclasses bind a device backend through :meth:`default_backend`.
    """

    def __init__(
        self,
        runnable: Callable[..., Any],
        compilation_config: CompilationConfig,
        runtime_mode: CUDAGraphMode | str,
        backend: GraphBackend | None = None,
        *,
        options: GraphOptions | None = None,
    ) -> None:
        if not callable(runnable):
            raise ValueError(f"GraphWrapper needs a callable runnable, got {runnable!r}")
        mode = as_runtime_mode(runtime_mode)
        if mode is CUDAGraphMode.NONE:
            raise ValueError(
                "GraphWrapper runtime_mode must be FULL or PIECEWISE; NONE means no graph, "
                "so call the runnable directly"
            )
        self.runnable = runnable
        self.compilation_config = compilation_config
        self.runtime_mode: CUDAGraphMode = mode
        self.backend: GraphBackend = backend if backend is not None else self.default_backend()
        self.options = options if options is not None else GraphOptions()
        self.debug = (
            self.options.debug
            if self.options.debug is not None
            else logger.isEnabledFor(logging.DEBUG)
        )
        self.num_warmups = int(compilation_config.cudagraph_num_of_warmups or 0)
        self.copy_inputs = bool(compilation_config.cudagraph_copy_inputs)
        self.calls_with_inputs = isinstance(self.backend, CallableGraphBackend)
        """Whether the backend's graphs take each step's inputs (host graphs): no
        static buffers, no copies, no address checks."""
        self._entries: dict[BatchDescriptor, _Entry] = {}
        self._pool: Any = None
        self._pool_ready = False

    @classmethod
    def default_backend(cls) -> GraphBackend:
        """The backend used when none is passed (device wrappers override this)."""
        raise ValueError(f"{cls.__name__} needs a backend (a GraphBackend instance)")

    # -- introspection ----------------------------------------------------
    @property
    def captured_keys(self) -> tuple[BatchDescriptor, ...]:
        """Keys with a captured graph, in capture order."""
        return tuple(k for k, e in self._entries.items() if e.graph is not None)

    def static_inputs(self, key: BatchDescriptor) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The ``(args, kwargs)`` the graph for ``key`` was captured with: with
        ``cudagraph_copy_inputs`` the static buffers new inputs are copied into.

        :raises KeyError: no graph is captured for ``key``.
        """
        entry = self._entries.get(key)
        if entry is None or entry.graph is None:
            raise KeyError(f"{type(self).__name__} has no graph captured for {key}")
        return entry.static_args, entry.static_kwargs

    def graph_for(self, key: BatchDescriptor) -> Any:
        """The backend's graph for ``key`` (a ``torch.cuda.CUDAGraph``, a
        :class:`~hwplug.compilation.StepGraph`, ...).

        :raises KeyError: no graph is captured for ``key``.
        """
        entry = self._entries.get(key)
        if entry is None or entry.graph is None:
            raise KeyError(f"{type(self).__name__} has no graph captured for {key}")
        return entry.graph

    def is_captured(self, key: BatchDescriptor) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.graph is not None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.runtime_mode.name}, backend={self.backend.name}, "
            f"captured={len(self.captured_keys)})"
        )

    # -- calling ----------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = _GRAPH_CONTEXT.get()
        if ctx[0] is not self.runtime_mode:
            return self.runnable(*args, **kwargs)
        key = ctx[1]
        assert key is not None  # graph_context() requires it for FULL/PIECEWISE
        entry = self._entries.get(key)
        if entry is not None and entry.graph is not None:
            if self.calls_with_inputs:
                return self.backend.call(entry.graph, args, kwargs)  # type: ignore[attr-defined]
            return self._replay(entry, key, args, kwargs)
        if not _capture_open.get():
            raise RuntimeError(
                f"graph capture is closed: {type(self).__name__} ({self.runtime_mode.name}) "
                f"has no graph for {key} and cannot capture one outside the capture phase. "
                "Capture every key the dispatcher can return inside hwplug.core.graphs."
                "capture_phase() (see GraphDispatcher.capture_keys and capture_graphs)"
            )
        if entry is None:
            entry = self._entries[key] = _Entry()
        if entry.warmups < self.num_warmups:
            entry.warmups += 1
            _note_capture_event("warmup", self.runtime_mode, key)
            return self.runnable(*args, **kwargs)
        output = self._capture(entry, key, args, kwargs)
        _note_capture_event("capture", self.runtime_mode, key)
        return output

    def _capture(
        self, entry: _Entry, key: BatchDescriptor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        import torch

        if not self._pool_ready:
            self._pool = self.backend.graph_pool_handle()
            self._pool_ready = True
        if self.calls_with_inputs:
            graph, output = self.backend.capture_call(  # type: ignore[attr-defined]
                self.runnable, args, kwargs, key=key
            )
            entry.graph = graph
            logger.debug("%s built a %s graph for %s", self.backend.name, self.runtime_mode, key)
            return output
        positions = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor))
        names = tuple(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        static_args = list(args)
        static_kwargs = dict(kwargs)
        if self.copy_inputs:
            for i in positions:
                static_args[i] = args[i].clone()
            for name in names:
                static_kwargs[name] = kwargs[name].clone()
        fn = functools.partial(self.runnable, *static_args, **static_kwargs)
        cm = _gc_collect_disabled() if self.options.gc_disable else contextlib.nullcontext()
        with cm:
            graph, output = self.backend.capture(fn, pool=self._pool, key=key)
        entry.graph = graph
        entry.output = self.backend.weak_ref(output) if self.options.weak_ref_output else output
        entry.static_args = tuple(static_args)
        entry.static_kwargs = static_kwargs
        entry.arg_positions = positions
        entry.kwarg_names = names
        entry.addresses = tuple(args[i].data_ptr() for i in positions) + tuple(
            kwargs[n].data_ptr() for n in names
        )
        logger.debug("%s captured %s graph for %s", self.backend.name, self.runtime_mode, key)
        return output

    def _replay(
        self, entry: _Entry, key: BatchDescriptor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self.copy_inputs:
            statics = entry.static_args
            for i in entry.arg_positions:
                self._copy_in(statics[i], args[i], key, f"argument {i}")
            static_kwargs = entry.static_kwargs
            for name in entry.kwarg_names:
                self._copy_in(static_kwargs[name], kwargs[name], key, f"argument {name!r}")
        elif self.debug:
            addresses = tuple(args[i].data_ptr() for i in entry.arg_positions) + tuple(
                kwargs[n].data_ptr() for n in entry.kwarg_names
            )
            if addresses != entry.addresses:
                raise RuntimeError(
                    f"{type(self).__name__}: the tensor inputs for {key} are not the buffers "
                    "the graph was captured with; pass the same static buffers on every step "
                    "or set compilation.cudagraph_copy_inputs=True"
                )
        return self.backend.replay(entry.graph, entry.output)

    @staticmethod
    def _copy_in(static: Any, value: Any, key: BatchDescriptor, what: str) -> None:
        if static.shape != value.shape:
            raise RuntimeError(
                f"graph for {key}: {what} has shape {tuple(value.shape)} but was captured "
                f"with {tuple(static.shape)}; pad inputs to the key's num_tokens"
            )
        static.copy_(value)
