"""The level-3 (PIECEWISE) ``torch.compile`` backend.

Dynamo hands the backend one FX graph per compiled region. The backend splits
it at the splitting ops (attention and similar ops that stay out of compiled
code and out of piecewise graphs), compiles every other piece with Inductor
(or leaves it eager), and, when the graph mode captures piecewise graphs and
the platform has a graph wrapper, wraps each compiled piece in one. The
result is the split graph module, which calls the pieces in order.

This module imports torch; only compilation code imports it.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

from hwplug.core.config import CUDAGraphMode
from hwplug.core.errors import ConfigError
from hwplug.core.graphs import GraphOptions

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig, EngineConfig
    from hwplug.core.graphs import GraphBackend
    from hwplug.core.platform import Platform

__all__ = ["CompiledPiece", "PiecewiseBackend", "op_names", "split_graph"]

logger = logging.getLogger(__name__)


def _normalise(name: str) -> str:
    return name.replace("::", ".")


def op_names(target: object) -> frozenset[str]:
    """The names a call target answers to, as ``"ns.op"`` and ``"ns.op.overload"``.

    ``torch.ops.ns.op`` (a packet, which calls one of its overloads) answers to
    its own name and every overload's; ``torch.ops.ns.op.overload`` to its
    packet's name and its own. Any other target answers to nothing.
    """
    if isinstance(target, torch._ops.OpOverloadPacket):
        packet = _normalise(target._qualified_op_name)
        return frozenset({packet, *(f"{packet}.{o}" for o in target.overloads())})
    if isinstance(target, torch._ops.OpOverload):
        packet = _normalise(target.overloadpacket._qualified_op_name)
        return frozenset({packet, f"{packet}.{target._overloadname}"})
    return frozenset()


def _position(gm: torch.fx.GraphModule) -> Callable[[torch.fx.Node], int]:
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    return order.__getitem__


def _is_float(node: torch.fx.Node) -> bool:
    """Whether ``node`` computes a Python float (concrete or symbolic), not a tensor."""
    value = node.meta.get("example_value", node.meta.get("val"))
    return isinstance(value, (float, torch.SymFloat))


def split_graph(
    gm: torch.fx.GraphModule, splitting_ops: Iterable[str]
) -> tuple[torch.fx.GraphModule, list[str], list[str]]:
    """Split ``gm`` so that every call to a splitting op is a piece of its own.

    ``splitting_ops`` are op names such as ``"vllm.unified_attention"`` (also
    accepted: ``"vllm::unified_attention"`` and names with an overload).
    Returns ``(split_gm, piece_names, splitting_names)``: the pieces in call
    order, and those among them that hold a splitting op. With no splitting
    ops the whole graph is one piece.
    """
    wanted = {_normalise(op) for op in splitting_ops}

    def splits(node: torch.fx.Node) -> bool:
        return node.op == "call_function" and bool(wanted) and bool(op_names(node.target) & wanted)

    # A float computed only for splitting ops (a module's float attribute that Dynamo
    # turned into a tensor and reads back with item(), such as attention's scale) is
    # computed in the splitting op's own piece: a compiled piece cannot return a float.
    travelling = {
        node
        for node in gm.graph.nodes
        if node.op not in ("placeholder", "output")
        and _is_float(node)
        and node.users
        and all(splits(user) for user in node.users)
    }
    for node in travelling:  # just before the first op it feeds: pieces stay in order
        first_user = min(node.users, key=_position(gm))
        first_user.prepend(node)
    if travelling:
        gm.recompile()
    piece = 0
    assignment: dict[torch.fx.Node, int] = {}
    splitting_ids: set[int] = set()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in travelling:
            continue
        if splits(node):
            piece += 1
            assignment[node] = piece
            for arg in node.all_input_nodes:
                if arg in travelling and arg not in assignment:
                    assignment[arg] = piece
            splitting_ids.add(piece)
            piece += 1
        else:
            assignment[node] = piece
    split_gm = split_module(gm, gm, lambda node: assignment[node], keep_original_order=True)
    names = [str(node.target) for node in split_gm.graph.nodes if node.op == "call_module"]
    splitting = [name for name in names if int(name.rsplit("_", 1)[1]) in splitting_ids]
    return split_gm, names, splitting


class _PieceInterpreter(torch.fx.Interpreter):
    """Runs the split graph on fake tensors to learn each piece's example inputs."""

    def __init__(self, module: torch.fx.GraphModule, wanted: set[str]) -> None:
        super().__init__(module)
        self.wanted = wanted
        self.inputs: dict[str, tuple[Any, ...]] = {}

    def call_module(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in self.wanted:
            self.inputs[str(target)] = args
        return super().call_module(target, args, kwargs)


class CompiledPiece:
    """A compiled piece: the general-shape compile plus per-size specialisations.

    A size in ``compile_sizes`` is compiled on first use, from the piece's
    graph with the runtime inputs, so its shapes are static.
    """

    def __init__(
        self,
        name: str,
        graph: torch.fx.GraphModule,
        general: Callable[..., Any],
        compile_fn: Callable[[torch.fx.GraphModule, Sequence[Any]], Callable[..., Any]],
        compile_sizes: Sequence[int],
        size_index: int | None,
    ) -> None:
        self.name = name
        self.graph = graph
        self.general = general
        self._compile_fn = compile_fn
        self.size_index = size_index
        self.compile_sizes = frozenset(compile_sizes) if size_index is not None else frozenset()
        self.specialised: dict[int, Callable[..., Any]] = {}

    def __call__(self, *args: Any) -> Any:
        if self.compile_sizes:
            size = args[self.size_index]  # type: ignore[index]
            if size in self.compile_sizes:
                fn = self.specialised.get(size)
                if fn is None:
                    logger.debug("compiling piece %s for size %d", self.name, size)
                    fn = self._compile_fn(copy.deepcopy(self.graph), list(args))
                    self.specialised[size] = fn
                return fn(*args)
        return self.general(*args)


class PiecewiseBackend:
    """A ``torch.compile`` backend that compiles a model piece by piece.

    ``PiecewiseBackend(compilation_config, engine_config=None, *, platform=None,
    graph_backend=None)``; ``CompilationConfig.init_backend()`` returns one
    for the current platform at level 3. ``platform`` provides the graph
    wrapper (``graph_wrapper_cls()``) and ``graph_backend`` what it captures
    with (a test backend on CPU, say). Calling it with
    ``(gm, example_inputs)`` returns the split graph module with its pieces
    compiled (Inductor when ``use_inductor``, eager otherwise) and, for modes
    with piecewise graphs on a platform with a graph wrapper, wrapped for
    capture. With ``use_inductor_graph_partition`` the graph is not split:
    Inductor partitions it while compiling, and it is one piece here.

    After a call, ``split_gm``, ``piece_names``, ``splitting_piece_names``,
    ``compiled_piece_names`` and ``num_pieces`` describe the latest graph.
    """

    def __init__(
        self,
        compilation_config: CompilationConfig,
        engine_config: EngineConfig | None = None,
        *,
        platform: Platform | None = None,
        graph_backend: GraphBackend | None = None,
    ) -> None:
        self.compilation_config = compilation_config
        self.engine_config = engine_config
        self.platform = platform
        """Whose graph wrapper captures the pieces (None: the pieces are not wrapped)."""
        self.graph_backend = graph_backend
        """The backend the wrappers capture with (None: the platform wrapper's own)."""
        self.split_gm: torch.fx.GraphModule | None = None
        self.piece_names: list[str] = []
        self.splitting_piece_names: list[str] = []
        self.compiled_piece_names: list[str] = []
        self.wrapped_piece_names: list[str] = []
        self.pieces: dict[str, Callable[..., Any]] = {}
        self.num_graphs = 0
        self.compilation_time = 0.0
        if compilation_config.use_inductor:
            self._inductor_config()  # fail at init_backend(), not deep inside Dynamo

    @property
    def num_pieces(self) -> int:
        """Pieces in the latest split graph, splitting pieces included."""
        return len(self.piece_names)

    # -- configuration ---------------------------------------------------------
    def splitting_ops(self) -> list[str]:
        """The ops the graph is split at (none with inductor graph partition)."""
        config = self.compilation_config
        if config.use_inductor_graph_partition:
            return []
        if config.splitting_ops is None:
            # Not finalised by resolve(): decide on a copy, never on the caller's config.
            finalised = copy.deepcopy(config)
            finalised.level = 3
            finalised.set_splitting_ops_for_v1()
            return list(finalised.splitting_ops or [])
        return list(config.splitting_ops)

    def _inductor_config(self) -> dict[str, Any]:
        """Inductor options for the pieces.

        :raises ConfigError: ``inductor_compile_config`` names an unknown option.
        """
        import torch._inductor.config as inductor_config

        patches = dict(self.compilation_config.inductor_compile_config)
        unknown = sorted(k for k in patches if not hasattr(inductor_config, k))
        if unknown:
            raise ConfigError(
                f"compilation.inductor_compile_config: unknown inductor option(s) "
                f"{', '.join(unknown)}; use names from torch._inductor.config"
            )
        if self.compilation_config.use_inductor_graph_partition:
            patches["graph_partition"] = True
        return patches

    def _inductor_compile(
        self, graph: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        from torch._inductor import utils as inductor_utils
        from torch._inductor.compile_fx import compile_fx

        partition_wrapper = self._partition_wrapper()
        if partition_wrapper is not None:
            inductor_utils.set_customized_partition_wrappers(partition_wrapper)
        try:
            compiled = compile_fx(
                graph, list(example_inputs), config_patches=self._inductor_config()
            )
        finally:
            if partition_wrapper is not None:
                inductor_utils.set_customized_partition_wrappers(None)  # type: ignore[arg-type]
        return compiled  # type: ignore[return-value]

    def _wrapper_cls(self) -> Callable[..., Any] | None:
        """The platform's piecewise graph wrapper, when this mode captures piecewise graphs."""
        mode = self.compilation_config.cudagraph_mode
        if mode is None or not CUDAGraphMode.parse(mode).has_piecewise_cudagraphs():
            return None
        platform = self.platform
        if platform is None or not platform.supports_piecewise_graphs:
            return None
        wrapper_cls: Callable[..., Any] | None = platform.graph_wrapper_cls()
        if wrapper_cls is None:
            return None
        backend = self.graph_backend
        if backend is None:
            return wrapper_cls
        return functools.partial(wrapper_cls, backend=backend)

    def _partition_wrapper(self) -> Callable[[Any, Any], Any] | None:
        # With inductor graph partition, Inductor hands each graph-safe partition to us.
        if not self.compilation_config.use_inductor_graph_partition:
            return None
        wrapper_cls = self._wrapper_cls()
        if wrapper_cls is None:
            return None

        config = self.compilation_config

        def wrap(fn: Callable[..., Any], metadata: Any) -> Any:
            index, count = metadata.partition_index, metadata.num_partitions
            options = GraphOptions(gc_disable=index != 0, weak_ref_output=index == count - 1)
            return wrapper_cls(fn, config, CUDAGraphMode.PIECEWISE, options=options)

        return wrap

    # -- the backend -------------------------------------------------------------
    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        start = time.perf_counter()
        split_gm, names, splitting = split_graph(gm, self.splitting_ops())
        compiled_names = [n for n in names if n not in splitting]
        pieces: dict[str, Callable[..., Any]] = {n: getattr(split_gm, n) for n in compiled_names}

        if self.compilation_config.use_inductor and compiled_names:
            pieces = self._compile_pieces(gm, split_gm, compiled_names, example_inputs)

        wrapped = self._wrap_pieces(pieces, compiled_names)
        for name, piece in pieces.items():
            # Shadow the registered submodule: the generated forward looks it up by attribute.
            split_gm.__dict__[name] = piece

        self.split_gm = split_gm
        self.piece_names = names
        self.splitting_piece_names = splitting
        self.compiled_piece_names = compiled_names
        self.wrapped_piece_names = wrapped
        self.pieces = pieces
        self.num_graphs += 1
        elapsed = time.perf_counter() - start
        self.compilation_time += elapsed
        logger.debug(
            "piecewise backend: %d pieces (%d splitting) compiled in %.3fs",
            len(names),
            len(splitting),
            elapsed,
        )
        return split_gm

    def _compile_pieces(
        self,
        gm: torch.fx.GraphModule,
        split_gm: torch.fx.GraphModule,
        names: list[str],
        example_inputs: Sequence[Any],
    ) -> dict[str, Callable[..., Any]]:
        from torch._guards import detect_fake_mode
        from torch._subclasses.fake_tensor import FakeTensorMode

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        metas = [n.meta.get("example_value", n.meta.get("val")) for n in placeholders]
        fake_mode: FakeTensorMode = (
            detect_fake_mode(list(example_inputs))
            or detect_fake_mode([m for m in metas if isinstance(m, torch.Tensor)])
            or FakeTensorMode()
        )
        fake_args: list[Any] = []
        for meta, real in zip(metas, example_inputs):
            if isinstance(meta, torch.Tensor) and getattr(meta, "fake_mode", None) is fake_mode:
                fake_args.append(meta)
            elif isinstance(real, torch.Tensor):
                fake_args.append(fake_mode.from_tensor(real))
            elif meta is not None:
                fake_args.append(meta)
            else:
                fake_args.append(real)

        interpreter = _PieceInterpreter(split_gm, set(names))
        with fake_mode:
            interpreter.run(*fake_args)

        compile_sizes = [
            int(s) for s in self.compilation_config.compile_sizes or [] if isinstance(s, int)
        ]
        pieces: dict[str, Callable[..., Any]] = {}
        for name in names:
            graph = getattr(split_gm, name)
            args = interpreter.inputs[name]
            size_index = next((i for i, a in enumerate(args) if isinstance(a, torch.SymInt)), None)
            general = self._inductor_compile(copy.deepcopy(graph), args)
            pieces[name] = CompiledPiece(
                name, graph, general, self._inductor_compile, compile_sizes, size_index
            )
        return pieces

    def _wrap_pieces(self, pieces: dict[str, Callable[..., Any]], names: list[str]) -> list[str]:
        if not names or self.compilation_config.use_inductor_graph_partition:
            return []
        wrapper_cls = self._wrapper_cls()
        if wrapper_cls is None:
            return []

        last = len(names) - 1
        for index, name in enumerate(names):
            options = GraphOptions(gc_disable=index != 0, weak_ref_output=index == last)
            pieces[name] = wrapper_cls(
                pieces[name], self.compilation_config, CUDAGraphMode.PIECEWISE, options=options
            )
        return list(names)

    def __repr__(self) -> str:
        return (
            f"PiecewiseBackend(pieces={self.num_pieces}, "
            f"splitting={len(self.splitting_piece_names)}, graphs={self.num_graphs})"
        )
