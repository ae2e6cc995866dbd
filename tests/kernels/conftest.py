"""Fixtures for the kernel tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from tests.kernels.isolated import Isolated

HAS_TRITON = importlib.util.find_spec("triton") is not None and (
    importlib.util.find_spec("numpy") is not None
)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run Triton kernels on CPU: sets TRITON_INTERPRET=1 for this test only.

    The variable is set after ``hwplug.kernels`` was imported (at collection),
    so every test using this fixture also checks that the kernels honour the
    variable at call time.
    """
    if not HAS_TRITON:
        pytest.skip("triton (with numpy) is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def no_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure TRITON_INTERPRET is unset for this test."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def isolated() -> Iterator[Isolated]:
    """Runs a case in a worker process, so that a kernel's crash fails that case only
    (see :mod:`tests.kernels.isolated`)."""
    runner = Isolated()
    yield runner
    runner.close()
