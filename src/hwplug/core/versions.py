"""The installed torch release, read from package metadata (torch is not imported).

Free of pydantic and torch, so platform detection can ask it cheaply.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

__all__ = ["torch_version", "torch_version_at_least"]


@functools.lru_cache(maxsize=1)
def torch_version() -> tuple[int, ...] | None:
    """The installed torch release as ``(major, minor, patch)``, or ``None``.

    Read from package metadata, so torch is not imported. Pre-release and
    local suffixes are ignored: ``2.9.0.dev20250801+cu128`` is ``(2, 9, 0)``.
    """
    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+(?:\.\d+)*)", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def torch_version_at_least(version: str) -> bool:
    """Whether the installed torch is ``version`` or newer (dev builds count)."""
    current = torch_version()
    if current is None:
        return False
    wanted = tuple(int(part) for part in version.split("."))
    width = max(len(current), len(wanted))
    return current + (0,) * (width - len(current)) >= wanted + (0,) * (width - len(wanted))
