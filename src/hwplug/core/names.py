"""What the names of platforms, profiles and attention backends look like.

One rule for every name a user can type in a config, an environment variable
or on the command line: lower case, starting with a letter, then letters,
digits, ``_``, ``.`` or ``-``. The registry of attention backends, the
selection of platforms and the config sections all check names with it, so a
name a plugin may register is always a name a user may choose. Nothing here
imports pydantic or torch (selecting a platform must stay light).
"""

from __future__ import annotations

import re

__all__ = ["NAME", "is_name"]

NAME = re.compile(r"[a-z][a-z0-9_.-]*")
"""The shape of a name, for ``fullmatch``."""


def is_name(value: object) -> bool:
    """Whether ``value`` is a string of :data:`NAME`'s shape (whole string, no newline)."""
    return isinstance(value, str) and NAME.fullmatch(value) is not None
