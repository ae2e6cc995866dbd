"""The C++ door of ``hwplug::native_linear`` (:mod:`hwplug.kernels.op_door`).

A call whose layout the validated Python door has checked runs from the dispatcher
with no Python; its first call, any other layout, a misuse and a closed door go to
``hwplug::native_linear_checked``, whose profiler events show each hand-over. The
results are the Python door's, bit for bit; misuse gets the Python door's errors; a
door that cannot be built leaves the op on its Python door; a tampered door library is
rebuilt, never loaded. The direct op calls of ``test_native_misuse.py`` go through the
door too (their worker loads it at its first call), and ``make test-sanitize`` runs
this file on a door built with AddressSanitizer and UBSan.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.kernels import KernelArgumentError, native, native_linear_unavailable_reason, op_door

pytestmark = pytest.mark.skipif(
    native_linear_unavailable_reason() is not None,
    reason=f"the native kernels cannot run here: {native_linear_unavailable_reason()}",
)

OP = torch.ops.hwplug.native_linear
_fresh = itertools.count(1000)


def fresh_n() -> int:
    """Out features no other test uses: a layout the door has not approved yet."""
    return next(_fresh)


def handed(call: Callable[[], object]) -> int:
    """How many times ``call`` handed a call to the validated Python door."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        call()
    return sum(1 for e in prof.events() if e.name == "hwplug::native_linear_checked")


@pytest.fixture(scope="module")
def door() -> None:
    """The door loaded (the op's first call in this process loads it)."""
    OP(torch.randn(1, 8), torch.randn(8, 8), None)
    if not op_door.active():
        pytest.skip(f"the op door cannot run here: {op_door.unavailable_reason()}")


def test_the_first_call_of_a_layout_is_checked_in_python_and_later_ones_are_not(
    door: None,
) -> None:
    x, w = torch.randn(1, 64), torch.randn(fresh_n(), 64)
    before = op_door.approved_layouts()
    assert handed(lambda: OP(x, w, None)) == 1
    assert op_door.approved_layouts() == before + 1
    results = []
    assert handed(lambda: results.append(OP(x, w, None))) == 0
    # another tensor of the same layout runs from the door too, on its own data
    x2 = torch.randn(1, 64)
    assert handed(lambda: results.append(OP(x2, w, None))) == 0
    assert op_door.approved_layouts() == before + 1
    torch.testing.assert_close(results[0], x @ w.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1], x2 @ w.T, rtol=1e-5, atol=1e-5)
    assert op_door.unavailable_reason() is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 9),
    k=st.integers(1, 300),
    n=st.integers(1, 80),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    with_bias=st.booleans(),
    pad=st.integers(0, 5),
)
def test_the_door_computes_what_the_python_door_computes_bit_for_bit(
    door: None,
    monkeypatch: pytest.MonkeyPatch,
    rows: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    with_bias: bool,
    pad: int,
) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + k * 10 + n)
    x = torch.randn(rows, k + pad, generator=g).to(dtype)[:, :k]  # rows apart by pad
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g) if with_bias else None
    OP(x, w, bias)  # (approves the layout where the door runs it)
    through_door = OP(x, w, bias)
    monkeypatch.setenv(native.DOOR_ENV, "0")
    through_python = OP(x, w, bias)
    monkeypatch.delenv(native.DOOR_ENV)
    assert through_door.dtype == through_python.dtype == dtype
    assert torch.equal(through_door, through_python)
    expected = x.double() @ w.double().T + (0 if bias is None else bias.double())
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    scale = 1 + expected.abs().max().item()
    assert (through_door.double() - expected).abs().max().item() <= tolerance * scale * k**0.5


def test_misuse_after_an_approved_layout_gets_the_python_doors_errors(door: None) -> None:
    n = fresh_n()
    w = torch.randn(n, 16)
    OP(torch.randn(1, 16), w, None)
    OP(torch.randn(1, 16), w, None)
    # the defect issue 38 found: x far wider than the weight (was a segfault)
    with pytest.raises(KernelArgumentError, match="in_features"):
        OP(torch.randn(1, 2**20), w, None)
    with pytest.raises(KernelArgumentError, match="bias"):
        OP(torch.randn(1, 16), w, torch.randn(n + 3))
    with pytest.raises(KernelArgumentError, match="float64"):
        OP(torch.randn(1, 16, dtype=torch.float64), w, None)
    with pytest.raises(ValueError, match="weight"):
        OP(torch.randn(1, 16), torch.randn(n, 16, 1), None)
    # a weight of the same sizes read across its rows: computed from a copy, never approved
    across = torch.randn(16, n).T
    x = torch.randn(1, 16)
    for _ in range(2):
        assert handed(lambda: torch.testing.assert_close(OP(x, across, None), x @ across.T)) == 1


