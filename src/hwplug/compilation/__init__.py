"""Compilation support: the level-3 piecewise ``torch.compile`` backend.

Importing this package is cheap; :class:`PiecewiseBackend` (which imports
torch) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwplug.compilation.piecewise import PiecewiseBackend

__all__ = ["PiecewiseBackend"]


def __getattr__(name: str) -> Any:
    if name == "PiecewiseBackend":
        from hwplug.compilation.piecewise import PiecewiseBackend

        return PiecewiseBackend
    raise AttributeError(f"module 'hwplug.compilation' has no attribute {name!r}")
