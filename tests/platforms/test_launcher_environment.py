"""launcher_environment: the variables torchrun sets, read and checked before a rank starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hwplug.core.runtime import LAUNCHER_VARIABLES, LauncherEnvironment, launcher_environment

_RANK_0_OF_2 = {
    "RANK": "0",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}
"""What torchrun sets for rank 0 of 2."""


@given(
    world=st.integers(1, 4096),
    data=st.data(),
    local_rank=st.integers(0, 512),
    port=st.integers(1, 65535),
    padded=st.booleans(),
)
def test_what_a_launcher_sets_is_read_as_it_was_set(
    world: int, data: st.DataObject, local_rank: int, port: int, padded: bool
) -> None:
    rank = data.draw(st.integers(0, world - 1))
    pad = " " if padded else ""
    environ = {
        "RANK": f"{pad}{rank}",
        "WORLD_SIZE": f"{world}{pad}",
        "LOCAL_RANK": str(local_rank),
        "MASTER_ADDR": f"{pad}node-0{pad}",
        "MASTER_PORT": str(port),
        "UNRELATED": "x",
    }
    assert launcher_environment(environ) == LauncherEnvironment(
        rank=rank, world_size=world, local_rank=local_rank, master_addr="node-0", master_port=port
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "MASTER_PORT",
            "notaport",
            "MASTER_PORT='notaport' is not an integer; MASTER_PORT must "
            "be a TCP port, an integer 1 .. 65535 (set by the launcher)",
        ),
        ("MASTER_PORT", "29500.0", "MASTER_PORT='29500.0' is not an integer"),
        ("MASTER_PORT", "0", "MASTER_PORT='0' is out of range"),
        ("MASTER_PORT", "65536", "MASTER_PORT='65536' is out of range"),
        ("RANK", "first", "RANK='first' is not an integer"),
        (
            "RANK",
            "-1",
            "RANK='-1' is out of range; RANK must be an integer 0 .. 1, below "
            "WORLD_SIZE=2 (set by the launcher)",
        ),
        ("RANK", "2", "RANK='2' is out of range"),
        ("LOCAL_RANK", "gpu0", "LOCAL_RANK='gpu0' is not an integer"),
        (
            "LOCAL_RANK",
            "-1",
            "LOCAL_RANK='-1' is out of range; LOCAL_RANK must be a non-negative integer",
        ),
        ("WORLD_SIZE", "two", "WORLD_SIZE='two' is not an integer"),
        (
            "WORLD_SIZE",
            "0",
            "WORLD_SIZE='0' is out of range; WORLD_SIZE must be a positive integer",
        ),
    ],
)
def test_a_bad_variable_is_named_with_its_value_and_what_is_allowed(
    name: str, value: str, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        launcher_environment({**_RANK_0_OF_2, name: value})
    assert str(info.value).startswith(message)


def test_the_caller_says_what_the_launcher_sets_them_for() -> None:
    where = "for parallel.distributed_executor_backend='external_launcher'"
    with pytest.raises(ValueError) as info:
        launcher_environment({**_RANK_0_OF_2, "RANK": "9"}, where=where)
    assert str(info.value).endswith(f"(set by the launcher {where})")
    with pytest.raises(ValueError) as info:
        launcher_environment({}, where=where)
    assert f"({where}; run: torchrun" in str(info.value)


@pytest.mark.parametrize(
    "unset", [("LOCAL_RANK",), ("MASTER_ADDR", "MASTER_PORT"), LAUNCHER_VARIABLES]
)
def test_unset_variables_are_all_named_with_how_to_start_the_processes(
    unset: tuple[str, ...],
) -> None:
    environ = {k: v for k, v in _RANK_0_OF_2.items() if k not in unset}
    environ.update({name: "  " for name in unset[:1]})  # blank is unset too
    with pytest.raises(ValueError) as info:
        launcher_environment(environ)
    verb = "is" if len(unset) == 1 else "are"
    assert str(info.value).startswith(f"{', '.join(unset)} {verb} not set; a launcher such as ")
    assert "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT" in str(info.value)
    assert "torchrun --nproc-per-node N" in str(info.value)


def test_without_an_environ_it_reads_the_processes_own() -> None:
    code = (
        "from hwplug.core.runtime import launcher_environment as f; import sys; "
        "e = f(); print(e.rank, e.world_size, e.local_rank, e.master_addr, e.master_port); "
        "print('torch' in sys.modules)"
    )
    env = {**_RANK_0_OF_2, "RANK": "1", "LOCAL_RANK": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[:2] == ["1 2 1 127.0.0.1 29500", "False"]
