"""Compilation support: :func:`compile_model` and the level-3 piecewise backend.

Importing this package is cheap: :class:`PiecewiseBackend`, which imports
torch, is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwplug.compilation.compile import compile_model

if TYPE_CHECKING:
    from hwplug.compilation.piecewise import PiecewiseBackend

__all__ = ["PiecewiseBackend", "compile_model"]


def __getattr__(name: str) -> Any:
    if name == "PiecewiseBackend":
        # lazy: the piecewise backend imports torch; `import hwplug` stays light.
        from hwplug.compilation.piecewise import PiecewiseBackend

        return PiecewiseBackend
    raise AttributeError(f"module 'hwplug.compilation' has no attribute {name!r}")
