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
inference modes, which Dynamo guards on.

The interpreter must never finalise while the worker thread lives, not even
while it only tears itself down: a Python thread that ends clears its
``threading.local`` data, torch's tensors among it (Dynamo and Inductor keep
some there), and torch releases the interpreter lock to free a tensor. If the
main thread has begun to finalise when the worker asks for the lock back,
CPython ends the worker with ``pthread_exit`` inside torch's C++ destructor,
whose forced unwinding calls ``std::terminate``: the process aborted with
"terminate called without an active exception" (status 134) after printing
its results. So :meth:`~BackgroundCompilation.wait` joins the thread (its
``done`` is the thread's end, not a flag the thread sets before it ends), and
a compilation whose result nobody will use is cancelled, not waited for
(:meth:`~BackgroundCompilation.cancel`, which the interpreter's exit calls on
every compilation still running): an exception raised in the worker thread at
its next Python instruction stops it, and the thread is joined.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from hwplug.compilation.serving import is_serving, prime_compiler
from hwplug.core.config import CUDAGraphMode

if TYPE_CHECKING:
    from hwplug.core.config import EngineConfig

__all__ = [
    "BUILT_IN_BACKENDS",
    "ENV",
    "BackgroundCompilation",
    "CompilationCancelled",
    "compiles_in_background",
]

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
exit handlers, its compile workers are gone) is logged at debug level, not as a warning."""


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


class CompilationCancelled(BaseException):
    """Raised inside a background compilation's worker thread by
    :meth:`BackgroundCompilation.cancel`; it never leaves that thread. A
    ``BaseException``, so that torch's ``except Exception`` handlers let it through."""


def _checkpoint() -> None:
    """A Python call: an exception pending for this thread is raised here at the latest."""


MAX_START_AFTER = 600.0
"""The longest ``start_after`` a :class:`BackgroundCompilation` takes, in seconds."""

SWITCH_INTERVAL = 0.0005
"""The interpreter's switch interval (seconds, :func:`sys.setswitchinterval`) while a
compilation builds: its thread holds the interpreter lock for long stretches of
Python (tracing, lowering), and at the default 5 ms every torch op of the engine's
eager step waited up to that long to get the lock back. Measured on the 250M model's
first bf16 token (2 cores): 3.3-3.6 s at 5 ms, 2.65-2.74 s at 0.5 ms."""

_yield_lock = threading.Lock()
_yielders = 0
_saved_interval: float | None = None


@contextlib.contextmanager
def _yielding() -> Iterator[None]:
    """Lower the interpreter's switch interval to :data:`SWITCH_INTERVAL` while the
    block runs (in any number of threads at once); the last to leave restores it."""
    global _yielders, _saved_interval
    with _yield_lock:
        if _yielders == 0:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL))
        _yielders += 1
    try:
        yield
    finally:
        with _yield_lock:
            _yielders -= 1
            if _yielders == 0 and _saved_interval is not None:
                sys.setswitchinterval(_saved_interval)
                _saved_interval = None


