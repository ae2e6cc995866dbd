"""Collectives over ``torch.distributed``, for any platform (SPEC 14).

:class:`DeviceCommunicator` is what ``Platform.device_communicator()`` returns
by default: the five collectives a tensor-parallel engine needs, run on a
process group with the platform's collective backend (gloo, nccl, hccl, xccl,
a vendor's own). On a world of one every collective is the identity and no
process group is touched, so an engine calls them unconditionally.

:func:`init_process_group` and :func:`destroy_process_group` are what
``Platform.init_distributed`` and ``destroy_distributed`` run: they remember
the arguments a process initialised with, so that a second call with the same
arguments returns the same group and one with other arguments is an error
naming both. Nothing here knows a particular chip; importing it is free
(torch is imported by the functions).
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "DeviceCommunicator",
    "DistributedSetup",
    "all_gather",
    "all_reduce",
    "communicator",
    "current_setup",
    "destroy_process_group",
    "init_process_group",
    "register_communicator",
]


@dataclasses.dataclass(frozen=True)
class DistributedSetup:
    """The arguments a process initialised ``torch.distributed`` with."""

    backend: str
    rank: int
    world_size: int
    local_rank: int
    init_method: str
    timeout: timedelta

    def describe(self) -> str:
        """For messages: every argument, by name."""
        return (
            f"backend={self.backend!r}, rank={self.rank}, world_size={self.world_size}, "
            f"local_rank={self.local_rank}, init_method={self.init_method!r}, "
            f"timeout={self.timeout}"
        )


_lock = threading.Lock()
_setup: list[DistributedSetup] = []


def current_setup() -> DistributedSetup | None:
    """How this process initialised ``torch.distributed`` through hwplug, or None."""
    return _setup[0] if _setup else None


def init_process_group(setup: DistributedSetup) -> Any:
    """Initialise the default process group as ``setup`` says, or return the one this
    process already made with the same arguments.

    :raises RuntimeError: the process already initialised ``torch.distributed``
        with other arguments (through hwplug: both are named; or by itself with
        another rank or world size).
    """
    import torch.distributed as dist

    with _lock:
        existing = current_setup()
        if existing is not None and dist.is_initialized():
            if existing == setup:
                return dist.group.WORLD
            raise RuntimeError(
                "torch.distributed is already initialised in this process with "
                f"{existing.describe()}; init_distributed() was now called with "
                f"{setup.describe()}: call destroy_distributed() first, or pass the same "
                "arguments"
            )
        if dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            if (rank, world) != (setup.rank, setup.world_size):
                raise RuntimeError(
                    f"torch.distributed was initialised outside hwplug as rank {rank} of "
                    f"{world}; init_distributed() was called for rank {setup.rank} of "
                    f"{setup.world_size}"
                )
            _setup[:] = [setup]
            return dist.group.WORLD
        dist.init_process_group(
            backend=setup.backend,
            init_method=setup.init_method,
            rank=setup.rank,
            world_size=setup.world_size,
            timeout=setup.timeout,
        )
        _setup[:] = [setup]
        return dist.group.WORLD


def destroy_process_group() -> None:
    """Tear down the default process group (nothing happens when there is none)."""
    import torch.distributed as dist

    with _lock:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        _setup.clear()


class DeviceCommunicator:
    """Collectives of one process group: all-reduce, all-gather, reduce-scatter,
    broadcast and barrier.

    ``group`` is a ``torch.distributed`` process group, or None for the default
    one; without an initialised ``torch.distributed`` (and no group) the world
    is this process alone. A platform may return a subclass from
    ``device_communicator()`` (its class attribute ``communicator_cls``), for a
    vendor's faster collectives; engines call only these methods.
    """

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        if dist.is_available() and dist.is_initialized():
            self.world_size: int = dist.get_world_size(group)
            self.rank: int = dist.get_rank(group)
        elif group is not None:
            raise RuntimeError(
                "a process group was given, but torch.distributed is not initialised in "
                "this process; call platform.init_distributed(...) first"
            )
        else:
            self.world_size, self.rank = 1, 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over the ranks, in place; returns ``t``."""
        if self.world_size == 1:
            return t
        import torch.distributed as dist

        dist.all_reduce(t, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``t`` concatenated along ``dim``, in rank order."""
        if self.world_size == 1:
            return t
        import torch
        import torch.distributed as dist

        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t, group=self.group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The sum over the ranks of ``t``, split along ``dim`` into ``world_size``
        equal chunks; this rank's chunk.

        :raises ValueError: ``t.shape[dim]`` is not a multiple of the world size.
        """
        if self.world_size == 1:
            return t
        size = t.shape[dim]
        if size % self.world_size:
            raise ValueError(
                f"reduce_scatter: dimension {dim} has {size} elements, not a multiple of the "
                f"world size {self.world_size}"
            )
        import torch
        import torch.distributed as dist

        chunks = [c.contiguous() for c in torch.chunk(t, self.world_size, dim=dim)]
        out = torch.empty_like(chunks[self.rank])
        try:
            dist.reduce_scatter(out, chunks, group=self.group)
        except (RuntimeError, NotImplementedError, ValueError):
            # backends without reduce_scatter (gloo): the sum everywhere, then our chunk
            total = t.contiguous().clone()
            dist.all_reduce(total, group=self.group)
            out = torch.chunk(total, self.world_size, dim=dim)[self.rank].contiguous()
        return out

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank ``src``'s ``t`` on every rank, in place; returns ``t``.

        :raises ValueError: ``src`` is not a rank of the group.
        """
        if not 0 <= src < self.world_size:
            raise ValueError(f"broadcast: src={src} is not a rank of a world of {self.world_size}")
        if self.world_size == 1:
            return t
        import torch.distributed as dist

        source = src if self.group is None else dist.get_global_rank(self.group, src)
        dist.broadcast(t, src=source, group=self.group)
        return t

    def barrier(self) -> None:
        """Wait until every rank of the group is here."""
        if self.world_size == 1:
            return
        import torch.distributed as dist

        dist.barrier(group=self.group)


# -- collectives as torch custom ops --------------------------------------------------------

_communicators: dict[str, DeviceCommunicator] = {}


def register_communicator(name: str, communicator: DeviceCommunicator | None) -> None:
    """Make ``communicator`` the one the collective ops of group ``name`` run on (None:
    forget it). An engine registers its tensor-parallel group once per process
    (``"tp"``), and its model calls :func:`all_reduce` and :func:`all_gather` with
    that name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a communicator name must be a non-empty string, got {name!r}")
    if communicator is None:
        _communicators.pop(name, None)
        return
    if not isinstance(communicator, DeviceCommunicator):
        raise ValueError(
            f"register_communicator({name!r}, ...) takes a DeviceCommunicator, got "
            f"{type(communicator).__name__}"
        )
    _communicators[name] = communicator


def communicator(name: str) -> DeviceCommunicator:
    """The communicator registered as ``name``.

    :raises RuntimeError: none is (the message lists the registered names).
    """
    found = _communicators.get(name)
    if found is None:
        known = ", ".join(sorted(_communicators)) or "none"
        raise RuntimeError(
            f"no communicator is registered as {name!r} in this process (registered: {known}); "
            "call hwplug.core.distributed.register_communicator first"
        )
    return found


def _collective_ops() -> Any:
    """``torch.ops.hwplug`` with ``all_reduce`` and ``all_gather`` registered (on first
    use; imports torch). They are opaque to ``torch.compile``: a compiled model
    calls the communicator at run time, between its compiled kernels."""
    # lazy: torch; `import hwplug` stays light
    from hwplug.core import _collective_ops

    return _collective_ops.OPS


def all_reduce(t: torch.Tensor, group: str) -> torch.Tensor:
    """The sum of ``t`` over the ranks of group ``group``, as a new tensor, through
    ``hwplug::all_reduce`` (opaque to ``torch.compile``)."""
    result: torch.Tensor = _collective_ops().all_reduce(t, group)
    return result


def all_gather(t: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Every rank's ``t`` concatenated along ``dim``, as a new tensor, through
    ``hwplug::all_gather`` (opaque to ``torch.compile``)."""
    result: torch.Tensor = _collective_ops().all_gather(t, dim, group)
    return result
