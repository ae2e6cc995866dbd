"""Registration of the ``hwplug::all_reduce`` and ``hwplug::all_gather`` torch custom ops.

Importing this module imports torch and registers the ops;
:mod:`hwplug.core.distributed` imports it on first use. (No ``from __future__
import annotations`` here: ``torch.library`` reads the signatures' annotations
to build the schemas.)
"""

import torch

from hwplug.core.distributed import communicator

__all__ = ["OPS"]


@torch.library.custom_op("hwplug::all_reduce", mutates_args=())
def all_reduce_op(t: torch.Tensor, group: str) -> torch.Tensor:
    """The sum of ``t`` over the ranks of the communicator registered as ``group``."""
    out = t.clone()
    communicator(group).all_reduce(out)
    return out


@all_reduce_op.register_fake
def _(t: torch.Tensor, group: str) -> torch.Tensor:
    return torch.empty_like(t)


@torch.library.custom_op("hwplug::all_gather", mutates_args=())
def all_gather_op(t: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    """Every rank's ``t`` along ``dim``, over the communicator registered as ``group``."""
    return communicator(group).all_gather(t, dim=dim).clone()


@all_gather_op.register_fake
def _(t: torch.Tensor, dim: int, group: str) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] *= communicator(group).world_size
    return t.new_empty(shape)


OPS = torch.ops.hwplug
"""``torch.ops.hwplug``, with the two collectives registered."""
