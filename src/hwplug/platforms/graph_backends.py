"""Device graph backends and the wrappers that bind them.

* :class:`CudaGraphBackend` captures with ``torch.cuda.CUDAGraph`` on a side
  stream into one ``torch.cuda.graph_pool_handle()`` pool per process; ROCm
  runs HIP graphs through the same API.
* :class:`HpuGraphBackend` captures with Habana's ``HPUGraph``
  (``habana_frameworks.torch.hpu``).

:class:`CUDAGraphWrapper` and :class:`HPUGraphWrapper` are what the CUDA/ROCm
and HPU platforms return from ``Platform.graph_wrapper_cls()``. All
capture/replay bookkeeping lives in :class:`hwplug.core.graphs.GraphWrapper`.

Importing this module imports neither torch nor the Habana stack; creating a
backend imports what it needs, and the first capture initialises the device.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.core.graphs import BatchDescriptor, GraphBackend, GraphWrapper

if TYPE_CHECKING:
    import torch

__all__ = [
    "CUDAGraphWrapper",
    "CudaGraphBackend",
    "HPUGraphWrapper",
    "HpuGraphBackend",
    "non_owning_alias",
]


def non_owning_alias(output: Any) -> Any:
    """Alias every tensor in ``output`` without owning its memory.

    The alias reads and writes the same device memory but does not keep it
    allocated: the memory belongs to the graph pool, which the graph keeps.
    Used for graph outputs nothing captured later reads, so the pool can hand
    their memory to the next capture. Non-tensors are returned as they are.
    """
    import torch
    from torch.utils import _pytree as pytree

    def alias(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        borrowed = torch._C._construct_storage_from_data_pointer(
            storage.data_ptr(), t.device, storage.nbytes()
        )
        view = torch.empty((), dtype=t.dtype, device=t.device)
        return view.set_(borrowed, t.storage_offset(), t.size(), t.stride())

    return pytree.tree_map_only(torch.Tensor, alias, output)


class CudaGraphBackend:
    """CUDA graphs (and HIP graphs on ROCm) through ``torch.cuda``.

    Every instance shares one memory pool per process, created on first use.
    Capture runs on a side stream (one per device) after synchronising the
    device, then replays once so the capturing call returns real values.
    """

    name = "cuda"
    _pool: ClassVar[Any] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _shared: ClassVar[CudaGraphBackend | None] = None

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}

    @classmethod
    def shared(cls) -> CudaGraphBackend:
        """The process-wide instance the wrappers use by default."""
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def graph_pool_handle(self) -> Any:
        """The process's graph pool (initialises CUDA on first call)."""
        with CudaGraphBackend._lock:
            if CudaGraphBackend._pool is None:
                import torch

                CudaGraphBackend._pool = torch.cuda.graph_pool_handle()
            return CudaGraphBackend._pool

    def _side_stream(self) -> torch.cuda.Stream:
        import torch

        device = torch.cuda.current_device()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        return stream

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        import torch

        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, pool=pool, stream=self._side_stream()):
            output = fn()
        # Capture records kernels without running them: replay once for this call's values.
        graph.replay()
        return graph, output

    def replay(self, graph: Any, output: Any) -> Any:
        graph.replay()
        return output

    def weak_ref(self, output: Any) -> Any:
        return non_owning_alias(output)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()


def _import_habana() -> Any:
    try:
        return importlib.import_module("habana_frameworks.torch.hpu")
    except ImportError as exc:
        raise RuntimeError(
            "HPU graphs need the Intel Gaudi software stack (habana_frameworks.torch), which "
            f"cannot be imported here ({exc}); install it, or run without graphs "
            "(compilation.cudagraph_mode=NONE)"
        ) from exc


class HpuGraphBackend:
    """Intel Gaudi graphs through ``habana_frameworks.torch.hpu.HPUGraph``.

    HPU graphs manage their own memory, so there is no pool to share
    (:meth:`graph_pool_handle` returns None).

    :raises RuntimeError: at construction when ``habana_frameworks`` is missing.
    """

    name = "hpu"

    def __init__(self) -> None:
        self._hpu = _import_habana()
        self._stream: Any = None

    def graph_pool_handle(self) -> None:
        return None

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        hpu = self._hpu
        if self._stream is None:
            self._stream = hpu.Stream()
        graph = hpu.HPUGraph()
        with hpu.stream(self._stream):
            graph.capture_begin()
            try:
                output = fn()
            finally:
                graph.capture_end()
        graph.replay()
        return graph, output

    def replay(self, graph: Any, output: Any) -> Any:
        graph.replay()
        return output

    def weak_ref(self, output: Any) -> Any:
        return output

    def synchronize(self) -> None:
        self._hpu.synchronize()


class CUDAGraphWrapper(GraphWrapper):
    """:class:`GraphWrapper` on CUDA graphs (CUDA and ROCm platforms)."""

    @classmethod
    def default_backend(cls) -> GraphBackend:
        return CudaGraphBackend.shared()


class HPUGraphWrapper(GraphWrapper):
    """:class:`GraphWrapper` on HPU graphs (Intel Gaudi)."""

    _shared: ClassVar[HpuGraphBackend | None] = None

    @classmethod
    def default_backend(cls) -> GraphBackend:
        if HPUGraphWrapper._shared is None:
            HPUGraphWrapper._shared = HpuGraphBackend()
        return HPUGraphWrapper._shared
