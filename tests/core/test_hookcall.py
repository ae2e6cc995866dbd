"""``call_hook`` runs a hook's implementations exactly as pluggy's own call does.

Each test builds a real pluggy ``PluginManager`` and, where it can, checks the
outcome (results, call order, exception) against ``pm.hook.<name>(...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pluggy
import pytest

from hwplug.core.hookcall import call_hook

spec = pluggy.HookspecMarker("demo")
impl = pluggy.HookimplMarker("demo")


class Specs:
    @spec
    def collect(self, log: list[str], x: int) -> list[int]:  # type: ignore[empty-body]
        """Every implementation's result."""

    @spec(firstresult=True)
    def first(self, log: list[str], x: int) -> int:  # type: ignore[empty-body]
        """The first result that is not None."""


def plain(name: str, value: Any = None, **opts: Any) -> object:
    """A plugin whose ``collect`` and ``first`` log ``name`` and return ``value``."""

    class Plugin:
        @impl(**opts)
        def collect(self, log: list[str], x: int) -> Any:
            log.append(name)
            return value

        @impl(**opts)
        def first(self, log: list[str]) -> Any:
            log.append(name)
            return value

    return Plugin()


def manager(*plugins: tuple[str, object]) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("demo")
    pm.add_hookspecs(Specs)
    for name, plugin in plugins:
        pm.register(plugin, name=name)
    return pm


def both_ways(pm: pluggy.PluginManager, hook: str, **kwargs: Any) -> tuple[Any, Any]:
    """``(outcome, log)`` of pluggy's call and of ``call_hook``; an outcome is a result
    or the exception raised."""

    def outcome(call: Callable[[list[str]], Any]) -> tuple[Any, list[str]]:
        log: list[str] = []
        try:
            return call(log), log
        except Exception as exc:
            return exc, log

    caller = getattr(pm.hook, hook)
    theirs = outcome(lambda log: caller(log=log, **kwargs))
    ours = outcome(lambda log: call_hook(caller, {"log": log, **kwargs}))
    return theirs, ours


def same(theirs: tuple[Any, list[str]], ours: tuple[Any, list[str]]) -> None:
    if isinstance(theirs[0], Exception):
        assert type(ours[0]) is type(theirs[0]) and str(ours[0]) == str(theirs[0])
    else:
        assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]


def test_order_is_pluggys_last_registered_first_with_tryfirst_and_trylast() -> None:
    pm = manager(
        ("late", plain("late", 1, trylast=True)),
        ("a", plain("a", 2)),
        ("early", plain("early", 3, tryfirst=True)),
        ("b", plain("b", 4)),
    )
    theirs, ours = both_ways(pm, "collect", x=0)
    same(theirs, ours)
    assert ours == ([3, 4, 2, 1], ["early", "b", "a", "late"])


def test_firstresult_stops_at_the_first_result_that_is_not_none() -> None:
    pm = manager(("two", plain("two", 2)), ("one", plain("one", 1)), ("none", plain("none")))
    theirs, ours = both_ways(pm, "first", x=0)
    same(theirs, ours)
    assert ours == (1, ["none", "one"])


def test_an_implementation_gets_only_the_arguments_it_declares() -> None:
    seen: list[tuple[str, ...]] = []

    class Narrow:
        @impl
        def collect(self, x: int) -> int:
            seen.append(("x",))
            return x * 10

    pm = manager(("narrow", Narrow()))
    assert call_hook(pm.hook.collect, {"log": [], "x": 4}) == [40]
    assert seen == [("x",)]


def test_a_missing_argument_is_pluggys_hook_call_error() -> None:
    pm = manager(("a", plain("a", 1)))
    with pytest.raises(pluggy.HookCallError, match="'x'"):
        call_hook(pm.hook.collect, {"log": []})


