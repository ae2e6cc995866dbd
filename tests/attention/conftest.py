"""Fixtures for the attention tests."""

from __future__ import annotations

import importlib.util

import pytest

HAS_TRITON = importlib.util.find_spec("triton") is not None and (
    importlib.util.find_spec("numpy") is not None
)


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run Triton kernels on CPU: TRITON_INTERPRET=1 for this test only (set after import)."""
    if not HAS_TRITON:
        pytest.skip("triton (with numpy) is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def no_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure TRITON_INTERPRET is unset for this test."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
