"""Graph-mode dispatch: which runtime mode and graph key each batch runs with.

:class:`GraphDispatcher` maps a batch (:class:`BatchDescriptor`) to the
runtime graph mode and the graph key it should run with. It is built once
after resolution and does only two list look-ups per call. Nothing here
imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from hwplug.core.config import CUDAGraphMode
from hwplug.core.errors import ConfigError

if TYPE_CHECKING:
    from hwplug.core.config import CompilationConfig

__all__ = ["BatchDescriptor", "GraphDispatcher", "as_graph_mode", "as_runtime_mode", "descending"]


_RUNTIME_MODES = (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)


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


def as_graph_mode(value: object, field: str = "compilation.cudagraph_mode") -> CUDAGraphMode:
    if value is None:
        return CUDAGraphMode.NONE
    if isinstance(value, CUDAGraphMode):
        return value
    if isinstance(value, str) and value.upper() in CUDAGraphMode.__members__:
        return CUDAGraphMode[value.upper()]
    allowed = ", ".join(CUDAGraphMode.__members__)
    raise ConfigError(f"{field}={value!r} is not a graph mode; use one of: {allowed}")


def as_runtime_mode(value: object) -> CUDAGraphMode:
    mode = as_graph_mode(value, "runtime_mode")
    if mode not in _RUNTIME_MODES:
        raise ValueError(
            f"runtime_mode={mode.name} is not a runtime graph mode; use one of: "
            "NONE, PIECEWISE, FULL (FULL_DECODE_ONLY and FULL_AND_PIECEWISE are "
            "configuration modes that dispatch resolves per batch)"
        )
    return mode


def descending(keys: Iterable[BatchDescriptor]) -> tuple[BatchDescriptor, ...]:
    return tuple(sorted(set(keys), key=lambda k: (k[0], k[1]), reverse=True))


_Dispatch = tuple[CUDAGraphMode, BatchDescriptor]


class GraphDispatcher:
    """Chooses the runtime graph mode and graph key of each batch.

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
        mode = as_graph_mode(compilation_config.cudagraph_mode)
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
        self._capture_keys = {m: descending(keys) for m, keys in by_mode.items()}

    @classmethod
    def from_config(cls, config: Any, *, uniform_decode_query_len: int = 1) -> GraphDispatcher:
        """The dispatcher of a resolved config: its compilation section with the
        scheduler's ``max_num_seqs``, so decode graphs stop where decode batches do.

        ``config`` is a resolved ``EngineConfig`` or a ``Resolution`` (its config).
        """
        engine = getattr(config, "config", config)
        compilation = getattr(engine, "compilation", None)
        scheduler = getattr(engine, "scheduler", None)
        if compilation is None or scheduler is None:
            raise ValueError(
                "GraphDispatcher.from_config needs a resolved EngineConfig or a Resolution, "
                f"got {type(config).__name__}"
            )
        return cls(
            compilation,
            max_num_seqs=scheduler.max_num_seqs,
            uniform_decode_query_len=uniform_decode_query_len,
        )

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
