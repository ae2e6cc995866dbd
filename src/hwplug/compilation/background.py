"""Compiling a model in a worker thread while the engine serves eagerly.

On a CPU, ``torch.compile`` of a small model costs several seconds before the
first token even when Inductor's cache holds every kernel: importing Dynamo
and Inductor, tracing the model's Python code, loading the cached kernels
and checking the compiler's vector ISA. An eager forward needs none of it.
:class:`BackgroundCompilation` runs the compilation and its warm-up step in a
worker thread: the engine serves its first tokens eagerly and switches to the
compiled model once it is ready (:attr:`~BackgroundCompilation.result`).

Where that is safe is :func:`compiles_in_background`: there is no device
graph to capture (capture needs the device to itself), one rank (a warm-up
step of a tensor-parallel model would run collectives beside the engine's),
the backend is one torch always has (a custom backend is built before the
engine serves, so that a wrong name is an error there and then), and
``HWPLUG_BACKGROUND_COMPILE`` is not ``0``.

The worker thread runs in a copy of the caller's :mod:`contextvars` context
(hwplug's current platform and session carry over) with the caller's grad and
inference modes, which Dynamo guards on. A compilation still running when the
interpreter exits is waited for, so that the interpreter never finalises
under a thread inside torch's C++ code.
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from hwplug.core.config import CUDAGraphMode

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig

__all__ = ["BUILT_IN_BACKENDS", "ENV", "BackgroundCompilation", "compiles_in_background"]

log = logging.getLogger(__name__)

ENV = "HWPLUG_BACKGROUND_COMPILE"
"""``0``: engines compile before they serve (read when an engine asks
:func:`compiles_in_background`)."""

_T = TypeVar("_T")

BUILT_IN_BACKENDS = frozenset({"", "inductor", "eager", "aot_eager"})
"""``compilation.backend`` values that compile in the background: torch always has them
("" is the platform's default); any other backend is built before the engine serves."""

_running: weakref.WeakSet[BackgroundCompilation[object]] = weakref.WeakSet()
_exiting = threading.Event()
"""Set when the interpreter exits: a compilation that fails then (torch refuses new
exit handlers) is logged at debug level, not as a warning."""


def compiles_in_background(config: EngineConfig, *, world_size: int = 1) -> bool:
    """Whether an engine may compile ``config``'s model in a worker thread and serve
    eagerly meanwhile.

    True when the resolved config compiles (level 1 to 3) with one of
    :data:`BUILT_IN_BACKENDS` and captures no device graphs (``cudagraph_mode``
    NONE), the engine has one rank, and ``HWPLUG_BACKGROUND_COMPILE`` is not
    ``0``. ``config`` is a resolved config.

    :raises ValueError: ``HWPLUG_BACKGROUND_COMPILE`` is set to something other than
        ``0`` or ``1``.
    """
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1; got {value!r}")
    if value == "0" or world_size != 1:
        return False
    comp = config.compilation
    mode = comp.cudagraph_mode
    return (
        int(comp.level or 0) > 0
        and (mode is None or mode == CUDAGraphMode.NONE)
        and str(comp.backend or "") in BUILT_IN_BACKENDS
    )


class BackgroundCompilation(Generic[_T]):
    """``build()`` run once in a daemon worker thread, started at construction.

    ``build`` compiles the model and runs its warm-up step, returning what the
    engine then calls (typically the compiled model). Until :attr:`done`, the
    engine keeps its eager model; then :attr:`result` is the built callable, or
    None when ``build`` raised: :attr:`error` holds the exception (logged as a
    warning) and the engine stays eager. :attr:`seconds` is how long it took.
    ``name`` names the thread and the log lines.
    """

    def __init__(self, build: Callable[[], _T], *, name: str = "model") -> None:
        import torch

        self.name = name
        self.result: _T | None = None
        """The built callable, once :attr:`done` without an error."""
        self.error: BaseException | None = None
        """What ``build`` raised, once :attr:`done`."""
        self.seconds: float | None = None
        """Seconds from the start to :attr:`done`."""
        self._done = threading.Event()
        self._started = time.perf_counter()
        grad = torch.is_grad_enabled()
        inference = torch.is_inference_mode_enabled()
        context = contextvars.copy_context()

        def work() -> None:
            try:
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    result = build()
            except BaseException as exc:  # reported through `error`, never lost
                self.error = exc
                (log.debug if _exiting.is_set() else log.warning)(
                    "compiling %s in the background failed; it keeps running eagerly: %s: %s",
                    name,
                    type(exc).__name__,
                    exc,
                )
            else:
                self.result = result
            finally:
                self.seconds = time.perf_counter() - self._started
                self._done.set()

        self._thread = threading.Thread(
            target=context.run, args=(work,), name=f"hwplug-compile-{name}", daemon=True
        )
        _running.add(self)  # type: ignore[arg-type]
        self._thread.start()

    @property
    def done(self) -> bool:
        """The worker has finished (built, or failed)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :attr:`done` or ``timeout`` seconds; returns :attr:`done`.
        Called from the worker thread itself it returns at once."""
        if threading.current_thread() is self._thread:
            return self.done
        return self._done.wait(timeout)

    def __repr__(self) -> str:
        state = (
            "running"
            if not self.done
            else ("failed" if self.error is not None else f"built in {self.seconds:.1f} s")
        )
        return f"BackgroundCompilation({self.name!r}, {state})"


EXIT_WAIT_SECONDS = 600.0
"""How long the interpreter's exit waits for each compilation still running."""


@atexit.register
def _wait_for_running() -> None:
    """Let every running compilation finish before the interpreter finalises (each for
    at most :data:`EXIT_WAIT_SECONDS`)."""
    _exiting.set()
    for compilation in list(_running):
        compilation.wait(EXIT_WAIT_SECONDS)
