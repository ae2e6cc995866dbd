"""Risky kernel cases run in a worker process: a crash fails one case, not the suite.

A case is a module-level function of plain, picklable arguments that builds
its tensors in the worker and asserts there; its result or its exception
(an ``AssertionError``, the kernel's ``ValueError``) comes back as if it had
run here. A worker that dies (SIGSEGV, SIGBUS, an abort from a sanitizer)
fails the case with its exit status and is replaced for the next one. One
spawned worker serves a whole session (starting one costs an import of
torch), so hypothesis can try hundreds of cases.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

_TIMEOUT_S = 300.0


class Isolated:
    """Runs functions in a spawned worker process (one at a time)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def __call__(self, function: Callable[..., T], *args: Any) -> T:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = self._pool.submit(function, *args)
        try:
            return future.result(timeout=_TIMEOUT_S)
        except BrokenProcessPool:
            self.close()
            pytest.fail(
                f"the worker process died running {function.__name__}{args!r}: the kernel "
                "crashed (a read or write out of bounds, or a sanitizer's report)",
                pytrace=False,
            )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
