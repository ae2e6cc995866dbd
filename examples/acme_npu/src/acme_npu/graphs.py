"""ACME's graph capture: a graph backend for hwplug's GraphWrapper.

A real vendor wraps its runtime's graph API here (capture a callable into a
device graph once, replay it many times). ACME's runtime exposes the NPU
through CPU tensors in this demo, so an ACME "graph" keeps the captured call
and replays it by calling it again on the same static buffers, which is
exactly the contract hwplug's wrapper relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hwplug.core.graphs import BatchDescriptor, GraphBackend, GraphWrapper

__all__ = ["AcmeGraph", "AcmeGraphBackend", "AcmeGraphWrapper"]


class AcmeGraph:
    """One captured ACME graph: the call it replays, and how often it has."""

    def __init__(self, fn: Callable[[], Any], key: BatchDescriptor) -> None:
        self.fn = fn
        self.key = key
        self.replays = 0


class AcmeGraphBackend:
    """The :class:`~hwplug.core.graphs.GraphBackend` of the ACME runtime.

    Every wrapper of the process shares one instance (one memory pool).
    """

    name = "acme"

    def __init__(self) -> None:
        self.pool = object()  # ACME's graph memory pool, shared by every capture
        self.graphs: list[AcmeGraph] = []

    def graph_pool_handle(self) -> Any:
        return self.pool

    def capture(self, fn: Callable[[], Any], *, pool: Any, key: BatchDescriptor) -> tuple[Any, Any]:
        graph = AcmeGraph(fn, key)
        self.graphs.append(graph)
        return graph, fn()

    def replay(self, graph: AcmeGraph, output: Any) -> Any:
        graph.replays += 1
        return graph.fn()

    def weak_ref(self, output: Any) -> Any:
        return output

    def synchronize(self) -> None:
        """ACME's queue is synchronous in this demo."""


_shared = AcmeGraphBackend()


class AcmeGraphWrapper(GraphWrapper):
    """What the npu platform returns from ``graph_wrapper_cls()``."""

    @classmethod
    def default_backend(cls) -> GraphBackend:
        return _shared
