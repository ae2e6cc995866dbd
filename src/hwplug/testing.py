"""Test doubles for vendors and engines: run graph capture and its bookkeeping on CPU.

:class:`RecordingGraphBackend` is a :class:`~hwplug.core.graphs.GraphBackend`
that "captures" by running the callable once and "replays" by running it
again, recording every step, so a platform's graph wrapper, the dispatcher
and an engine's capture loop are tested without a device::

    from hwplug.core.graphs import GraphWrapper
    from hwplug.testing import RecordingGraphBackend

    backend = RecordingGraphBackend()
    wrapped = GraphWrapper(model, config.compilation, "FULL", backend)

Pass it as ``backend=`` to a platform's wrapper class (``platform.graph_wrapper_cls()``)
or as ``graph_backend=`` to :class:`hwplug.compilation.PiecewiseBackend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hwplug.core.graph_dispatch import BatchDescriptor

__all__ = ["RecordedGraph", "RecordingGraphBackend"]


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
        """Run the call again and write its values into the captured ``output``.

        As a device graph does: a replay refreshes the output buffers of the
        capture rather than making new ones, so code that keeps reading them
        (the next piece of a split graph) sees this replay's values.
        """
        graph.replays += 1
        self.replays.append(graph.key)
        self.events.append(("replay", graph.key))
        fresh = graph.fn()
        return _write_into(output, fresh)

    def weak_ref(self, output: Any) -> Any:
        self.weak_refs += 1
        return output

    def synchronize(self) -> None:
        self.synchronizations += 1


def _write_into(static: Any, fresh: Any) -> Any:
    """Copy the tensors of ``fresh`` into those of ``static`` (same structure); return
    ``static``. Anything that is not a same-shaped tensor pair is replaced by ``fresh``."""
    import torch

    if isinstance(static, torch.Tensor) and isinstance(fresh, torch.Tensor):
        # Views of a multi-output op (a split) cannot be written in place: those
        # come back fresh, like any output that changed shape.
        if (
            static.shape == fresh.shape
            and static.dtype == fresh.dtype
            and static._base is None
            and not static.requires_grad
        ):
            static.copy_(fresh)
            return static
        return fresh
    if (
        isinstance(static, list | tuple)
        and isinstance(fresh, list | tuple)
        and len(static) == len(fresh)
    ):
        items = [_write_into(a, b) for a, b in zip(static, fresh)]
        return type(static)(items) if isinstance(static, tuple) else items
    return fresh
