"""Compilation support: :func:`compile_model` and the level-3 piecewise backend.

Importing this package is cheap; :func:`compile_model` and
:class:`PiecewiseBackend` (which import torch) are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hwplug.compilation.compile import compile_model
    from hwplug.compilation.piecewise import PiecewiseBackend

__all__ = ["PiecewiseBackend", "compile_model"]


def __getattr__(name: str) -> Any:
    if name == "PiecewiseBackend":
        from hwplug.compilation.piecewise import PiecewiseBackend

        return PiecewiseBackend
    if name == "compile_model":
        from hwplug.compilation.compile import compile_model

        return compile_model
    raise AttributeError(f"module 'hwplug.compilation' has no attribute {name!r}")
