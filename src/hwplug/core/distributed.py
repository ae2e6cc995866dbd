"""Collectives over ``torch.distributed``, for any platform (SPEC 14 and 15).

:class:`DeviceCommunicator` is what ``Platform.device_communicator()`` returns
by default: the five collectives a tensor-parallel engine needs and the
point-to-point transfers of pipeline stages (``send``/``recv``,
``send_object``/``recv_object``), run on a
process group with the platform's collective backend (gloo, nccl, hccl, xccl,
a vendor's own). On a world of one every collective is the identity and no
process group is touched, so an engine calls them unconditionally.

:func:`init_process_group` and :func:`destroy_process_group` are what
``Platform.init_distributed`` and ``destroy_distributed`` run: they remember
the arguments a process initialised with, so that a second call with the same
arguments returns the same group and one with other arguments is an error
naming both. :class:`ModelParallelGroups` is one rank's place in a replica's
mesh of tensor- and pipeline-parallel groups (``Platform.init_model_parallel``).
Nothing here knows a particular chip; importing it is free (torch is imported
by the functions).
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
    "ModelParallelGroups",
    "all_gather",
    "all_reduce",
    "communicator",
    "current_setup",
    "destroy_process_group",
    "init_process_group",
    "mesh_ranks",
    "model_parallel_groups",
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
        _mesh.clear()


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

    # -- point to point (SPEC 15): pipeline stages hand their activations on -------------
    def _peer(self, what: str, peer: object, name: str) -> int:
        """``peer`` (a rank of this group) as a global rank, checked."""
        if self.world_size == 1:
            raise RuntimeError(
                f"{what}: this communicator's world is this process alone (world_size 1): "
                "there is no other rank to talk to"
            )
        if isinstance(peer, bool) or not isinstance(peer, int):
            raise ValueError(f"{what}: {name} must be an integer rank, got {peer!r}")
        if not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(
                f"{what}: {name}={peer} is not another rank of this group (ranks 0 .. "
                f"{self.world_size - 1}, this one is {self.rank})"
            )
        if self.group is None:
            return peer
        import torch.distributed as dist

        return int(dist.get_global_rank(self.group, peer))

    def send(self, t: torch.Tensor, dst: int) -> None:
        """Send ``t`` to rank ``dst`` of this group (blocking until it is handed over);
        the receiver's :meth:`recv` needs a tensor of the same shape and dtype.

        :raises ValueError: ``dst`` is not another rank of the group.
        :raises RuntimeError: a world of one.
        """
        target = self._peer("send", dst, "dst")
        import torch.distributed as dist

        dist.send(t.contiguous(), dst=target, group=self.group)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        """Receive into ``t`` (preallocated, contiguous, the sender's shape and dtype) what
        rank ``src`` of this group sends; returns ``t``.

        :raises ValueError: ``src`` is not another rank of the group, or ``t`` is not
            contiguous.
        :raises RuntimeError: a world of one.
        """
        source = self._peer("recv", src, "src")
        if not t.is_contiguous():
            raise ValueError("recv: the tensor to receive into must be contiguous")
        import torch.distributed as dist

        dist.recv(t, src=source, group=self.group)
        return t

    def send_object(self, obj: object, dst: int) -> None:
        """Send a small picklable object (step metadata) to rank ``dst`` of this group.

        :raises ValueError: ``dst`` is not another rank of the group.
        :raises RuntimeError: a world of one.
        """
        target = self._peer("send_object", dst, "dst")
        import torch.distributed as dist

        dist.send_object_list([obj], dst=target, group=self.group)

    def recv_object(self, src: int) -> Any:
        """The object rank ``src`` of this group sends with :meth:`send_object`.

        :raises ValueError: ``src`` is not another rank of the group.
        :raises RuntimeError: a world of one.
        """
        source = self._peer("recv_object", src, "src")
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.recv_object_list(box, src=source, group=self.group)
        return box[0]


# -- the mesh of a replica (SPEC 15) ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelParallelGroups:
    """This rank's place in one replica's mesh of ``tp_size x pp_size`` ranks, tensor
    ranks innermost (the reference engine's order): global rank ``r`` is pipeline stage
    ``r // tp_size`` and tensor rank ``r % tp_size``.

    ``tp_group`` holds the ranks of this rank's stage, ``pp_group`` the ranks with its
    tensor rank, one per stage (``torch.distributed`` groups; None in a world of one);
    ``tp_communicator`` and ``pp_communicator`` are the platform's communicators of
    those groups (a stage sends to the next with ``pp_communicator.send(t,
    next_stage)``, ranks within ``pp_group`` being stage numbers).

    A world that holds several data-parallel replicas (``dp_size`` of them, made with
    ``data_parallel_size``: a launcher such as torchrun starts every rank of every
    replica in one job) numbers replicas outermost: global rank ``r`` is in replica
    ``r // (tp_size x pp_size)``, and ``rank`` and the stage and tensor ranks are
    counted within it. ``replica_group`` holds the ranks of this rank's replica
    (None: the whole world, when there is one replica), ``replica_communicator``
    its communicator; the groups of different replicas never meet.
    """

    rank: int
    world_size: int
    tp_size: int
    pp_size: int
    tp_rank: int
    pp_rank: int
    tp_group: Any
    pp_group: Any
    tp_communicator: DeviceCommunicator
    pp_communicator: DeviceCommunicator
    dp_size: int = 1
    dp_rank: int = 0
    replica_group: Any = None
    replica_communicator: DeviceCommunicator | None = None

    @property
    def is_first_stage(self) -> bool:
        """Whether this rank is in the first pipeline stage (it embeds the tokens)."""
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank is in the last pipeline stage (it computes the logits)."""
        return self.pp_rank == self.pp_size - 1

    @property
    def previous_stage(self) -> int | None:
        """The stage before this one (a rank of ``pp_group``), or None for the first."""
        return None if self.is_first_stage else self.pp_rank - 1

    @property
    def next_stage(self) -> int | None:
        """The stage after this one (a rank of ``pp_group``), or None for the last."""
        return None if self.is_last_stage else self.pp_rank + 1


def mesh_ranks(
    tp_size: int, pp_size: int, dp_size: int = 1
) -> tuple[list[list[int]], list[list[int]]]:
    """The global ranks of every tensor-parallel group (one per stage) and every
    pipeline group (one per tensor rank) of ``dp_size`` replicas of ``tp_size x
    pp_size`` ranks (replica by replica)."""
    size = tp_size * pp_size
    tp_groups = [
        [d * size + s * tp_size + t for t in range(tp_size)]
        for d in range(dp_size)
        for s in range(pp_size)
    ]
    pp_groups = [
        [d * size + s * tp_size + t for s in range(pp_size)]
        for d in range(dp_size)
        for t in range(tp_size)
    ]
    return tp_groups, pp_groups


_mesh: dict[tuple[int, int, int, int], tuple[Any, Any, Any]] = {}
"""(tp, pp, dp, id of the default group) -> this rank's (tp_group, pp_group,
replica_group), made once."""


def model_parallel_groups(
    tp_size: int, pp_size: int, make_communicator: Any, dp_size: int = 1
) -> ModelParallelGroups:
    """This rank's :class:`ModelParallelGroups` of ``dp_size`` replicas of ``tp_size x
    pp_size`` ranks over the default process group (what
    ``Platform.init_model_parallel`` runs; every rank calls it with the same sizes).
    ``make_communicator(group)`` builds a communicator.

    :raises ValueError: a size that is not a positive integer, or sizes whose product
        is not the world size (each named).
    """
    sizes = (
        ("tensor_parallel_size", tp_size),
        ("pipeline_parallel_size", pp_size),
        ("data_parallel_size", dp_size),
    )
    for name, value in sizes:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if initialised else 1
    global_rank = dist.get_rank() if initialised else 0
    if tp_size * pp_size * dp_size != world:
        sizes_text = f"tensor_parallel_size={tp_size} x pipeline_parallel_size={pp_size}"
        if dp_size != 1:
            sizes_text += f" x data_parallel_size={dp_size}"
        raise ValueError(
            f"{sizes_text} = {tp_size * pp_size * dp_size} ranks, but the world has "
            f"world_size={world}; the sizes must multiply to the world size (call "
            "init_distributed with that world)"
        )
    if world == 1:
        return ModelParallelGroups(
            0, 1, 1, 1, 0, 0, None, None, make_communicator(None), make_communicator(None)
        )
    size = tp_size * pp_size
    key = (tp_size, pp_size, dp_size, id(dist.group.WORLD))
    with _lock:
        groups = _mesh.get(key)
        if groups is None:
            tp_groups, pp_groups = mesh_ranks(tp_size, pp_size, dp_size)
            replicas = [list(range(d * size, (d + 1) * size)) for d in range(dp_size)]
            mine: list[Any] = [None, None, None]
            # every rank makes every group, in the same order (torch.distributed's rule)
            for slot, all_ranks in enumerate((tp_groups, pp_groups, replicas)):
                if slot == 2 and dp_size == 1:
                    break  # one replica: its group is the world
                for ranks in all_ranks:
                    group = dist.new_group(ranks)
                    if global_rank in ranks:
                        mine[slot] = group
            groups = _mesh[key] = (mine[0], mine[1], mine[2])
    tp_group, pp_group, replica_group = groups
    rank = global_rank % size
    return ModelParallelGroups(
        rank,
        size,
        tp_size,
        pp_size,
        rank % tp_size,
        rank // tp_size,
        tp_group,
        pp_group,
        make_communicator(tp_group),
        make_communicator(pp_group),
        dp_size,
        global_rank // size,
        replica_group,
        make_communicator(replica_group),
    )


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
