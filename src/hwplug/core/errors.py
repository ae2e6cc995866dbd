"""The two error types users and plugin authors meet."""

from __future__ import annotations

__all__ = ["ConfigError", "PluginError"]


class ConfigError(ValueError):
    """A configuration that is invalid, or that the platform cannot run.

    The message says what was wrong (the option's ``section.field`` path), on
    which device, and what would work instead.
    """


class PluginError(RuntimeError):
    """A plugin failed to load or misbehaved.

    The message names the plugin and, where known, the distribution that
    installed it.
    """
