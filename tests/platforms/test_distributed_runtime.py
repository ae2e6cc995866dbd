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


def _run_ranks(script: str, world: int, timeout: float = 180) -> list[dict[str, Any]]:
    """Run ``script`` as ranks 0 .. world - 1 (argv: rank, port) and return each rank's
    last line of output as JSON; a lost rendezvous on a loaded machine is tried again."""
    for _attempt in range(3):
        port = _free_port()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(rank), str(port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(world)
        ]
        results = []
        try:
            # the others first: rank 0 hosts the TCP store and leaves after every client
            # has (gloo's threads torn down under a connected client can abort at exit)
            for proc in reversed(procs):
                out, err = proc.communicate(timeout=timeout)
                results.insert(0, (proc.returncode, out, err))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if all(code == 0 for code, _, _ in results):
            break
    assert all(code == 0 for code, _, _ in results), [err[-2000:] for _, _, err in results]
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in results]


@pytest.mark.slow
def test_two_cpu_ranks_run_every_collective_over_gloo() -> None:
    ranks = _run_ranks(RANK_SCRIPT, 2)
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


# -- the mesh of a replica and point-to-point transfers (SPEC 15) ---------------------------


def test_a_world_of_one_is_its_own_mesh_and_has_no_one_to_talk_to() -> None:
    plat = CpuPlatform.simulate("cpu-generic")
    mesh = plat.init_model_parallel(1, 1)
    assert (mesh.tp_rank, mesh.pp_rank, mesh.tp_size, mesh.pp_size) == (0, 0, 1, 1)
    assert mesh.is_first_stage and mesh.is_last_stage
    assert mesh.previous_stage is None and mesh.next_stage is None
    assert mesh.tp_communicator.all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]
    for call in (
        lambda: mesh.pp_communicator.send(torch.ones(1), 1),
        lambda: mesh.pp_communicator.recv(torch.ones(1), 1),
        lambda: mesh.pp_communicator.send_object("x", 1),
        lambda: mesh.pp_communicator.recv_object(1),
    ):
        with pytest.raises(RuntimeError, match="world is this process alone"):
            call()


@pytest.mark.parametrize(
    ("tp", "pp", "message"),
    [
        (2, 1, "tensor_parallel_size=2 x pipeline_parallel_size=1 = 2 ranks, but the world has "
         "world_size=1"),
        (1, 3, "pipeline_parallel_size=3 = 3 ranks, but the world has world_size=1"),
        (0, 1, "tensor_parallel_size must be a positive integer, got 0"),
        (1, True, "pipeline_parallel_size must be a positive integer, got True"),
    ],
)  # fmt: skip
def test_mesh_sizes_that_do_not_make_the_world_are_named(tp: Any, pp: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CpuPlatform.simulate("cpu-generic").init_model_parallel(tp, pp)


def test_the_mesh_puts_tensor_ranks_innermost() -> None:
    from hwplug.core.distributed import mesh_ranks

    assert mesh_ranks(2, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert mesh_ranks(1, 3) == ([[0], [1], [2]], [[0, 1, 2]])
    assert mesh_ranks(4, 1) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]])
    # replicas outermost, each a mesh of its own
    assert mesh_ranks(1, 2, 2) == ([[0], [1], [2], [3]], [[0, 1], [2, 3]])
    assert mesh_ranks(2, 1, 2) == ([[0, 1], [2, 3]], [[0], [1], [2], [3]])


