"""A platform's device runtime: the services an engine calls while it runs (SPEC 13, 14).

:class:`~hwplug.core.platform.Platform` keeps the rules; its
:attr:`~hwplug.core.platform.Platform.runtime` hands out one :class:`DeviceRuntime`
per platform instance (of the class :attr:`~hwplug.core.platform.Platform.runtime_cls`
names), and the service methods SPEC 13 and 14 name on ``Platform`` hand over to it.

The base drives torch's module of the platform's ``device_type`` (``torch.cuda``,
``torch.xpu``, ``torch.hpu`` once its stack is imported, a vendor's own
``torch.<type>``). A platform whose device is driven otherwise (the host CPU, a
vendor's own runtime library) subclasses it and names the subclass in
``runtime_cls``; :meth:`DeviceRuntime.require_real_device`,
:meth:`DeviceRuntime.device_index` and :meth:`DeviceRuntime.torch_module` are the
checks a subclass shares.

Nothing here imports torch at import time; every method that needs it imports it
lazily.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hwplug.core import distributed
from hwplug.core.distributed import DeviceCommunicator
from hwplug.core.errors import PluginError, brief

if TYPE_CHECKING:
    import torch

    from hwplug.core.platform import Platform

__all__ = [
    "DIST_TIMEOUT",
    "LAUNCHER_VARIABLES",
    "DeviceRuntime",
    "LauncherEnvironment",
    "launcher_environment",
    "rendezvous_problem",
]

DIST_TIMEOUT = timedelta(minutes=10)
"""How long joining the process group may take by default (SPEC 14's ``timeout``)."""


def _check_world(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in [0, world_size) and world_size >= 1; got rank={rank}, "
            f"world_size={world_size}"
        )


class DeviceRuntime:
    """The device services of one platform instance.

    On a simulated platform the services that would touch a device raise
    ``RuntimeError`` saying so; :meth:`torch_device` and :meth:`seed_everything`
    touch none and work everywhere (an engine may run a simulated platform's
    configuration on CPU tensors). Memory figures are in bytes.
    """

    def __init__(self, platform: Platform) -> None:
        self.platform = platform
        """The platform instance whose devices this runtime drives."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.platform!r}>"

    # -- checks a subclass shares ------------------------------------------------------
    def require_real_device(self, what: str) -> None:
        """Raise ``RuntimeError`` naming ``what`` when the platform is simulated."""
        plat = self.platform
        if plat.simulated:
            raise RuntimeError(
                f"{what} needs a real device, but the {plat.name} platform is simulated "
                f"(profile {plat.profile!r}: there is no device to call). Run on a machine "
                f"with the device and without HWPLUG_SIMULATE (or use_platform) selecting a "
                "profile; to test on CPU, run the configuration on CPU tensors instead"
            )

    def device_index(self, i: int) -> int:
        """``i`` checked to be an integer naming one of the platform's devices.

        :raises ValueError: ``i`` is not an integer.
        :raises IndexError: ``i`` is negative, or past the platform's devices.
        """
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"device index must be an integer, got {i!r}")
        if self.platform.devices:
            self.platform._device(i)
        elif i < 0:
            raise IndexError(f"device index must be >= 0, got {i}")
        return i

    def torch_module(self, what: str, attribute: str) -> Any:
        """``torch.<device_type>``, checked to provide the callable ``attribute``.

        :raises RuntimeError: this torch build has no such module or function
            (the message names both, and ``what`` needed them).
        """
        import torch

        plat = self.platform
        module = getattr(torch, plat.device_type, None) if plat.device_type else None
        if module is None or not callable(getattr(module, attribute, None)):
            raise RuntimeError(
                f"{what} on the {plat.name} platform needs torch.{plat.device_type or '?'}"
                f".{attribute}, which this torch build lacks; install the torch build (or the "
                f"vendor extension) for {plat.vendor or plat.name} devices"
            )
        return module

    # -- devices ---------------------------------------------------------------------
    def torch_device(self, i: int = 0) -> torch.device:
        """The torch device for device ``i``; never initialises it.

        Works on a simulated platform too: it names the device the platform would
        use, and tensors placed on it fail where the device is absent.
        """
        import torch

        return torch.device(self.platform.device_type, self.device_index(i))

    def set_device(self, i: int) -> None:
        """Make device ``i`` this thread's current device.

        :raises RuntimeError: the platform is simulated, or torch has no runtime
            for its device type.
        """
        index = self.device_index(i)
        self.require_real_device("set_device()")
        self.torch_module("set_device()", "set_device").set_device(index)

    def synchronize(self) -> None:
        """Wait for the work queued on the current device.

        :raises RuntimeError: the platform is simulated, or torch has no runtime
            for its device type.
        """
        self.require_real_device("synchronize()")
        self.torch_module("synchronize()", "synchronize").synchronize()

    def empty_cache(self) -> None:
        """Return the allocator's cached, unused device memory to the device.

        :raises RuntimeError: the platform is simulated, or torch has no runtime
            for its device type.
        """
        self.require_real_device("empty_cache()")
        self.torch_module("empty_cache()", "empty_cache").empty_cache()

    def seed_everything(self, seed: int) -> None:
        """Seed Python's ``random``, NumPy (when installed) and torch on every device.

        Touches no device (torch seeds device generators lazily), so it works
        on a simulated platform.

        :raises ValueError: ``seed`` is not a non-negative integer.
        """
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        import random

        import torch

        random.seed(seed)
        try:
            import numpy
        except ImportError:
            pass
        else:
            numpy.random.seed(seed % (1 << 32))
        torch.manual_seed(seed)

    def mem_get_info(self, i: int = 0) -> tuple[int, int]:
        """``(free, total)`` bytes of device ``i``.

        :raises RuntimeError: the platform is simulated, or torch has no memory
            query for its device type.
        """
        index = self.device_index(i)
        self.require_real_device("mem_get_info()")
        free, total = self.torch_module("mem_get_info()", "mem_get_info").mem_get_info(index)
        return int(free), int(total)

    def get_current_memory_usage(self, i: int = 0) -> int:
        """Bytes this process holds on device ``i``.

        Simulated devices are idle: 0. On a real device the base asks
        ``torch.<device_type>.memory_allocated`` (0 where torch has no such
        function).
        """
        used = self._torch_counter(i, "memory usage", "memory_allocated")
        return 0 if used is None else used

    def peak_memory_usage(self, i: int = 0) -> int:
        """The most bytes this process has held on device ``i`` since the last reset
        (``torch.<device_type>.max_memory_allocated``): what a profile run needs,
        activations included. Without a peak counter: the current usage; simulated
        devices 0.
        """
        peak = self._torch_counter(i, "peak memory usage", "max_memory_allocated")
        return self.get_current_memory_usage(i) if peak is None else peak

    def _torch_counter(self, i: int, what: str, attribute: str) -> int | None:
        """``torch.<device_type>.<attribute>(i)``: 0 on a simulated device, None where
        torch has no such counter."""
        self.platform._device(i)
        if self.platform.simulated:
            return 0
        try:
            module = self.torch_module(what, attribute)
        except RuntimeError:
            return None
        return int(getattr(module, attribute)(i))

    # -- distributed -----------------------------------------------------------------
    def bind_device(self, local_rank: int) -> None:
        """Bind the rank ``local_rank`` on this host to its device before it joins a
        process group: ``set_device(local_rank)``."""
        self.set_device(local_rank)

    def init_process_group(
        self,
        world_size: int,
        rank: int,
        init_method: str = "env://",
        timeout: timedelta | float | None = None,
    ) -> Any:
        """Initialise ``torch.distributed`` with the platform's backend; picks no device.

        Returns the default process group. ``timeout`` is a ``timedelta`` or
        seconds. :meth:`init_distributed` is the service engines call.
        """
        plat = self.platform
        if not plat.dist_backend:
            raise RuntimeError(f"the {plat.name} platform has no torch.distributed backend")
        _check_world(rank, world_size)
        import torch.distributed as dist

        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = (
                timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
            )
        dist.init_process_group(
            backend=plat.dist_backend,
            init_method=init_method,
            world_size=world_size,
            rank=rank,
            **kwargs,
        )
        return dist.group.WORLD

    def init_distributed(
        self,
        rank: int,
        world_size: int,
        *,
        local_rank: int | None = None,
        init_method: str = "env://",
        timeout: timedelta = DIST_TIMEOUT,
    ) -> Any:
        """Bind this rank to its device and join the default process group (SPEC 14).

        :meth:`bind_device` (``local_rank`` defaults to ``rank``), then
        ``torch.distributed`` with the platform's ``dist_backend`` over
        ``init_method`` (``env://`` reads ``MASTER_ADDR`` and ``MASTER_PORT``;
        ``tcp://host:port`` names them). Called again with the same arguments it
        returns the same group.

        :raises ValueError: a rank outside ``[0, world_size)``, a bad argument, or a
            rendezvous address or port that is missing or malformed (``MASTER_ADDR``
            and ``MASTER_PORT`` for ``env://``; the URL's for ``tcp://``), named.
        :raises RuntimeError: the platform is simulated or has no collective
            backend, or the process already joined with other arguments (both
            are named).
        """
        for name, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        _check_world(rank, world_size)
        local = rank if local_rank is None else local_rank
        if isinstance(local, bool) or not isinstance(local, int) or local < 0:
            raise ValueError(f"local_rank must be a non-negative integer, got {local_rank!r}")
        if not isinstance(init_method, str) or not init_method:
            raise ValueError(f"init_method must be a URL such as 'env://', got {init_method!r}")
        if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
            raise ValueError(f"timeout must be a positive datetime.timedelta, got {timeout!r}")
        self.require_real_device("init_distributed()")
        plat = self.platform
        if not plat.dist_backend:
            raise RuntimeError(
                f"the {plat.name} platform names no torch.distributed backend (dist_backend); "
                "it cannot join a process group"
            )
        problem = rendezvous_problem(init_method, os.environ)
        if problem is not None:
            raise ValueError(problem)
        self.bind_device(local)
        setup = distributed.DistributedSetup(
            plat.dist_backend, rank, world_size, local, init_method, timeout
        )
        return distributed.init_process_group(setup)

    def init_model_parallel(
        self,
        tensor_parallel_size: int,
        pipeline_parallel_size: int = 1,
        *,
        data_parallel_size: int = 1,
    ) -> distributed.ModelParallelGroups:
        """This rank's tensor- and pipeline-parallel groups of a replica of
        ``tensor_parallel_size x pipeline_parallel_size`` ranks (SPEC 15), tensor ranks
        innermost, with the platform's communicators of both; after
        :meth:`init_distributed` (a world of one needs neither: its groups are this
        process alone). Every rank of the world calls it with the same sizes; called
        again, it reuses the groups. ``data_parallel_size`` replicas share the world
        when one launcher started them all (torchrun): replicas outermost, each with
        groups of its own (:class:`~hwplug.core.distributed.ModelParallelGroups`).

        :raises ValueError: a size that is not a positive integer, or sizes that do not
            multiply to the world size (each named).
        """
        return distributed.model_parallel_groups(
            tensor_parallel_size,
            pipeline_parallel_size,
            self.device_communicator,
            data_parallel_size,
        )

    def destroy_distributed(self) -> None:
        """Leave and destroy the default process group (nothing when there is none)."""
        distributed.destroy_process_group()

    def device_communicator(self, group: Any = None) -> DeviceCommunicator:
        """The collectives of ``group`` (None: the default process group, or this
        process alone when ``torch.distributed`` is not initialised): an instance of
        the platform's ``communicator_cls``, by default
        :class:`~hwplug.core.distributed.DeviceCommunicator`.

        :raises PluginError: ``communicator_cls`` is not a ``DeviceCommunicator``
            subclass.
        """
        plat = self.platform
        cls = plat.communicator_cls or DeviceCommunicator
        if not (isinstance(cls, type) and issubclass(cls, DeviceCommunicator)):
            raise PluginError(
                f"platform {plat.name!r}: communicator_cls is {brief(cls)}, which is not a "
                "subclass of hwplug.core.distributed.DeviceCommunicator"
            )
        return cls(group)


def rendezvous_problem(init_method: str, environ: Mapping[str, str]) -> str | None:
    """What is wrong with the rendezvous ``init_method`` names, or None: for ``env://``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` in ``environ`` (set, and a port 1 .. 65535); for
    ``tcp://host:port``, the URL's host and port. Other schemes (``file://``) are torch's
    to check."""
    if init_method.startswith("env://"):
        address = environ.get("MASTER_ADDR", "").strip()
        if not address:
            return (
                "init_method='env://' reads MASTER_ADDR, which is not set: set it to the "
                "address of rank 0's host (127.0.0.1 on one machine)"
            )
        return _port_problem("MASTER_PORT", environ.get("MASTER_PORT"), "init_method='env://'")
    if init_method.startswith("tcp://"):
        from urllib.parse import urlsplit

        netloc = urlsplit(init_method).netloc
        host, _, port = netloc.rpartition(":")
        if not host:
            return (
                f"init_method={init_method!r} names no host: use tcp://<host>:<port>, as in "
                "tcp://127.0.0.1:29500"
            )
        return _port_problem("its port", port, f"init_method={init_method!r}")
    return None


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What ``torchrun`` (and launchers like it) set in each process it starts."""


@dataclasses.dataclass(frozen=True)
class LauncherEnvironment:
    """One process's place as its launcher set it (:func:`launcher_environment`)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def launcher_environment(
    environ: Mapping[str, str] | None = None, *, where: str = ""
) -> LauncherEnvironment:
    """The launcher's variables (:data:`LAUNCHER_VARIABLES`) of ``environ`` (default:
    the process's), each checked: ``WORLD_SIZE`` a positive integer, ``RANK`` below
    it, ``LOCAL_RANK`` a non-negative integer, ``MASTER_ADDR`` set and ``MASTER_PORT``
    a TCP port (torch reads both later, when the rank joins the process group).
    What an engine's ``external_launcher`` executor reads before it starts a rank;
    ``where`` (say ``"for parallel.distributed_executor_backend='external_launcher'"``)
    ends each error's "set by the launcher" clause.

    :raises ValueError: variables unset (all of them named, with how to start the
        processes), or one that is not an integer or is out of its range (named with
        its value and what is allowed).
    """
    env = os.environ if environ is None else environ
    missing = [name for name in LAUNCHER_VARIABLES if not env.get(name, "").strip()]
    if missing:
        context = f"{where}; " if where else ""
        raise ValueError(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; a launcher "
            f"such as torchrun sets {', '.join(LAUNCHER_VARIABLES)} in each process it starts "
            f"({context}run: torchrun --nproc-per-node N ...)"
        )

    def integer(name: str, lowest: int, highest: int | None, allowed: str) -> int:
        raw = env[name]
        value = _bounded_integer(raw, lowest, highest)
        if isinstance(value, str):
            context = f" {where}" if where else ""
            raise ValueError(
                f"{name}={raw!r} {value}; {name} must be {allowed} (set by the launcher{context})"
            )
        return value

    world = integer("WORLD_SIZE", 1, None, "a positive integer")
    rank = integer("RANK", 0, world - 1, f"an integer 0 .. {world - 1}, below WORLD_SIZE={world}")
    local_rank = integer("LOCAL_RANK", 0, None, "a non-negative integer")
    port = integer("MASTER_PORT", 1, 65535, _PORT_ALLOWED)
    return LauncherEnvironment(rank, world, local_rank, env["MASTER_ADDR"].strip(), port)


_PORT_ALLOWED = "a TCP port, an integer 1 .. 65535"


def _bounded_integer(raw: str, lowest: int, highest: int | None) -> int | str:
    """``raw`` as an integer in ``[lowest, highest]`` (no upper bound where None), or
    what is wrong with it: ``"is not an integer"`` or ``"is out of range"``."""
    try:
        value = int(raw)
    except ValueError:
        return "is not an integer"
    if value < lowest or (highest is not None and value > highest):
        return "is out of range"
    return value


def _port_problem(name: str, value: str | None, where: str) -> str | None:
    text = (value or "").strip()
    if not text:
        return f"{where} reads {name}, which is not set: set it to {_PORT_ALLOWED}"
    port = _bounded_integer(text, 1, 65535)
    if isinstance(port, str):
        return f"{where}: {name}={text!r} {port}; it must be {_PORT_ALLOWED}"
    return None
