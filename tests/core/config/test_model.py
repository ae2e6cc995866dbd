"""ModelConfig: a small Llama-like model by default, validated shapes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hwplug.core.config import ModelConfig
from hwplug.core.errors import ConfigError


def test_defaults_describe_a_small_llama_like_model() -> None:
    assert ModelConfig().to_dict() == {
        "dtype": "auto",
        "num_layers": 16,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "head_size": 64,
        "hidden_size": 2048,
        "max_model_len": 8192,
        "enforce_eager": False,
        "sliding_window": None,
        "is_attention_free": False,
        "use_mla": False,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
    }


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("auto", "auto"),
        ("float16", "float16"),
        ("half", "float16"),
        ("fp16", "float16"),
        ("bfloat16", "bfloat16"),
        ("bf16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("float32", "float32"),
        ("float", "float32"),
        ("fp32", "float32"),
        ("torch.float16", "float16"),
    ],
)
def test_dtype_aliases_are_normalised(given: str, canonical: str) -> None:
    assert ModelConfig(dtype=given).dtype == canonical  # type: ignore[arg-type]
    model = ModelConfig()
    model.dtype = given  # type: ignore[assignment]
    assert model.dtype == canonical


@pytest.mark.parametrize("dtype", ["int8", "float64", "fp8", 16])
def test_unknown_dtype_names_the_allowed_ones(dtype: object) -> None:
    with pytest.raises(ValidationError, match=r"dtype[\s\S]*'auto', 'float16', 'bfloat16'"):
        ModelConfig(dtype=dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field",
    [
        "num_layers",
        "num_attention_heads",
        "num_kv_heads",
        "head_size",
        "hidden_size",
        "max_model_len",
        "sliding_window",
        "kv_lora_rank",
        "qk_rope_head_dim",
    ],
)
@pytest.mark.parametrize("value", [0, -1, True])
def test_sizes_must_be_positive_integers(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        ModelConfig(**{field: value})  # type: ignore[arg-type]


def test_heads_must_divide_evenly() -> None:
    with pytest.raises(ConfigError, match=r"num_attention_heads \(32\).*model\.num_kv_heads"):
        ModelConfig(num_kv_heads=5)
    assert ModelConfig(num_attention_heads=40, num_kv_heads=40).num_kv_heads == 40


def test_rejected_assignment_keeps_the_model_consistent() -> None:
    model = ModelConfig()
    with pytest.raises(ConfigError, match="divisible"):
        model.num_kv_heads = 3
    assert model.num_kv_heads == 8
    model.num_kv_heads = 4
    assert model.num_kv_heads == 4
