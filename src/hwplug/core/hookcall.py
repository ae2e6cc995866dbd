"""Calling a hook's implementations one at a time, in pluggy's order and with its rules.

:func:`call_hook` does what calling ``pm.hook.<name>(**kwargs)`` does, but
runs every part of every implementation through a function of the caller's
(``run``), which knows the implementation and so its plugin: resolution
attributes config changes to the plugin and checks what it changed, and
platform selection keeps each plugin's result (or failure) apart. pluggy's
objects are only read (``get_hookimpls()``, ``spec.opts``, ``argnames``),
never changed.

pluggy's rules, as ``pluggy._execution._multicall`` applies them:

- the implementations run in reverse of ``get_hookimpls()``: wrappers first,
  then ``tryfirst``, the others (last registered first), ``trylast``;
- each gets only the arguments it declares;
- a wrapper (``wrapper=True``, or the old-style ``hookwrapper=True``) runs up
  to its ``yield`` before the plain implementations and after them, in
  reverse order, seeing their result or exception; what it returns (or
  raises, or forces on the old-style ``Result``) replaces that outcome;
- a ``firstresult`` hook stops at the first result that is not None and
  returns it; other hooks return the list of results that are not None.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Generator, Mapping
from typing import Any, NoReturn

from pluggy import HookCaller, HookCallError, HookImpl, PluggyTeardownRaisedWarning, Result

__all__ = ["Run", "call_hook", "run_directly"]

Run = Callable[[HookImpl, Callable[[], Any]], Any]
"""``run(impl, call)`` runs one part of implementation ``impl``: all of a plain
implementation, or a wrapper's part before or after its ``yield``. It returns
what ``call()`` returns; for a plain implementation it may return a stand-in
instead (that goes into the hook's result)."""

_Wrapper = Generator[None, Any, Any]


def run_directly(impl: HookImpl, call: Callable[[], Any]) -> Any:
    """The :data:`Run` that adds nothing."""
    return call()


def call_hook(hook: HookCaller, kwargs: Mapping[str, object], run: Run = run_directly) -> Any:
    """Call ``hook``'s implementations with ``kwargs`` as pluggy would, each part
    through ``run``.

    :returns: the first result that is not None of a ``firstresult`` hook, else
        the list of results that are not None.
    :raises HookCallError: an implementation declares an argument ``kwargs`` lacks.
    """
    spec = hook.spec
    first_only = bool(spec is not None and spec.opts.get("firstresult"))
    results: list[Any] = []
    wrappers: list[tuple[HookImpl, _Wrapper]] = []
    error: BaseException | None = None
    try:
        for impl in reversed(hook.get_hookimpls()):
            call = functools.partial(
                impl.function, *_positional(impl, kwargs), **_keyword(impl, kwargs)
            )
            if impl.wrapper or impl.hookwrapper:
                wrappers.append((impl, run(impl, functools.partial(_enter, call))))
                continue
            result = run(impl, call)
            if result is not None:
                results.append(result)
                if first_only:
                    break
    except BaseException as exc:
        error = exc
    outcome: Any = (results[0] if results else None) if first_only else results
    for impl, wrapper in reversed(wrappers):
        leave = _leave_old_style if impl.hookwrapper else _leave
        try:
            outcome = run(impl, functools.partial(leave, hook.name, impl, wrapper, outcome, error))
        except BaseException as exc:
            error = exc
        else:
            error = None
    if error is not None:
        raise error
    return outcome


def _positional(impl: HookImpl, kwargs: Mapping[str, object]) -> list[object]:
    try:
        return [kwargs[name] for name in impl.argnames]
    except KeyError as exc:
        raise HookCallError(f"hook call must provide argument {exc.args[0]!r}") from exc


def _keyword(impl: HookImpl, kwargs: Mapping[str, object]) -> dict[str, object]:
    # Parameters with defaults get a value only when the call gives one (pluggy >= 1.6).
    return {name: kwargs[name] for name in impl.kwargnames if name in kwargs}


def _enter(call: Callable[[], Any]) -> _Wrapper:
    """Start a wrapper: run it up to its ``yield``."""
    wrapper = call()
    try:
        next(wrapper)
    except StopIteration:
        _misbehaved(wrapper, "did not yield")
    return wrapper


def _leave(
    hook: str, impl: HookImpl, wrapper: _Wrapper, outcome: Any, error: BaseException | None
) -> Any:
    """Finish a new-style wrapper: send it the outcome (or throw the error); what it
    returns is the new outcome."""
    try:
        if error is None:
            wrapper.send(outcome)
        else:
            wrapper.throw(error)
    except StopIteration as stop:
        return stop.value
    except RuntimeError as exc:
        # A StopIteration thrown into a generator comes back as a RuntimeError.
        if isinstance(error, StopIteration) and exc.__cause__ is error:
            wrapper.close()
            raise error from None
        raise
    wrapper.close()
    _misbehaved(wrapper, "has second yield")


def _leave_old_style(
    hook: str, impl: HookImpl, wrapper: _Wrapper, outcome: Any, error: BaseException | None
) -> Any:
    """Finish an old-style ``hookwrapper``: send it a :class:`pluggy.Result`, which it
    may change; that result's value (or exception) is the new outcome."""

    def previous() -> Any:
        if error is not None:
            raise error
        return outcome

    result = Result.from_call(previous)
    try:
        wrapper.send(result)
    except StopIteration:
        pass
    except BaseException as exc:
        warnings.warn(
            PluggyTeardownRaisedWarning(
                "A plugin raised an exception during an old-style hookwrapper teardown.\n"
                f"Plugin: {impl.plugin_name}, Hook: {hook}\n{type(exc).__name__}: {exc}"
            ),
            stacklevel=4,
        )
        raise
    else:
        _misbehaved(wrapper, "has second yield")
    finally:
        wrapper.close()
    return result.get_result()


def _misbehaved(wrapper: _Wrapper, what: str) -> NoReturn:
    code = wrapper.gi_code  # type: ignore[attr-defined]  # typeshed's Generator lacks it
    raise RuntimeError(
        f"wrap_controller at {code.co_name!r} {code.co_filename}:{code.co_firstlineno} {what}"
    )
