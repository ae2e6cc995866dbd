"""Graph-mode dispatch and graph capture/replay, written once for every platform.

Three layers, from the hot path outwards:

* :class:`GraphDispatcher` maps a batch (:class:`BatchDescriptor`) to the
  runtime graph mode and the graph key it should run with. It is built once
  after resolution and does only two list look-ups per call.
* :func:`resolve_runtime_graph_mode` degrades the configured
  ``compilation.cudagraph_mode`` to what the attention backends can capture
  (:class:`AttentionGraphSupport`); it is pure and runs once, before capture.
* :class:`GraphWrapper` captures a callable once per graph key and replays it,
  against a small :class:`GraphBackend` interface. The device backends (CUDA
  graphs, HPU graphs) live in :mod:`hwplug.platforms.graph_backends`;
  :class:`RecordingGraphBackend` is the CPU stand-in that tests use.

Which wrapper runs is decided by the ambient :func:`graph_context`, so a FULL
wrapper around a whole model can nest PIECEWISE wrappers around its pieces:
each wrapper captures only when the context's runtime mode is its own.

Nothing here imports torch at import time; capture imports it lazily to find
the tensors among the arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import gc
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from hwplug.core.config import CUDAGraphMode
from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig

__all__ = [
    "AttentionGraphSupport",
    "BatchDescriptor",
    "GraphBackend",
    "GraphContext",
    "GraphDispatcher",
    "GraphOptions",
    "GraphWrapper",
    "RecordingGraphBackend",
    "capture_graphs",
    "capture_phase",
    "current_graph_context",
    "graph_context",
    "is_capture_enabled",
    "resolve_runtime_graph_mode",
    "set_capture_enabled",
]

logger = logging.getLogger(__name__)

_RUNTIME_MODES = (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)


# ---------------------------------------------------------------------------
# Batch descriptors and dispatch
# ---------------------------------------------------------------------------


class BatchDescriptor(NamedTuple):
    """What a batch looks like to graph dispatch; also the key of a captured graph.

    ``num_tokens`` is the number of tokens in the batch (after padding, when it
    is used as a graph key). ``uniform_decode`` is true when every request in
    the batch has the same query length (1, or 1 + the number of speculative
    tokens). Kept minimal because it is hashed on every step.
    """

    num_tokens: int
    uniform_decode: bool = False

    @property
    def non_uniform(self) -> BatchDescriptor:
        """The same batch with ``uniform_decode=False``."""
        return BatchDescriptor(self.num_tokens, False)


def _as_graph_mode(value: object, field: str = "compilation.cudagraph_mode") -> CUDAGraphMode:
    if value is None:
        return CUDAGraphMode.NONE
    if isinstance(value, CUDAGraphMode):
        return value
    if isinstance(value, str) and value.upper() in CUDAGraphMode.__members__:
        return CUDAGraphMode[value.upper()]
    allowed = ", ".join(CUDAGraphMode.__members__)
    raise ConfigError(f"{field}={value!r} is not a graph mode; use one of: {allowed}")


def _as_runtime_mode(value: object) -> CUDAGraphMode:
    mode = _as_graph_mode(value, "runtime_mode")
    if mode not in _RUNTIME_MODES:
        raise ValueError(
            f"runtime_mode={mode.name} is not a runtime graph mode; use one of: "
            "NONE, PIECEWISE, FULL (FULL_DECODE_ONLY and FULL_AND_PIECEWISE are "
            "configuration modes that dispatch resolves per batch)"
        )
    return mode


def _descending(keys: Iterable[BatchDescriptor]) -> tuple[BatchDescriptor, ...]:
    return tuple(sorted(set(keys), key=lambda k: (k[0], k[1]), reverse=True))


_Dispatch = tuple[CUDAGraphMode, BatchDescriptor]


class GraphDispatcher:
    """Chooses the runtime graph mode and graph key of each batch (SPEC section 7).

    Build it from a resolved compilation config (capture sizes and the padding
    table filled in). A uniform-decode batch takes ``cudagraph_mode.decode_mode()``,
    any other batch ``mixed_mode()``. Batches above ``max_capture_size``, empty
    batches and batches whose side of the mode is NONE run as NONE with the
    batch returned unchanged. Otherwise the key's ``num_tokens`` is the padded
    size and its ``uniform_decode`` flag is kept only on the decode side of a
    separate-routine mode (FULL_DECODE_ONLY, FULL_AND_PIECEWISE).

    With ``max_num_seqs``, a uniform batch whose padded size exceeds
    ``max_num_seqs * uniform_decode_query_len`` tokens takes the mixed route:
    no decode graph is captured above that size.

    Every answer is precomputed here, so :meth:`dispatch` costs two list
    look-ups and allocates nothing for batches that run with a graph.
    """

    __slots__ = (
        "_capture_keys",
        "_decode",
        "_max",
        "_mixed",
        "decode_limit",
        "max_capture_size",
        "mode",
        "uniform_decode_query_len",
    )

    def __init__(
        self,
        compilation_config: CompilationConfig,
        *,
        max_num_seqs: int | None = None,
        uniform_decode_query_len: int = 1,
    ) -> None:
        if max_num_seqs is not None and (
            isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1
        ):
            raise ValueError(
                f"scheduler.max_num_seqs must be a positive integer or None, got {max_num_seqs!r}"
            )
        if (
            isinstance(uniform_decode_query_len, bool)
            or not isinstance(uniform_decode_query_len, int)
            or uniform_decode_query_len < 1
        ):
            raise ValueError(
                "uniform_decode_query_len must be a positive integer (1, or 1 + the number "
                f"of speculative tokens), got {uniform_decode_query_len!r}"
            )
        mode = _as_graph_mode(compilation_config.cudagraph_mode)
        table = self._padding_table(compilation_config) if mode is not CUDAGraphMode.NONE else [0]

        self.mode: CUDAGraphMode = mode
        """The configured (resolved) mode this dispatcher serves."""
        self.max_capture_size: int = len(table) - 1
        """Largest batch that runs with a graph (0: none does)."""
        self.uniform_decode_query_len: int = uniform_decode_query_len
        self.decode_limit: int | None = (
            None if max_num_seqs is None else max_num_seqs * uniform_decode_query_len
        )
        """Most tokens a uniform-decode batch can have, or None when unbounded."""

        mixed_mode = mode.mixed_mode()
        decode_mode = mode.decode_mode()
        keep_uniform = mode.separate_routine()
        # One descriptor per padded size, shared by every batch size padding to it.
        mixed_keys: dict[int, _Dispatch] = {}
        decode_keys: dict[int, _Dispatch] = {}
        mixed: list[_Dispatch | None] = [None]  # 0 tokens: nothing to run a graph on
        decode: list[_Dispatch | None] = [None]
        for n in range(1, len(table)):
            padded = table[n]
            mixed_entry: _Dispatch | None = None
            if mixed_mode is not CUDAGraphMode.NONE:
                mixed_entry = mixed_keys.setdefault(
                    padded, (mixed_mode, BatchDescriptor(padded, False))
                )
            mixed.append(mixed_entry)
            if self.decode_limit is not None and padded > self.decode_limit:
                decode.append(mixed_entry)
            elif decode_mode is CUDAGraphMode.NONE:
                decode.append(None)
            else:
                decode.append(
                    decode_keys.setdefault(
                        padded, (decode_mode, BatchDescriptor(padded, keep_uniform))
                    )
                )
        self._mixed: tuple[_Dispatch | None, ...] = tuple(mixed)
        self._decode: tuple[_Dispatch | None, ...] = tuple(decode)
        self._max = self.max_capture_size

        by_mode: dict[CUDAGraphMode, list[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: [],
            CUDAGraphMode.FULL: [],
        }
        for entry in (*mixed, *decode):
            if entry is not None:
                by_mode[entry[0]].append(entry[1])
        self._capture_keys = {m: _descending(keys) for m, keys in by_mode.items()}

    @staticmethod
    def _padding_table(config: CompilationConfig) -> list[int]:
        table = config.bs_to_padded_graph_size
        if table is None:
            if config.cudagraph_capture_sizes is None:
                return [0]
            # Not finalised by resolve(): finalise a copy so the caller's object is untouched.
            import copy

            finalised = copy.deepcopy(config)
            finalised.init_with_cudagraph_sizes(list(config.cudagraph_capture_sizes))
            table = finalised.bs_to_padded_graph_size or [0]
        if not table or any(table[n] < n for n in range(len(table))):
            raise ConfigError(
                "compilation.bs_to_padded_graph_size must map every batch size 0..max to a "
                f"size >= it; got {table!r}. Resolve the config with hwplug.resolve() or call "
                "init_with_cudagraph_sizes()"
            )
        return list(table)

    def dispatch(self, batch: BatchDescriptor) -> tuple[CUDAGraphMode, BatchDescriptor]:
        """Return ``(runtime_mode, key)`` for ``batch``.

        ``runtime_mode`` is NONE, PIECEWISE or FULL. For NONE, ``key`` is
        ``batch`` itself; otherwise it is the graph key to replay.
        """
        n = batch[0]
        if 0 < n <= self._max:
            entry = (self._decode if batch[1] else self._mixed)[n]
            if entry is not None:
                return entry
        elif n < 0:
            raise ValueError(f"BatchDescriptor.num_tokens must be >= 0, got {n}")
        return (CUDAGraphMode.NONE, batch)

    def capture_keys(self) -> dict[CUDAGraphMode, tuple[BatchDescriptor, ...]]:
        """The graph keys to capture, per runtime mode (PIECEWISE and FULL), largest first.

        Exactly the keys :meth:`dispatch` can return, so a captured engine never
        meets a key it has no graph for.
        """
        return dict(self._capture_keys)

    @property
    def runtime_modes(self) -> tuple[CUDAGraphMode, ...]:
        """Runtime modes that have graphs to capture (a subset of PIECEWISE, FULL)."""
        return tuple(m for m, keys in self._capture_keys.items() if keys)

    def __repr__(self) -> str:
        counts = ", ".join(f"{m.name}: {len(k)}" for m, k in self._capture_keys.items())
        return (
            f"GraphDispatcher(mode={self.mode.name}, max_capture_size={self.max_capture_size}, "
            f"decode_limit={self.decode_limit}, keys={{{counts}}})"
        )


# ---------------------------------------------------------------------------
# Runtime mode resolution against attention backends
# ---------------------------------------------------------------------------


class AttentionGraphSupport(enum.IntEnum):
    """How much of a batch an attention backend can run inside a full graph.

    Ordered: a higher level supports everything a lower one does.
    """

    NEVER = 0
    """No full-graph capture at all."""
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    """Batches where every request decodes exactly one token."""
    UNIFORM_BATCH = 2
    """Batches with one query length for every request (spec decode included)."""
    ALWAYS = 3
    """Any batch, mixed prefill and decode included."""


SupportLike = AttentionGraphSupport | str | int | Iterable[AttentionGraphSupport | str | int]


def _as_support(value: object) -> AttentionGraphSupport:
    if isinstance(value, AttentionGraphSupport):
        return value
    if isinstance(value, str):
        key = value.strip().upper()
        if key in AttentionGraphSupport.__members__:
            return AttentionGraphSupport[key]
    elif isinstance(value, int) and not isinstance(value, bool):
        with contextlib.suppress(ValueError):
            return AttentionGraphSupport(value)
    elif isinstance(value, Iterable):
        levels = [_as_support(v) for v in value]
        # No attention layer constrains nothing.
        return min(levels, default=AttentionGraphSupport.ALWAYS)
    allowed = ", ".join(AttentionGraphSupport.__members__)
    raise ValueError(
        f"attention graph support must be one of {allowed} (or a list of them), got {value!r}"
    )


def resolve_runtime_graph_mode(
    compilation_config: CompilationConfig,
    support: SupportLike,
    *,
    uniform_decode_query_len: int = 1,
) -> CUDAGraphMode:
    """Degrade ``compilation.cudagraph_mode`` to what the attention backends can capture.

    ``support`` is an :class:`AttentionGraphSupport` (or its name), or a list of
    them, one per attention backend in use; the weakest one decides. Pure: the
    config is not modified. The rules, in order:

    1. Mixed side FULL with support below ALWAYS: NEVER is an error; otherwise
       FULL_AND_PIECEWISE when attention is among the splitting ops, else
       FULL_DECODE_ONLY.
    2. Decode side FULL with support NEVER: PIECEWISE when attention is
       compiled piecewise, else NONE.
    3. Decode side FULL with speculative decoding (``uniform_decode_query_len``
       > 1) and support below UNIFORM_BATCH: likewise PIECEWISE or NONE.
    4. Any full graph left with support NEVER is a :class:`ConfigError`.

    :raises ConfigError: when full graphs are requested but no attention
        backend can be captured in them; the message suggests PIECEWISE.
    """
    if (
        isinstance(uniform_decode_query_len, bool)
        or not isinstance(uniform_decode_query_len, int)
        or uniform_decode_query_len < 1
    ):
        raise ValueError(
            f"uniform_decode_query_len must be a positive integer, got {uniform_decode_query_len!r}"
        )
    level = _as_support(support)
    configured = _as_graph_mode(compilation_config.cudagraph_mode)
    mode = configured
    full = CUDAGraphMode.FULL

    def never_error() -> ConfigError:
        return ConfigError(
            f"compilation.cudagraph_mode={configured.name} needs full graphs, but the "
            f"attention backend's graph support is {level.name} (it cannot run inside a "
            "full graph); use compilation.cudagraph_mode=PIECEWISE (with "
            "compilation.level=3) or NONE"
        )

    if mode.mixed_mode() is full and level < AttentionGraphSupport.ALWAYS:
        if level is AttentionGraphSupport.NEVER:
            raise never_error()
        if compilation_config.splitting_ops_contain_attention():
            mode = CUDAGraphMode.FULL_AND_PIECEWISE
        else:
            mode = CUDAGraphMode.FULL_DECODE_ONLY
        logger.warning(
            "attention graph support %s cannot capture mixed batches: "
            "compilation.cudagraph_mode %s -> %s",
            level.name,
            configured.name,
            mode.name,
        )

    if mode.decode_mode() is full and (
        level is AttentionGraphSupport.NEVER
        or (uniform_decode_query_len > 1 and level < AttentionGraphSupport.UNIFORM_BATCH)
    ):
        before = mode
        if compilation_config.is_attention_compiled_piecewise():
            mode = CUDAGraphMode.PIECEWISE
        else:
            mode = CUDAGraphMode.NONE
        logger.warning(
            "attention graph support %s cannot capture decode batches of query length %d: "
            "compilation.cudagraph_mode %s -> %s",
            level.name,
            uniform_decode_query_len,
            before.name,
            mode.name,
        )

    if mode.has_full_cudagraphs() and level is AttentionGraphSupport.NEVER:
        raise never_error()
    return mode


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
    mode = _as_runtime_mode(runtime_mode)
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


_capture_lock = threading.Lock()
_capture_enabled = False


def set_capture_enabled(enabled: bool) -> bool:
    """Open or close graph capture for the whole process; returns the previous state.

    Capture is closed by default: graphs are captured in a dedicated phase
    before serving, so a graph key first met while serving is an error rather
    than a silent stall.
    """
    global _capture_enabled
    with _capture_lock:
        previous = _capture_enabled
        _capture_enabled = bool(enabled)
    return previous


def is_capture_enabled() -> bool:
    """Whether graph capture is currently open."""
    return _capture_enabled


@contextlib.contextmanager
def capture_phase() -> Iterator[None]:
    """Open graph capture for the enclosed block, then restore the previous state."""
    previous = set_capture_enabled(True)
    try:
        yield
    finally:
        set_capture_enabled(previous)


def capture_graphs(
    run: Callable[[BatchDescriptor], object],
    plan: Mapping[CUDAGraphMode, Iterable[BatchDescriptor]],
    *,
    num_warmups: int = 0,
) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
    """Capture every planned graph, PIECEWISE keys first, each mode largest key first.

    ``run(key)`` runs one forward pass shaped like ``key`` (a dummy batch);
    it is called ``num_warmups + 1`` times per key inside
    ``graph_context(mode, key)``, so wrappers configured with
    ``cudagraph_num_of_warmups=num_warmups`` warm up and then capture. Largest
    first lets smaller graphs reuse the shared memory pool. Capture is open
    during the call and the garbage collector is paused. ``plan`` is usually
    :meth:`GraphDispatcher.capture_keys`. Returns what was captured, in order.
    """
    if isinstance(num_warmups, bool) or not isinstance(num_warmups, int) or num_warmups < 0:
        raise ValueError(f"num_warmups must be an integer >= 0, got {num_warmups!r}")
    order = sorted(
        (_as_runtime_mode(m) for m in plan), key=lambda m: m is not CUDAGraphMode.PIECEWISE
    )
    done: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with capture_phase():
            for mode in order:
                if mode is CUDAGraphMode.NONE:
                    continue
                for key in _descending(plan[mode]):
                    with graph_context(mode, key):
                        for _ in range(num_warmups + 1):
                            run(key)
                    done.append((mode, key))
    finally:
        if gc_was_enabled:
            gc.enable()
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


@dataclasses.dataclass
class RecordedGraph:
    """A graph captured by :class:`RecordingGraphBackend`: the callable and its key."""

    key: BatchDescriptor
    fn: Callable[[], Any]
    pool: Any
    replays: int = 0


class RecordingGraphBackend:
    """A CPU backend that records what wrappers ask of it.

    "Capturing" runs the callable once and keeps it; "replaying" runs it
    again, so outputs are right and every bookkeeping step can be checked on
    CPU. ``events`` lists ``(action, key)`` in order; ``captures`` and
    ``replays`` list the keys; ``pool_requests`` counts pool look-ups.
    """

    name = "recording"

    def __init__(self) -> None:
        self.pool: object = object()
        self.events: list[tuple[str, BatchDescriptor | None]] = []
        self.captures: list[BatchDescriptor] = []
        self.replays: list[BatchDescriptor] = []
        self.graphs: list[RecordedGraph] = []
        self.pool_requests = 0
        self.weak_refs = 0
        self.synchronizations = 0

    def graph_pool_handle(self) -> object:
        self.pool_requests += 1
        self.events.append(("pool", None))
        return self.pool

    def capture(
        self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor
    ) -> tuple[RecordedGraph, Any]:
        graph = RecordedGraph(key=key, fn=fn, pool=pool)
        output = fn()
        self.graphs.append(graph)
        self.captures.append(key)
        self.events.append(("capture", key))
        return graph, output

    def replay(self, graph: RecordedGraph, output: Any) -> Any:
        graph.replays += 1
        self.replays.append(graph.key)
        self.events.append(("replay", graph.key))
        return graph.fn()

    def weak_ref(self, output: Any) -> Any:
        self.weak_refs += 1
        return output

    def synchronize(self) -> None:
        self.synchronizations += 1


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
        mode = _as_runtime_mode(runtime_mode)
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
            return self._replay(entry, key, args, kwargs)
        if not _capture_enabled:
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
            return self.runnable(*args, **kwargs)
        return self._capture(entry, key, args, kwargs)

    def _capture(
        self, entry: _Entry, key: BatchDescriptor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        import torch

        if not self._pool_ready:
            self._pool = self.backend.graph_pool_handle()
            self._pool_ready = True
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