@pytest.mark.parametrize("variable", [native.DOOR_ENV, native.ENV])
def test_either_switch_sends_every_call_to_the_python_door(
    door: None, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    x, w = torch.randn(2, 32), torch.randn(fresh_n(), 32)
    OP(x, w, None)
    assert handed(lambda: OP(x, w, None)) == 0
    monkeypatch.setenv(variable, " 0 ")
    assert not op_door.active()
    assert op_door.unavailable_reason() == f"{variable}=0 is set"
    for _ in range(2):
        assert handed(lambda: torch.testing.assert_close(OP(x, w, None), x @ w.T)) == 1
    monkeypatch.setenv(variable, "1")
    assert op_door.active()
    assert handed(lambda: OP(x, w, None)) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_rows_of_the_vector_path_run_from_the_door_widened_and_rounded(
    door: None, dtype: torch.dtype
) -> None:
    """Several 16-bit rows (the vector path on a CPU without 16-bit dot products, or
    float16 anywhere): the door widens x to float32 and rounds the result to x's dtype,
    as the Python door does."""
    x, w = torch.randn(3, 48).to(dtype), torch.randn(fresh_n(), 48).to(dtype)
    first = OP(x, w, None)
    results: list[torch.Tensor] = []
    assert handed(lambda: results.append(OP(x, w, None))) == 0
    assert results[0].dtype == dtype
    assert torch.equal(results[0], first)


def test_layouts_the_door_does_not_run_as_python_does_are_not_approved(door: None) -> None:
    """A product oneDNN computes (more rows than the kernel takes), a bfloat16 bias the
    Python door converts, and an empty product stay with the Python door."""
    n = fresh_n()
    x, w = torch.randn(200, 32), torch.randn(n, 32)
    bf_x, bf_w = torch.randn(1, 32).bfloat16(), torch.randn(n, 32).bfloat16()
    bf_bias = torch.randn(n).bfloat16()
    empty = torch.randn(0, 32)
    for call in (
        lambda: OP(x, w, None),
        lambda: OP(bf_x, bf_w, bf_bias),
        lambda: OP(empty, w, None),
    ):
        before = op_door.approved_layouts()
        assert handed(call) == 1
        assert handed(call) == 1
        assert op_door.approved_layouts() == before
    torch.testing.assert_close(OP(x, w, None), x @ w.T, rtol=1e-4, atol=1e-4)
    assert OP(empty, w, None).shape == (0, n)


PROBE = r"""
import json, torch
import hwplug.kernels.linear
from hwplug.kernels import native, op_door
x, w = torch.randn(3, 24), torch.randn(40, 24)
first = torch.ops.hwplug.native_linear(x, w, None)
second = torch.ops.hwplug.native_linear(x, w, None)
door = native.door_library()
print("RESULT " + json.dumps({
    "close": bool(torch.allclose(first, x @ w.T, atol=1e-4) and torch.equal(first, second)),
    "active": op_door.active(),
    "reason": op_door.unavailable_reason(),
    "path": None if isinstance(door, str) else door._name,
}))
"""


def _probe(cache: Path, **env: str) -> tuple[dict[str, object], str]:
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache), **env}
    environment.pop(native.DOOR_ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :]), done.stderr


def test_a_cxx_compiler_that_fails_leaves_the_op_on_its_python_door(tmp_path: Path) -> None:
    result, stderr = _probe(tmp_path, CXX="false")
    assert result["close"] is True
    assert result["active"] is False
    assert "did not build" in str(result["reason"])
    assert "the native ops check every call in Python" in stderr


def test_a_tampered_door_library_is_rebuilt_not_loaded(tmp_path: Path, door: None) -> None:
    built = native.door_library()
    assert not isinstance(built, str)
    source = Path(built._name)
    cache = tmp_path / "hwplug" / "kernels"
    cache.mkdir(parents=True, mode=0o700)
    tmp_path.chmod(0o700)
    (tmp_path / "hwplug").chmod(0o700)
    # the whole cache (the C kernels too, so that only the door is rebuilt)
    for file in source.parent.iterdir():
        if file.suffix in (".so", ".json"):
            shutil.copy2(file, cache / file.name)
    tampered = cache / source.name
    with tampered.open("ab") as handle:
        handle.write(b"\0planted")
    result, stderr = _probe(tmp_path)
    assert result["active"] is True and result["close"] is True
    assert result["path"] == str(tampered)
    assert "rebuilding" in stderr and "does not have the digest" in stderr
    manifest = json.loads(tampered.with_suffix(".json").read_text())
    import hashlib

    assert hashlib.sha256(tampered.read_bytes()).hexdigest() == manifest["sha256"]