def test_mesh_sizes_with_replicas_name_the_data_parallel_size() -> None:
    plat = CpuPlatform.simulate("cpu-generic")
    message = (
        "tensor_parallel_size=1 x pipeline_parallel_size=1 x data_parallel_size=2 = 2 "
        "ranks, but the world has world_size=1"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        plat.init_model_parallel(1, 1, data_parallel_size=2)
    with pytest.raises(ValueError, match="data_parallel_size must be a positive integer"):
        plat.init_model_parallel(1, 1, data_parallel_size=0)
    one = plat.init_model_parallel(1, 1, data_parallel_size=1)
    assert (one.dp_size, one.dp_rank, one.replica_group) == (1, 0, None)


REPLICAS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta

    import torch

    from hwplug.plugins.manager import platform_from_spec

    rank, port = int(sys.argv[1]), sys.argv[2]
    plat = platform_from_spec("cpu")
    plat.init_distributed(rank, 4, init_method=f"tcp://127.0.0.1:{port}",
                          timeout=timedelta(seconds=60))
    mesh = plat.init_model_parallel(1, 2, data_parallel_size=2)
    out = {"place": [mesh.dp_rank, mesh.rank, mesh.pp_rank, mesh.world_size, mesh.dp_size]}
    # a replica's collective meets its own ranks only
    out["replica_sum"] = mesh.replica_communicator.all_reduce(
        torch.tensor([float(rank)])).tolist()
    pipe = mesh.pp_communicator
    if mesh.is_first_stage:
        pipe.send(torch.tensor([10.0 * rank]), mesh.next_stage)
        out["got"] = None
    else:
        out["got"] = pipe.recv(torch.zeros(1), mesh.previous_stage).tolist()
    plat.destroy_distributed()
    print(json.dumps(out), flush=True)
    if rank == 0:
        sys.stdin.read()
    """
)


@pytest.mark.slow
def test_replicas_in_one_world_each_have_a_mesh_of_their_own() -> None:
    ranks = _run_ranks(REPLICAS_SCRIPT, 4)
    assert [r["place"] for r in ranks] == [
        [0, 0, 0, 2, 2], [0, 1, 1, 2, 2], [1, 0, 0, 2, 2], [1, 1, 1, 2, 2]
    ]  # fmt: skip
    assert [r["replica_sum"] for r in ranks] == [[1.0], [1.0], [5.0], [5.0]]
    # each replica's last stage got its own first stage's activations
    assert ranks[1]["got"] == [0.0] and ranks[3]["got"] == [20.0]


MESH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta

    import torch

    from hwplug.plugins.manager import platform_from_spec

    rank, port = int(sys.argv[1]), sys.argv[2]
    plat = platform_from_spec("cpu")
    plat.init_distributed(rank, 4, init_method=f"tcp://127.0.0.1:{port}",
                          timeout=timedelta(seconds=60))
    mesh = plat.init_model_parallel(2, 2)
    again = plat.init_model_parallel(2, 2)
    out = {"place": [mesh.tp_rank, mesh.pp_rank, mesh.is_first_stage, mesh.is_last_stage],
           "same": again.tp_group is mesh.tp_group and again.pp_group is mesh.pp_group,
           "sizes": [mesh.tp_communicator.world_size, mesh.pp_communicator.world_size]}
    # the tensor group sums its stage only
    out["tp_sum"] = mesh.tp_communicator.all_reduce(torch.tensor([float(rank)])).tolist()
    # stage 0 hands its tensor rank's activations to stage 1, which answers
    pipe = mesh.pp_communicator
    if mesh.is_first_stage:
        pipe.send(torch.full((2, 3), float(rank)), mesh.next_stage)
        pipe.send_object({"from": rank}, mesh.next_stage)
        out["got"] = pipe.recv(torch.zeros(1), mesh.next_stage).tolist()
    else:
        hidden = pipe.recv(torch.zeros(2, 3), mesh.previous_stage)
        meta = pipe.recv_object(mesh.previous_stage)
        out["got"] = [hidden.sum().item(), meta["from"]]
        pipe.send(torch.tensor([100.0 + rank]), mesh.previous_stage)
    try:
        pipe.send(torch.ones(1), mesh.pp_rank)
        out["self_send"] = ""
    except ValueError as exc:
        out["self_send"] = str(exc)
    plat.destroy_distributed()
    print(json.dumps(out), flush=True)
    if rank == 0:
        sys.stdin.read()
    """
)


@pytest.mark.slow
def test_a_two_by_two_mesh_sums_within_stages_and_sends_between_them() -> None:
    ranks = _run_ranks(MESH_SCRIPT, 4)
    places = [[0, 0, True, False], [1, 0, True, False], [0, 1, False, True], [1, 1, False, True]]
    for rank, data in enumerate(ranks):
        assert data["place"] == places[rank]
        assert data["same"] is True and data["sizes"] == [2, 2]
        assert data["tp_sum"] == [[1.0], [1.0], [5.0], [5.0]][rank]
        assert "is not another rank of this group" in data["self_send"]
    # stage 1's rank r got stage 0's rank r - 2 (six elements of it) and its metadata
    assert ranks[2]["got"] == [0.0, 0] and ranks[3]["got"] == [6.0, 1]
    assert ranks[0]["got"] == [102.0] and ranks[1]["got"] == [103.0]
