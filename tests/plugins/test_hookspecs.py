"""The hook specifications and markers."""

from __future__ import annotations

import inspect
import warnings

import pluggy
import pytest

import hwplug
from hwplug.core import hookspecs


def test_markers_and_project_name() -> None:
    assert hwplug.hookimpl is hookspecs.hookimpl
    assert hwplug.hookspec is hookspecs.hookspec
    assert hookspecs.PROJECT_NAME == "hwplug"
    assert hwplug.HOOK_API_VERSION == hookspecs.HOOK_API_VERSION
    major, minor = hookspecs.HOOK_API_VERSION
    assert (major, minor) >= (1, 0)


@pytest.mark.parametrize(
    ("hook", "params"),
    [
        ("hwplug_platforms", []),
        ("hwplug_check_and_update_config", ["config", "platform", "changes"]),
        ("hwplug_verify_config", ["config", "platform"]),
    ],
)
def test_hook_signatures(hook: str, params: list[str]) -> None:
    func = getattr(hookspecs, hook)
    assert list(inspect.signature(func).parameters) == params


def test_bad_hook_signature_is_rejected_by_pluggy() -> None:
    pm = pluggy.PluginManager("hwplug")
    pm.add_hookspecs(hookspecs)

    class Bad:
        @hwplug.hookimpl
        def hwplug_verify_config(self, config, platform, surprise):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(pluggy.PluginValidationError, match="surprise"):
        pm.register(Bad(), name="bad")


def test_deprecated_hookspec_warns_implementers() -> None:
    class Specs:
        @hookspecs.deprecated_hookspec("use hwplug_new_thing instead")
        def hwplug_old_thing(self) -> None:
            """An old hook."""

    pm = pluggy.PluginManager("hwplug")
    pm.add_hookspecs(Specs)

    class Impl:
        @hwplug.hookimpl
        def hwplug_old_thing(self) -> None:
            pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.register(Impl(), name="old")
    assert any(
        issubclass(w.category, hookspecs.HwplugHookDeprecationWarning)
        and "hwplug_new_thing" in str(w.message)
        for w in caught
    )
