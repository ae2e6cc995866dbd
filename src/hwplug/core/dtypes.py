"""Spellings of model dtypes, shared by the config models and the platforms (torch-free)."""

from __future__ import annotations

from typing import Any

__all__ = ["canonical_dtype"]

# Accepted spellings, mapped to the canonical torch name.
_ALIASES = {
    "bf16": "bfloat16",
    "half": "float16",
    "fp16": "float16",
    "float": "float32",
    "fp32": "float32",
}


def canonical_dtype(dtype: Any) -> str:
    """The canonical name (``bfloat16``, ``float16``, ``float32``...) of a dtype.

    Accepts strings in any case, aliases such as ``"half"`` and ``torch.dtype``
    objects (by their text, so torch is never imported).
    """
    text = str(dtype).strip().lower().removeprefix("torch.")
    return _ALIASES.get(text, text)
