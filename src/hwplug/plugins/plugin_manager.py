"""hwplug's pluggy plugin manager: where each plugin came from, its failures, its platforms.

The work is split by concern: :mod:`hwplug.plugins.loading` (entry points,
the allow-list, validation, failures) and :mod:`hwplug.plugins.selection`
(platform classes, probes, the choice); :class:`HwplugPluginManager` ties
them to one pluggy ``PluginManager``. A :class:`hwplug.Session` owns one.

Environment variables (read when a plugin manager is built):
``HWPLUG_PLUGINS`` (allow-list), ``HWPLUG_PLATFORM`` (force a platform),
``HWPLUG_SIMULATE`` (simulate a profile), ``HWPLUG_STRICT`` (``1``: a failing
plugin is a :class:`~hwplug.PluginError`; otherwise a warning naming it, and
the rest go on) and ``HWPLUG_TRACE`` (``1``: log every hook call, naming each
plugin whose implementation runs, to stderr through logger ``hwplug.trace``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping

import pluggy

from hwplug.core import hookspecs
from hwplug.core.errors import PluginError, error_line
from hwplug.core.platform import DeviceInfo, Platform
from hwplug.plugins import loading, selection
from hwplug.plugins.loading import PluginFailure, PluginInfo, PluginWarning
from hwplug.plugins.selection import Candidate, PlatformEntry, Selection

__all__ = ["HwplugPluginManager"]

logger = logging.getLogger("hwplug.plugins")

_TRUE = {"1", "true", "yes", "on"}


class HwplugPluginManager(pluggy.PluginManager):
    """A pluggy ``PluginManager`` for project ``"hwplug"`` that knows where plugins came from.

    Plugin failures are collected in :attr:`failures`; with ``strict`` they
    raise :class:`~hwplug.PluginError` instead.
    """

    def __init__(self, *, strict: bool | None = None, trace: bool | None = None) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.strict = (
            os.environ.get("HWPLUG_STRICT", "").strip().lower() in _TRUE
            if strict is None
            else strict
        )
        self.plugin_info: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []
        self._platforms: tuple[int, dict[str, PlatformEntry]] | None = None
        self._change_lock = threading.RLock()
        self.generation = 0
        """Bumped after every registration or unregistration has taken effect: what was
        derived from the plugins (the platform table, the attention backend behind a
        name) may differ. A reader that reads it *before* deriving something and keeps
        the pair never keeps a stale result under the current value: the registering
        thread, and every thread after it, sees the change at once."""
        if trace if trace is not None else os.environ.get("HWPLUG_TRACE", "") in _TRUE:
            self._enable_trace()

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """pluggy's ``register``, then the change counted in :attr:`generation`.

        Changes are serialised: two threads registering at once each see both.
        """
        with self._change_lock:
            try:
                return super().register(plugin, name)
            finally:
                self.generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> object | None:
        """pluggy's ``unregister`` (its platforms, backends and provenance go with it),
        then the change counted in :attr:`generation`."""
        with self._change_lock:
            try:
                if name is None and plugin is not None:
                    name = self.get_name(plugin)
                removed = super().unregister(plugin, name)
                if removed is not None and name is not None:
                    self.plugin_info.pop(name, None)
                return removed
            finally:
                self.generation += 1

    # -- tracing --------------------------------------------------------------
    def _enable_trace(self) -> None:
        trace_logger = logging.getLogger("hwplug.trace")
        if not trace_logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("hwplug-trace: %(message)s"))
            trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.DEBUG)
        # pluggy tags its own lines "[pluginmanage]"; the plugin is named in the line itself.
        self.trace.root.setwriter(
            lambda text: trace_logger.debug(text.rstrip("\n").replace(" [pluginmanage]", ""))
        )
        self.enable_tracing()

    # -- failures -------------------------------------------------------------
    def fail(self, plugin: str, distribution: str, stage: str, exc: BaseException | str) -> None:
        """Report a failing plugin: a warning, or a PluginError in strict mode."""
        error = exc if isinstance(exc, str) else error_line(exc)
        failure = PluginFailure(plugin, distribution, stage, error)
        self.failures.append(failure)
        if self.strict:
            raise PluginError(failure.message() + " (HWPLUG_STRICT=1)")
        self.warn(failure.message() + "; skipping it")

    def warn(self, message: str) -> None:
        """Warn about the plugins (logged, and a :class:`PluginWarning`)."""
        logger.warning("%s", message)
        warnings.warn(message, PluginWarning, stacklevel=3)

    def distribution_of(self, plugin_name: str) -> str | None:
        """The distribution that installed ``plugin_name``, if known."""
        info = self.plugin_info.get(plugin_name)
        return info.distribution if info else None

    def is_builtin(self, plugin_name: str) -> bool:
        """Whether ``plugin_name`` is one of hwplug's own platform plugins."""
        info = self.plugin_info.get(plugin_name)
        return info is not None and info.builtin

    def describe(self, source: str) -> str:
        """A plugin name or ``platform:<name>`` with its plugin and distribution, for messages."""
        if source.startswith("platform:"):
            cached = self._platforms  # the table as last derived: describing derives nothing
            entry = (cached[1] if cached else {}).get(source.partition(":")[2])
            if entry is not None:
                return (
                    f"{entry.cls.name!r} (plugin {entry.plugin!r}, "
                    f"distribution {entry.distribution})"
                )
            return repr(source.partition(":")[2])
        dist = self.distribution_of(source)
        return f"{source!r} (distribution {dist})" if dist else repr(source)

    # -- loading ----------------------------------------------------------------
    def register_plugin(
        self,
        plugin: object,
        name: str,
        *,
        group: str,
        distribution: str,
        version: str = "",
        value: str = "",
        builtin: bool = False,
    ) -> None:
        """Register ``plugin`` under ``name`` and validate it, reporting a failure instead
        of raising (built-ins raise: their failure is a bug)."""
        with self._change_lock:
            if self.has_plugin(name):
                other = self.distribution_of(name) or "(unknown)"
                raise PluginError(
                    f"plugin name {name!r} is claimed twice: by distribution {other!r} and by "
                    f"distribution {distribution!r}; uninstall one, or rename its entry point"
                )
            # Provenance first: a reader deriving the platform table while the plugin is
            # being registered names its distribution, never "(unregistered)".
            self.plugin_info[name] = PluginInfo(name, group, distribution, version, value, builtin)
            try:
                if self.register(plugin, name=name) is None:  # a blocked name: not registered
                    self.plugin_info.pop(name, None)
                    return
            except Exception as exc:
                self.plugin_info.pop(name, None)
                if builtin:
                    raise
                self.fail(name, distribution, "register", exc)
                return
            problem = loading.validate_plugin(self, name, plugin)
            if problem is not None:
                self.unregister(name=name)
                if builtin:
                    raise PluginError(f"built-in plugin {name!r}: {problem}")
                self.fail(name, distribution, "register", problem)

    def load_entrypoints(self, env: Mapping[str, str] | None = None) -> None:
        """Load the built-in platforms and every allowed third-party entry point."""
        loading.load_entrypoints(self, env)

    def load_builtins(self) -> None:
        """Load hwplug's built-in platforms only."""
        loading.load_builtins(self)

    # -- platforms ----------------------------------------------------------------
    def platform_entries(self) -> dict[str, PlatformEntry]:
        """Every platform class provided by the registered plugins, by platform name.

        :raises PluginError: a platform or profile name claimed twice, naming
            both distributions.
        """
        generation = self.generation  # read before deriving: see `generation`
        cached = self._platforms
        if cached is not None and cached[0] == generation:
            return cached[1]
        entries = selection.platform_entries(self)
        self._platforms = (generation, entries)
        return entries

    def known_profiles(self) -> dict[str, tuple[str, DeviceInfo]]:
        """Every simulated profile: profile name -> (platform name, device)."""
        return selection.known_profiles(self)

    def detect(self, entry: PlatformEntry) -> Candidate:
        """Ask one platform class whether its devices are present."""
        return selection.detect(self, entry)

    def select(self, env: Mapping[str, str] | None = None) -> Selection:
        """Choose the platform from the environment and the probes."""
        return selection.select(self, env)

    def simulate(self, spec: str) -> Platform:
        """The platform simulating profile ``spec`` (``"h100"`` or ``"h100:8"``)."""
        return selection.simulate(self, spec)

    def platform_from_spec(self, spec: str) -> Platform:
        """A platform by name (detected, else its representative profile) or by profile."""
        return selection.platform_from_spec(self, spec)

    # -- attention backends ----------------------------------------------------------
    def attention_backend_results(self) -> list[tuple[str, str, object]]:
        """``(plugin, distribution, result)`` of every ``hwplug_attention_backends`` hook.

        An implementation that raises is reported as a failing plugin (a
        warning, or a :class:`~hwplug.PluginError` with ``HWPLUG_STRICT=1``)
        and contributes nothing.
        """
        results = []
        for outcome in selection.call_each(self, "hwplug_attention_backends"):
            dist = self.distribution_of(outcome.plugin) or ""
            if outcome.error is not None:
                self.fail(
                    outcome.plugin,
                    dist or "(unregistered)",
                    "hwplug_attention_backends",
                    outcome.error,
                )
                continue
            results.append((outcome.plugin, dist, outcome.result))
        return results
