"""SPEC 14's platform services: init_distributed, device_communicator, destroy_distributed."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import pytest
import torch

from hwplug.core.distributed import DeviceCommunicator
from hwplug.core.errors import PluginError
from hwplug.platforms.cpu import CpuPlatform


def test_a_world_of_one_is_the_identity_and_touches_no_process_group() -> None:
    import torch.distributed as dist

    comm = CpuPlatform.simulate("cpu-generic").device_communicator()
    assert isinstance(comm, DeviceCommunicator)
    assert (comm.world_size, comm.rank) == (1, 0)
    t = torch.arange(6.0).reshape(2, 3)
    assert comm.all_reduce(t) is t
    assert comm.all_gather(t) is t
    assert comm.all_gather(t, dim=0) is t
    assert comm.reduce_scatter(t) is t
    assert comm.broadcast(t) is t
    comm.barrier()
    assert torch.equal(t, torch.arange(6.0).reshape(2, 3))
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="src=1 is not a rank of a world of 1"):
        comm.broadcast(t, src=1)


def test_a_group_without_torch_distributed_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="call platform.init_distributed"):
        DeviceCommunicator(group=object())


def test_a_simulated_platform_cannot_join_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="simulated"):
        CpuPlatform.simulate("cpu-generic").init_distributed(0, 1)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((2, 2), {}, "rank must be in"),
        ((-1, 2), {}, "rank must be in"),
        ((0, 0), {}, "rank must be in"),
        ((0, True), {}, "world_size must be an integer"),
        ((0, 1), {"local_rank": -1}, "local_rank must be"),
        ((0, 1), {"init_method": ""}, "init_method must be"),
        ((0, 1), {"timeout": 5}, "timeout must be a positive datetime.timedelta"),
        ((0, 1), {"timeout": timedelta(0)}, "timeout must be a positive"),
    ],
)
def test_bad_arguments_are_value_errors(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CpuPlatform.simulate("cpu-generic").init_distributed(*args, **kwargs)


@pytest.mark.parametrize(
    ("init_method", "env", "message"),
    [
        ("env://", {"MASTER_PORT": "29500"}, "reads MASTER_ADDR, which is not set"),
        ("env://", {"MASTER_ADDR": "127.0.0.1"}, "reads MASTER_PORT, which is not set"),
        (
            "env://",
            {"MASTER_ADDR": "h", "MASTER_PORT": "notaport"},
            "MASTER_PORT='notaport' is not an integer; it must be a TCP port, an integer 1 .. 65535",
        ),
        ("env://", {"MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is out of"),
        ("tcp://:29500", {}, "names no host: use tcp://<host>:<port>"),
        ("tcp://h:port", {}, "its port='port' is not an integer"),
        ("tcp://h:0", {}, "its port='0' is out of range"),
    ],
)
def test_a_bad_rendezvous_is_named_before_torch_sees_it(
    init_method: str, env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    host = CpuPlatform(tuple(CpuPlatform.detect()))  # a real one: a simulated one is refused first
    with pytest.raises(ValueError, match=re.escape(message)):
        host.init_distributed(0, 1, init_method=init_method)


def test_a_communicator_class_that_is_not_one_is_a_plugin_error() -> None:
    class Odd(CpuPlatform):
        communicator_cls = dict

    with pytest.raises(PluginError, match="communicator_cls is <class 'dict'>"):
        Odd.simulate("cpu-generic").device_communicator()


def test_a_vendor_communicator_is_used() -> None:
    class Counting(DeviceCommunicator):
        calls = 0

        def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
            type(self).calls += 1
            return super().all_reduce(t)

    class Vendor(CpuPlatform):
        communicator_cls = Counting

    comm = Vendor.simulate("cpu-generic").device_communicator()
    assert isinstance(comm, Counting)
    comm.all_reduce(torch.ones(2))
    assert Counting.calls == 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hwplug.plugins.manager import platform_from_spec

    rank, port = int(sys.argv[1]), sys.argv[2]
    plat = platform_from_spec("cpu")
    assert not plat.simulated
    url = f"tcp://127.0.0.1:{port}"
    group = plat.init_distributed(rank, 2, init_method=url, timeout=timedelta(seconds=60))
    again = plat.init_distributed(rank, 2, init_method=url, timeout=timedelta(seconds=60))
    try:
        plat.init_distributed(rank, 2, init_method=url, timeout=timedelta(seconds=30))
        clash = ""
    except RuntimeError as exc:
        clash = str(exc)
    comm = plat.device_communicator()
    out = {"same_group": group is again, "clash": clash, "backend": dist.get_backend(group)}
    out["world"] = [comm.world_size, comm.rank]
    x = torch.tensor([1.0, 2.0]) * (rank + 1)
    out["all_reduce"] = comm.all_reduce(x.clone()).tolist()
    out["all_gather"] = comm.all_gather(x).tolist()
    out["all_gather_0"] = comm.all_gather(x.reshape(1, 2), dim=0).tolist()
    y = torch.arange(4.0) + 10 * rank
    out["reduce_scatter"] = comm.reduce_scatter(y).tolist()
    out["broadcast"] = comm.broadcast(torch.tensor([float(rank)]), src=1).tolist()
    comm.barrier()
    plat.destroy_distributed()
    out["after"] = dist.is_initialized()
    print(json.dumps(out), flush=True)
    if rank == 0:  # rank 0 serves the store: it exits last, once the test says so
        sys.stdin.read()
    """
)


@pytest.mark.slow
def test_two_cpu_ranks_run_every_collective_over_gloo() -> None:
    for _attempt in range(3):  # a lost rendezvous on a loaded machine: try again
        port = _free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT, str(rank), str(port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(2)
        ]
        results = []
        try:
            # rank 1 first: rank 0 hosts the TCP store and leaves after every client has
            # (gloo's threads torn down under a connected client can abort at exit)
            for proc in reversed(procs):
                out, err = proc.communicate(timeout=120)
                results.insert(0, (proc.returncode, out, err))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if all(code == 0 for code, _, _ in results):
            break
    assert all(code == 0 for code, _, _ in results), [err for _, _, err in results]
    ranks = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]
    for rank, data in enumerate(ranks):
        assert data["same_group"] is True
        assert "already initialised in this process with" in data["clash"]
        assert "timeout=0:01:00" in data["clash"] and "timeout=0:00:30" in data["clash"]
        assert data["backend"] == "gloo"
        assert data["world"] == [2, rank]
        assert data["all_reduce"] == [3.0, 6.0]
        assert data["all_gather"] == [1.0, 2.0, 2.0, 4.0]
        assert data["all_gather_0"] == [[1.0, 2.0], [2.0, 4.0]]
        assert data["reduce_scatter"] == [[10.0, 12.0], [14.0, 16.0]][rank]
        assert data["broadcast"] == [1.0]
        assert data["after"] is False
