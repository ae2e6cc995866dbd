"""The attention section: which attention backend runs."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import field_validator
from pydantic.dataclasses import dataclass

from hwplug.core.config._common import CONFIG, ConfigSection, config_section
from hwplug.core.errors import ConfigError, brief
from hwplug.core.names import is_name

__all__ = ["AttentionConfig"]


@config_section
@dataclass(config=CONFIG)
class AttentionConfig(ConfigSection):
    """The attention backend; the platform chooses it when left unset."""

    section = "attention"

    backend: str | None = None
    """Attention backend name (``torch``, ``triton``, a plugin's); ``None`` lets the platform
    choose from its order of preference."""

    @field_validator("backend", mode="before")
    @classmethod
    def _check_backend(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str) and is_name(value.strip().lower()):
            return value.strip().lower()
        raise ConfigError(
            f"attention.backend: {brief(value)} is not a backend name; a name is lower case, "
            "starts with a letter and holds letters, digits, '_', '.' or '-', such as 'torch' "
            "or 'triton' (or null to let the platform choose)"
        )

    def compute_hash(self) -> str:
        """SHA-256 hex of the backend (it is part of the compiled graph)."""
        return hashlib.sha256(str([self.backend]).encode()).hexdigest()
