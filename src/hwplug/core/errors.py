"""The two error types users and plugin authors meet."""

from __future__ import annotations

__all__ = ["ConfigError", "PluginError", "brief", "error_line", "one_line"]


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


def brief(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, safe for any value a user may give.

    Integers too long to print (Python refuses over 4300 digits) are described
    by their number of digits instead.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
        # Printing it would be refused (or take long): describe it instead.
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
