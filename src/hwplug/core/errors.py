"""The two error types users and plugin authors meet."""

from __future__ import annotations

__all__ = ["ConfigError", "PluginError", "error_line", "one_line"]


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


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(text.split())


def error_line(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line (just ``Type`` without a message)."""
    text = one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
