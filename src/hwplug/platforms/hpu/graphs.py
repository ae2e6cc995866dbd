"""HPU graphs: Intel Gaudi's whole-forward graph capture.

:class:`HpuGraphBackend` captures with Habana's ``HPUGraph``
(``habana_frameworks.torch.hpu``); :class:`HPUGraphWrapper` is what the HPU
platform returns from ``Platform.graph_wrapper_cls()``. Importing this module
imports neither torch nor the Habana stack.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar

from hwplug.core.graphs import BatchDescriptor, GraphBackend, GraphWrapper

__all__ = ["HPUGraphWrapper", "HpuGraphBackend"]


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


class HPUGraphWrapper(GraphWrapper):
    """:class:`GraphWrapper` on HPU graphs (Intel Gaudi)."""

    _shared: ClassVar[HpuGraphBackend | None] = None

    @classmethod
    def default_backend(cls) -> GraphBackend:
        if HPUGraphWrapper._shared is None:
            HPUGraphWrapper._shared = HpuGraphBackend()
        return HPUGraphWrapper._shared
