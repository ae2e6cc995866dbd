"""Compilation support: :func:`compile_model`, the level-3 piecewise backend,
compiling in a worker thread while an engine serves eagerly
(:class:`BackgroundCompilation`, :func:`compiles_in_background`, and
:func:`serving`, which an engine holds while it calls its modules eagerly), and host step
graphs for devices without device graphs (:class:`StepGraphWrapper`,
:class:`InductorStepBackend`).

Importing this package is cheap: :class:`PiecewiseBackend`, which imports
torch, is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwplug.compilation.background import BackgroundCompilation, compiles_in_background
from hwplug.compilation.compile import compile_model
from hwplug.compilation.serving import prime_compiler, serving
from hwplug.compilation.step_graphs import InductorStepBackend, StepGraph, StepGraphWrapper

if TYPE_CHECKING:
    from hwplug.compilation.piecewise import PiecewiseBackend

__all__ = [
    "BackgroundCompilation",
    "InductorStepBackend",
    "PiecewiseBackend",
    "StepGraph",
    "StepGraphWrapper",
    "compile_model",
    "compiles_in_background",
    "prime_compiler",
    "serving",
]


def __getattr__(name: str) -> Any:
    if name == "PiecewiseBackend":
        # lazy: the piecewise backend imports torch; `import hwplug` stays light.
        from hwplug.compilation.piecewise import PiecewiseBackend

        return PiecewiseBackend
    raise AttributeError(f"module 'hwplug.compilation' has no attribute {name!r}")