def wrappers() -> list[tuple[str, object]]:
    class NewStyle:
        @impl(wrapper=True)
        def collect(self, log: list[str]) -> Generator[None, list[int], list[int]]:
            log.append("new:before")
            result = yield
            log.append("new:after")
            return [*result, 100]

    class OldStyle:
        @impl(hookwrapper=True)
        def collect(self, log: list[str]) -> Generator[None, pluggy.Result[list[int]], None]:
            log.append("old:before")
            outcome = yield
            log.append("old:after")
            outcome.force_result([-x for x in outcome.get_result()])

    return [("new", NewStyle()), ("old", OldStyle())]


def test_new_and_old_style_wrappers_wrap_the_others_and_change_the_result() -> None:
    pm = manager(("a", plain("a", 1)), *wrappers(), ("b", plain("b", 2)))
    theirs, ours = both_ways(pm, "collect", x=0)
    same(theirs, ours)
    assert ours == (
        [-2, -1, -100],
        ["old:before", "new:before", "b", "a", "new:after", "old:after"],
    )


def test_a_wrapper_that_raises_replaces_the_result_with_its_exception() -> None:
    class Raises:
        @impl(wrapper=True)
        def collect(self, log: list[str]) -> Generator[None, list[int], list[int]]:
            yield
            raise ValueError("wrapper refuses")

    pm = manager(("a", plain("a", 1)), ("raises", Raises()), wrappers()[0])
    theirs, ours = both_ways(pm, "collect", x=0)
    same(theirs, ours)
    assert isinstance(ours[0], ValueError)


def test_an_implementations_exception_reaches_the_wrappers_and_the_caller() -> None:
    class Fails:
        @impl
        def collect(self, log: list[str]) -> int:
            raise KeyError("inner")

    class Catches:
        @impl(wrapper=True)
        def collect(self, log: list[str]) -> Generator[None, list[int], list[int]]:
            try:
                return (yield)
            except KeyError:
                log.append("caught")
                return [7]

    pm = manager(("a", plain("a", 1)), ("fails", Fails()))
    same(*both_ways(pm, "collect", x=0))
    pm.register(Catches(), name="catches")
    theirs, ours = both_ways(pm, "collect", x=0)
    same(theirs, ours)
    assert ours == ([7], ["caught"])


def test_a_wrapper_that_does_not_yield_is_pluggys_runtime_error() -> None:
    class NoYield:
        @impl(wrapper=True)
        def collect(self, log: list[str]) -> Generator[None, list[int], list[int]]:
            return []
            yield  # pragma: no cover - makes this a generator

    pm = manager(("noyield", NoYield()))
    theirs, ours = both_ways(pm, "collect", x=0)
    same(theirs, ours)
    assert "did not yield" in str(ours[0])


def test_run_sees_every_part_with_its_plugin_and_may_stand_in_for_a_result() -> None:
    pm = manager(("a", plain("a", 1)), *wrappers())
    parts: list[str] = []

    def run(hookimpl: pluggy.HookImpl, call: Callable[[], Any]) -> Any:
        parts.append(hookimpl.plugin_name)
        return call()

    log: list[str] = []
    assert call_hook(pm.hook.collect, {"log": log, "x": 0}, run) == [-1, -100]
    assert parts == ["old", "new", "a", "new", "old"]
    assert log == ["old:before", "new:before", "a", "new:after", "old:after"]

    def tag(hookimpl: pluggy.HookImpl, call: Callable[[], Any]) -> Any:
        result = call()
        return result if hookimpl.wrapper else (hookimpl.plugin_name, result)

    pm.unregister(name="old")
    assert call_hook(pm.hook.collect, {"log": [], "x": 0}, tag) == [("a", 1), 100]


def test_nothing_of_pluggys_is_changed() -> None:
    pm = manager(("a", plain("a", 1)), *wrappers())
    before = [(i.plugin_name, i.function) for i in pm.hook.collect.get_hookimpls()]
    call_hook(pm.hook.collect, {"log": [], "x": 0}, lambda hookimpl, call: call())
    assert [(i.plugin_name, i.function) for i in pm.hook.collect.get_hookimpls()] == before
