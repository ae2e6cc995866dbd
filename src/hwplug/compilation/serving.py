"""Calling a model eagerly in one thread while torch compiles in another.

A plain ``torch.fx`` symbolic trace replaces ``torch.nn.Module.__call__`` and
``__getattr__`` *for the whole process* while it runs. A module that another
thread calls in that window goes through the tracer, which looks for the
module under its own root and raises ``NameError: module is not installed as
a submodule``: the other thread's eager step fails for no fault of its own.
Inductor makes one such trace per process (a placeholder graph for the
interpreter of its loop bodies, traced on first use and cached); an engine
that serves eagerly while its model compiles in a worker thread
(:class:`~hwplug.compilation.BackgroundCompilation`) or another engine of the
same process compiles, failed that way about once in a few thousand runs.
The traces of AOTAutograd and of Inductor's patterns (``make_fx``) hand other
threads' module calls through unchanged, and are harmless.

The fix is a gate with two sides:

- :func:`serving` is held by a thread while it calls a model's modules
  eagerly (tiny_engine holds it around each step and its logits). Any number
  of threads may hold it at once, and a thread may hold it again inside.
- :func:`prime_compiler` makes Inductor's one process-wide trace now, while
  no thread is serving: it waits for every other serving thread to leave,
  keeps new ones out for the few milliseconds the trace takes, and is free
  once the trace is cached. :func:`~hwplug.compilation.compile_model`, the host
  step graphs and every background compilation call it before they compile.

Once the trace is cached, :func:`serving` costs a flag test and a thread-local count.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["prime_compiler", "serving"]

_POLL = 0.05
"""Seconds between two looks of a waiting priming: a cancellation raised in its thread
(:meth:`BackgroundCompilation.cancel`) lands within this."""


class _Gate:
    """A shared/exclusive gate: many threads serve at once; one primes, alone."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.serving_threads = 0
        """Threads inside :func:`serving` (each counted once however deep)."""
        self.priming = False
        """A thread primes, or waits to: new serving threads wait for it."""
        self.local = threading.local()
        self.primed = False
        """Inductor's trace is cached in this process: the gate has nothing left to do."""

    def depth(self) -> int:
        return int(getattr(self.local, "depth", 0))


_gate = _Gate()


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """Hold while this thread calls a model's modules eagerly.

    No compiler trace that would intercept those calls runs in another thread
    of the process while a thread holds it (see the module's docstring). Any
    number of threads may hold it at once; a thread may hold it again inside
    (a nested hold does not wait). A thread that waits to enter waits at most
    for one priming, a few milliseconds.
    """
    gate = _gate
    depth = gate.depth()
    # primed: nothing is left to wait for, and nobody waits for this thread
    counted = depth == 0 and not gate.primed
    if counted:
        with gate.cond:
            while gate.priming:
                gate.cond.wait()
            gate.serving_threads += 1
    gate.local.depth = depth + 1
    try:
        yield
    finally:
        gate.local.depth = depth
        if counted:
            with gate.cond:
                gate.serving_threads -= 1
                if gate.serving_threads == 0:
                    gate.cond.notify_all()


def is_serving() -> bool:
    """Whether this thread is inside :func:`serving` (a wait for a compilation there
    could wait for this very thread: :meth:`BackgroundCompilation.wait` refuses it)."""
    return _gate.depth() > 0


def prime_compiler() -> None:
    """Make Inductor's process-wide placeholder trace now, with no other thread serving.

    Imports Inductor's loop-body module (about 1.5 s the first time, which a compile
    with Inductor pays anyway), then waits for every other thread to leave
    :func:`serving`, keeping new ones out, for the trace itself (milliseconds). A
    thread that serves may prime: it waits only for the others. Free after the first
    call; a torch without that trace has nothing to prime.
    """
    gate = _gate
    if gate.primed:
        return
    try:
        from torch._inductor.loop_body import InterpreterShim
    except ImportError:  # a torch without it makes no such trace there
        gate.primed = True
        return
    trace = getattr(InterpreterShim, "_dummy_gm", None)
    if trace is None:
        gate.primed = True
        return
    own = 1 if gate.depth() > 0 else 0
    with gate.cond:
        while gate.priming:  # another thread primes: its trace serves this one too
            gate.cond.wait(_POLL)
        if gate.primed:
            return
        gate.priming = True
        try:
            while gate.serving_threads > own:
                gate.cond.wait(_POLL)
            trace()
            gate.primed = True
        finally:
            gate.priming = False
            gate.cond.notify_all()
