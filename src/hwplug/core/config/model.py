"""The model section: the shape of the model the engine runs."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import field_validator, model_validator
from pydantic.dataclasses import dataclass

from hwplug.core.config._common import CONFIG, ConfigSection, PositiveInt, config_section
from hwplug.core.dtypes import canonical_dtype
from hwplug.core.errors import ConfigError

__all__ = ["ModelConfig", "ModelDType"]

#: Model dtypes; ``auto`` lets the platform pick its first supported one.
ModelDType = Literal["auto", "float16", "bfloat16", "float32"]


@config_section
@dataclass(config=CONFIG)
class ModelConfig(ConfigSection):
    """The model's shape; the defaults describe a small Llama-like model."""

    section = "model"

    dtype: ModelDType = "auto"
    """Weight and activation dtype (aliases half/fp16, bf16, float/fp32 accepted)."""
    num_layers: PositiveInt = 16
    """Number of transformer layers (each has its own KV cache)."""
    num_attention_heads: PositiveInt = 32
    """Number of query heads."""
    num_kv_heads: PositiveInt = 8
    """Number of key/value heads; divides ``num_attention_heads``."""
    head_size: PositiveInt = 64
    """Size of one attention head."""
    hidden_size: PositiveInt = 2048
    """Width of the residual stream."""
    max_model_len: PositiveInt = 8192
    """Longest sequence, prompt and output together, in tokens."""
    enforce_eager: bool = False
    """Never compile or capture graphs: run eagerly."""
    sliding_window: PositiveInt | None = None
    """Sliding attention window in tokens; ``None`` for full attention."""
    is_attention_free: bool = False
    """Whether the model has no attention layers (no KV cache)."""
    use_mla: bool = False
    """Multi-head latent attention: the cache holds a compressed latent, not K and V."""
    kv_lora_rank: PositiveInt = 512
    """MLA latent rank (per-token cache size is ``kv_lora_rank + qk_rope_head_dim``)."""
    qk_rope_head_dim: PositiveInt = 64
    """MLA rotary part of each query/key head, cached beside the latent."""

    @field_validator("dtype", mode="before")
    @classmethod
    def _normalise_dtype(cls, value: Any) -> Any:
        if type(value).__name__ == "dtype":  # a torch.dtype, without importing torch
            value = str(value)
        if isinstance(value, str):
            return canonical_dtype(value)
        return value

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"model.num_kv_heads ({self.num_kv_heads})"
            )
        return self

    def compute_hash(self) -> str:
        """SHA-256 hex of the fields that shape the compiled graph."""
        factors = [
            self.dtype,
            self.num_layers,
            self.num_attention_heads,
            self.num_kv_heads,
            self.head_size,
            self.hidden_size,
            self.max_model_len,
            self.sliding_window,
            self.is_attention_free,
            self.use_mla,
            self.kv_lora_rank if self.use_mla else None,
            self.qk_rope_head_dim if self.use_mla else None,
        ]
        return hashlib.sha256(str(factors).encode()).hexdigest()
