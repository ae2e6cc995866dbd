"""ACME's collectives: how a vendor brings its own communicator (SPEC 14).

A platform names its class in ``communicator_cls``; ``Platform.device_communicator()``
then hands engines an instance. This demo runs torch.distributed's collectives
(the NPU is simulated) and counts them, as a real vendor class would call its
runtime's collectives instead. Importing this module does not import torch.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from hwplug.core.distributed import DeviceCommunicator

if TYPE_CHECKING:
    import torch

__all__ = ["AcmeCommunicator"]


class AcmeCommunicator(DeviceCommunicator):
    """torch.distributed's collectives and transfers, counted per operation in :attr:`calls`."""

    def __init__(self, group: object = None) -> None:
        super().__init__(group)
        self.calls: collections.Counter[str] = collections.Counter()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        self.calls["all_reduce"] += 1
        return super().all_reduce(t)

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls["all_gather"] += 1
        return super().all_gather(t, dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        self.calls["reduce_scatter"] += 1
        return super().reduce_scatter(t, dim)

    def broadcast(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        self.calls["broadcast"] += 1
        return super().broadcast(t, src)

    def barrier(self) -> None:
        self.calls["barrier"] += 1
        super().barrier()

    def send(self, t: torch.Tensor, dst: int) -> None:
        self.calls["send"] += 1
        super().send(t, dst)

    def recv(self, t: torch.Tensor, src: int) -> torch.Tensor:
        self.calls["recv"] += 1
        return super().recv(t, src)

    def send_object(self, obj: object, dst: int) -> None:
        self.calls["send_object"] += 1
        super().send_object(obj, dst)

    def recv_object(self, src: int) -> object:
        self.calls["recv_object"] += 1
        return super().recv_object(src)
