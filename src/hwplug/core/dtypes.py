"""The dtype vocabularies, shared by the config models and the platforms (torch-free).

Model dtypes and their spellings, and the registry of KV-cache dtype strings
(``cache.cache_dtype``), which a vendor may extend with its own format.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "CACHE_DTYPE_FORMATS",
    "CacheDtypeFormat",
    "cache_dtype_names",
    "canonical_dtype",
    "is_fp8_cache",
    "register_cache_dtype",
]

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


# ---------------------------------------------------------------------------
# KV-cache dtypes
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheDtypeFormat:
    """One ``cache.cache_dtype`` string and what it stores.

    ``torch_name`` is the torch dtype it stores, or None where it depends on
    the model (``auto``) or the platform (``fp8``, and a platform's own name
    for its fp8 cache: the platform's ``fp8_dtype()``). ``fnuz_torch_name``
    replaces it on platforms whose fp8 uses the FNUZ encoding. A format with
    ``listed_only`` exists only on the platforms that list it in
    ``cache_dtypes`` (a vendor's own format); ``note`` says what it is, for
    messages.
    """

    name: str
    torch_name: str | None
    fp8: bool = False
    fnuz_torch_name: str | None = None
    listed_only: bool = False
    note: str = ""


CACHE_DTYPE_FORMATS: dict[str, CacheDtypeFormat] = {
    f.name: f
    for f in (
        CacheDtypeFormat("auto", None, note="the model's dtype"),
        CacheDtypeFormat("bfloat16", "bfloat16"),
        CacheDtypeFormat("fp8", None, fp8=True, note="the platform's preferred fp8 format"),
        CacheDtypeFormat("fp8_e4m3", "float8_e4m3fn", fp8=True, fnuz_torch_name="float8_e4m3fnuz"),
        CacheDtypeFormat("fp8_e5m2", "float8_e5m2", fp8=True),
        # stored as the fp8_dtype() of the platform that lists it (its fp8_cache_dtype)
        CacheDtypeFormat(
            "fp8_inc",
            None,
            fp8=True,
            listed_only=True,
            note="the Intel Gaudi (HPU) format",
        ),
    )
}
"""Every ``cache.cache_dtype`` string, by name: the one vocabulary of cache dtypes."""


def register_cache_dtype(fmt: CacheDtypeFormat) -> None:
    """Add a cache dtype (a vendor's own format); re-registering the same one is a no-op.

    :raises ValueError: the name is taken by a different format.
    """
    existing = CACHE_DTYPE_FORMATS.get(fmt.name)
    if existing is not None and existing != fmt:
        raise ValueError(f"cache dtype {fmt.name!r} is already registered as {existing}")
    CACHE_DTYPE_FORMATS[fmt.name] = fmt


def cache_dtype_names() -> tuple[str, ...]:
    """The registered ``cache.cache_dtype`` strings, in registration order."""
    return tuple(CACHE_DTYPE_FORMATS)


def is_fp8_cache(cache_dtype: str) -> bool:
    """Whether ``cache_dtype`` stores the KV cache in 8-bit floats."""
    fmt = CACHE_DTYPE_FORMATS.get(cache_dtype)
    return fmt is not None and fmt.fp8
