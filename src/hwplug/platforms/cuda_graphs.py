"""CUDA graphs, shared by the CUDA and ROCm platforms (HIP graphs through the same API).

:class:`CudaGraphBackend` captures with ``torch.cuda.CUDAGraph`` on a side
stream into one ``torch.cuda.graph_pool_handle()`` pool per process;
:class:`CUDAGraphWrapper` is what both platforms return from
``Platform.graph_wrapper_cls()``. All capture/replay bookkeeping lives in
:class:`hwplug.core.graphs.GraphWrapper`.

Importing this module does not import torch; creating a backend does, and the
first capture initialises the device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.core.graphs import BatchDescriptor, GraphBackend, GraphWrapper

if TYPE_CHECKING:
    import torch

__all__ = ["CUDAGraphWrapper", "CudaGraphBackend", "non_owning_alias"]


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
    _pool_keeper: ClassVar[Any] = None
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
        """The process's graph pool (initialises CUDA on first call).

        :raises RuntimeError: no CUDA or ROCm GPU is available to this process
            (a simulated platform on a CPU machine, say).
        """
        with CudaGraphBackend._lock:
            if CudaGraphBackend._pool is None:
                import torch

                if not torch.cuda.is_available():
                    raise RuntimeError(
                        "CUDA graphs need a CUDA or ROCm GPU, and torch sees none here (a "
                        "simulated platform on a CPU machine?); to capture on CPU tensors, "
                        "pass backend=hwplug.testing.RecordingGraphBackend() to the graph "
                        "wrapper (graph_backend= to PiecewiseBackend), or set "
                        "compilation.cudagraph_mode=NONE"
                    )
                pool = torch.cuda.graph_pool_handle()
                CudaGraphBackend._pool_keeper = self._keep_alive(pool)
                CudaGraphBackend._pool = pool
            return CudaGraphBackend._pool

    def _keep_alive(self, pool: Any) -> Any:
        """A one-kernel graph captured into ``pool`` and kept for the process's life.

        The caching allocator counts the graphs that use a pool and retires the
        pool when the count reaches zero; a later capture into the retired pool
        fails an internal assertion. Engines keep their graphs, but a process
        that frees every graph (a test suite, an engine rebuilt for another
        model) would otherwise break the next capture.
        """
        import torch

        scratch = torch.zeros(1, device=torch.cuda.current_device())
        keeper = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(keeper, pool=pool, stream=self._side_stream()):
            scratch.add_(1)
        return keeper, scratch

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


class CUDAGraphWrapper(GraphWrapper):
    """:class:`GraphWrapper` on CUDA graphs (CUDA and ROCm platforms)."""

    @classmethod
    def default_backend(cls) -> GraphBackend:
        return CudaGraphBackend.shared()
