"""CUDAGraphMode and CompilationLevel."""

from __future__ import annotations

import enum

import pytest

from hwplug.core.config import CompilationLevel, CUDAGraphMode
from hwplug.core.errors import ConfigError

M = CUDAGraphMode


def test_members_have_the_seed_values() -> None:
    assert {m.name: m.value for m in M} == {
        "NONE": 0,
        "PIECEWISE": 1,
        "FULL": 2,
        "FULL_DECODE_ONLY": (2, 0),
        "FULL_AND_PIECEWISE": (2, 1),
    }


@pytest.mark.parametrize(
    ("mode", "decode", "mixed", "top", "full", "piecewise", "separate", "runtime"),
    [
        (M.NONE, M.NONE, M.NONE, M.NONE, False, False, False, True),
        (M.PIECEWISE, M.PIECEWISE, M.PIECEWISE, M.PIECEWISE, False, True, False, True),
        (M.FULL, M.FULL, M.FULL, M.FULL, True, False, False, True),
        (M.FULL_DECODE_ONLY, M.FULL, M.NONE, M.FULL, True, False, True, False),
        (M.FULL_AND_PIECEWISE, M.FULL, M.PIECEWISE, M.FULL, True, True, True, False),
    ],
)
def test_mode_queries(
    mode: CUDAGraphMode,
    decode: CUDAGraphMode,
    mixed: CUDAGraphMode,
    top: CUDAGraphMode,
    full: bool,
    piecewise: bool,
    separate: bool,
    runtime: bool,
) -> None:
    assert mode.decode_mode() is decode
    assert mode.mixed_mode() is mixed
    assert mode.max_cudagraph_mode() is top
    assert mode.has_full_cudagraphs() is full
    assert mode.has_piecewise_cudagraphs() is piecewise
    assert mode.requires_piecewise_compilation() is piecewise
    assert mode.separate_routine() is separate
    assert mode.valid_runtime_modes() is runtime


def test_str_is_the_name() -> None:
    assert [str(m) for m in M] == [m.name for m in M]
    assert f"{M.FULL_AND_PIECEWISE}" == "FULL_AND_PIECEWISE"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("full", M.FULL),
        ("Full_And_Piecewise", M.FULL_AND_PIECEWISE),
        (" none ", M.NONE),
        (1, M.PIECEWISE),
        ((2, 0), M.FULL_DECODE_ONLY),
        ([2, 1], M.FULL_AND_PIECEWISE),
        (M.FULL, M.FULL),
    ],
)
def test_parse_accepts_names_in_any_case_and_values(value: object, expected: CUDAGraphMode) -> None:
    assert M.parse(value) is expected


@pytest.mark.parametrize("value", ["fullish", "", 7, (1, 1), True, 2.0, None])
def test_parse_rejects_unknown_modes_listing_them(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        M.parse(value)
    message = str(info.value)
    assert "compilation.cudagraph_mode" in message
    for name in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert name in message


def test_compilation_levels() -> None:
    assert issubclass(CompilationLevel, enum.IntEnum)
    assert {m.name: m.value for m in CompilationLevel} == {
        "NO_COMPILATION": 0,
        "DYNAMO_AS_IS": 1,
        "DYNAMO_ONCE": 2,
        "PIECEWISE": 3,
    }
    assert CompilationLevel.PIECEWISE == 3