class BackgroundCompilation(Generic[_T]):
    """``build()`` run once in a daemon worker thread, started at construction, or held
    for up to ``start_after`` seconds until :meth:`start` (an engine starts it after its
    first step, so that the first token does not share the cores with the compiler).

    ``build`` compiles the model and runs its warm-up step, returning what the
    engine then calls (typically the compiled model). Until :attr:`done`, the
    engine keeps its eager model; then :attr:`result` is the built callable, or
    None when ``build`` raised or was cancelled: :attr:`error` holds the
    exception (a failure is logged as a warning, a cancellation is not) and the
    engine stays eager. :attr:`seconds` is how long it took. ``name`` names the
    thread and the log lines. While ``build`` runs, the interpreter's switch interval
    is :data:`SWITCH_INTERVAL` (restored when no compilation runs), so that the
    engine's thread gets the interpreter lock back between its torch ops.

    :raises ValueError: ``start_after`` is not a number of seconds in
        ``[0, MAX_START_AFTER]``.
    """

    def __init__(
        self, build: Callable[[], _T], *, name: str = "model", start_after: float = 0.0
    ) -> None:
        import torch

        if isinstance(start_after, bool) or not isinstance(start_after, int | float):
            raise ValueError(f"start_after must be a number of seconds, got {start_after!r}")
        if not 0 <= start_after <= MAX_START_AFTER:
            raise ValueError(
                f"start_after must be between 0 and {MAX_START_AFTER:g} seconds, "
                f"got {start_after!r}"
            )

        self.name = name
        self.result: _T | None = None
        """The built callable, once :attr:`done` without an error."""
        self.error: BaseException | None = None
        """What ``build`` raised (:class:`CompilationCancelled` after :meth:`cancel`),
        once :attr:`done`."""
        self.seconds: float | None = None
        """Seconds from the start to the end of ``build``."""
        self._building = True
        """``build`` may still be running: :meth:`cancel` raises in the thread only
        while this holds (both sides read and write it under the interpreter lock)."""
        self._cancelled = False
        self._lost = False
        """A cancellation raised in the worker was swallowed (it landed in a garbage
        collector or weakref callback, or a ``__del__``): :meth:`cancel` asks again at once."""
        self._go = threading.Event()
        """Set by :meth:`start` (or :meth:`cancel`): the worker stops waiting."""
        if start_after == 0:
            self._go.set()
        self._started = time.perf_counter()
        grad = torch.is_grad_enabled()
        inference = torch.is_inference_mode_enabled()
        context = contextvars.copy_context()

        def work() -> None:
            try:
                # a held start waits here: no interpreter lock, no core taken from the
                # engine's first step
                self._go.wait(start_after)
                if self._cancelled:
                    raise CompilationCancelled
                self._started = time.perf_counter()
                with _yielding(), torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    # before `build` may trace: the engine serves in another thread
                    prime_compiler()
                    result = build()
            except CompilationCancelled as exc:
                self.error = exc
            except BaseException as exc:  # reported through `error`, never lost
                self.error = exc
                quiet = self._cancelled or _exiting.is_set()
                (log.debug if quiet else log.warning)(
                    "compiling %s in the background failed; it keeps running eagerly: %s: %s",
                    name,
                    type(exc).__name__,
                    exc,
                )
            else:
                self.result = result
            finally:
                self._building = False
                self.seconds = time.perf_counter() - self._started

        def run() -> None:
            try:
                context.run(work)
                _checkpoint()  # a cancellation sent as `build` returned arrives here
            except CompilationCancelled as exc:  # arrived in the handlers above
                self._building = False
                if self.error is None:
                    self.result, self.error = None, exc

        self._thread = threading.Thread(target=run, name=f"hwplug-compile-{name}", daemon=True)
        _running.add(self)  # type: ignore[arg-type]
        self._thread.start()

    def start(self) -> None:
        """Start building now, if ``start_after`` still holds it (nothing otherwise)."""
        self._go.set()

    @property
    def done(self) -> bool:
        """The worker thread has ended (built, failed or cancelled)."""
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :attr:`done` (the worker thread has ended, not merely produced its
        result) or ``timeout`` seconds; returns :attr:`done`. Called from the worker
        thread itself it returns at once.

        :raises RuntimeError: the calling thread is inside
            :func:`~hwplug.compilation.serving`, which the compilation may wait for.
        """
        if threading.current_thread() is self._thread:
            return self.done
        if not self.done and is_serving():
            raise RuntimeError(
                f"waiting for the compilation of {self.name} inside hwplug.compilation.serving() "
                "could wait forever: the compilation waits for serving threads to step out "
                "before it traces; wait outside the serving block"
            )
        self._thread.join(timeout)
        return self.done

    def cancel(self, timeout: float | None = None) -> bool:
        """Stop the compilation (its result will not be used) and join its thread, for at
        most ``timeout`` seconds; returns :attr:`done`.

        :class:`CompilationCancelled` is raised in the worker thread at its next
        Python instruction: a call it is making into torch's C++ code, a wait for
        a compiler process, or an import (never interrupted) finishes first.
        Idempotent; a compilation that has finished is only joined.
        """
        if threading.current_thread() is self._thread:
            return self.done
        self._cancelled = True
        self._go.set()  # a held start stops waiting, and ends without building
        _swallow_lost_cancellations()
        deadline = None if timeout is None else time.monotonic() + timeout
        asked = -math.inf
        while not self.done:
            # asked again only after a while: a thread unwinding from the first request
            # runs finally blocks and weakref callbacks, where a second one would be an
            # "Exception ignored" instead of a stop
            # (or at once when the last request was swallowed by a callback)
            again = self._building and (self._lost or time.monotonic() - asked >= _CANCEL_AGAIN)
            if again:
                self._lost = False
                if _raise_in(self._thread, CompilationCancelled):
                    asked = time.monotonic()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._thread.join(_CANCEL_POLL if left is None else min(left, _CANCEL_POLL))
        return self.done

    def __repr__(self) -> str:
        if not self.done:
            state = "running"
        elif isinstance(self.error, CompilationCancelled):
            state = "cancelled"
        elif self.error is not None:
            state = "failed"
        else:
            state = f"built in {self.seconds:.1f} s"
        return f"BackgroundCompilation({self.name!r}, {state})"


_CANCEL_POLL = 0.02
"""Seconds between two looks at whether a cancelled thread has ended."""
_CANCEL_AGAIN = 1.0
"""Seconds before a cancellation is asked again (torch code that catches every exception
and carries on gets another)."""


def _swallow_lost_cancellations() -> None:
    """Make sure :data:`sys.unraisablehook` drops a :class:`CompilationCancelled` that a
    compilation's worker thread could not raise.

    The exception arrives at the worker's next Python instruction, which may belong to
    a callback that the interpreter runs on that thread and whose exceptions it cannot
    propagate: a garbage collector callback (hypothesis installs one), a weakref
    callback, a ``__del__``. The interpreter then reports it as "Exception ignored in
    ..." through :data:`sys.unraisablehook` (pytest turns that into a failed test) and
    the worker carries on. That report is hwplug's own request, not a fault of the
    callback: the hook installed here drops it, marks the compilation so that
    :meth:`BackgroundCompilation.cancel` asks again at once, and hands everything else
    to the hook it wraps. It wraps whatever hook is current, once (again only if
    someone has replaced it since)."""
    if getattr(sys.unraisablehook, "_hwplug_wraps", None) is not None:
        return
    wrapped = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_type, type) and issubclass(
            unraisable.exc_type, CompilationCancelled
        ):
            current = threading.current_thread()
            for compilation in list(_running):
                if compilation._thread is current:
                    compilation._lost = True
                    return
        wrapped(unraisable)

    hook._hwplug_wraps = wrapped  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _raise_in(thread: threading.Thread, exc_type: type[BaseException]) -> bool:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction, unless it is
    importing a module: an import it interrupted would leave a half-made module behind
    for the rest of the process (the caller asks again a moment later). Returns whether
    the request stands."""
    import ctypes

    ident = thread.ident
    if ident is None or _importing(ident):
        return False
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc(ctypes.c_ulong(ident), ctypes.py_object(exc_type))
    if _importing(ident):  # it began one in between: take the request back
        set_async_exc(ctypes.c_ulong(ident), None)
        return False
    return True


def _importing(ident: int) -> bool:
    """Whether the thread ``ident`` is running Python's import machinery."""
    import sys

    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


EXIT_WAIT_SECONDS = 60.0
"""How long the interpreter's exit waits for each cancelled compilation's thread to end
(it ends at its next Python instruction: seconds at most, behind a compiler process)."""


@atexit.register
def _cancel_running() -> None:
    """Cancel every running compilation and join its thread before the interpreter
    finalises (see the module's docstring)."""
    _exiting.set()
    for compilation in list(_running):
        if not compilation.cancel(EXIT_WAIT_SECONDS):
            log.warning(
                "compiling %s in the background did not stop within %.0f s of the exit",
                compilation.name,
                EXIT_WAIT_SECONDS,
            )
