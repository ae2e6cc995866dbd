"""Every bad argument is a ValueError that names the argument and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hwplug.kernels import gather_kv_cache, write_kv_cache


def args(**overrides: Any) -> dict[str, Any]:
    """A valid write_kv_cache call (3 tokens, 2 heads, head size 4, 2 blocks of 4)."""
    base: dict[str, Any] = {
        "key": torch.ones(3, 2, 4),
        "value": torch.ones(3, 2, 4),
        "key_cache": torch.zeros(2, 4, 2, 4, dtype=torch.float8_e4m3fn),
        "value_cache": torch.zeros(2, 4, 2, 4, dtype=torch.float8_e4m3fn),
        "slot_mapping": torch.tensor([0, 5, -1]),
    }
    base.update(overrides)
    return base


def test_the_valid_baseline_passes() -> None:
    write_kv_cache(**args(), backend="torch")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"key": [[1.0]]}, r"key must be a torch\.Tensor of shape \[num_tokens, num_kv_heads"),
        ({"key": torch.ones(3, 8)}, r"key must have shape \[num_tokens, num_kv_heads, head_size\]"),
        ({"value": torch.ones(3, 2, 5)}, r"value shape \(3, 2, 5\) must equal key shape"),
        ({"key": torch.ones(3, 2, 4, dtype=torch.int32)}, r"key dtype must be one of bfloat16"),
        (
            {"value": torch.ones(3, 2, 4, dtype=torch.float64)},
            r"value dtype must be one of bfloat16, float16, float32; got float64",
        ),
        (
            {"key_cache": torch.zeros(8, 2, 4)},
            r"key_cache must have shape \[num_blocks, block_size",
        ),
        (
            {"value_cache": torch.zeros(2, 4, 2, 8, dtype=torch.float8_e4m3fn)},
            r"value_cache shape \(2, 4, 2, 8\) must equal key_cache shape \(2, 4, 2, 4\)",
        ),
        (
            {"key_cache": torch.zeros(2, 4, 2, 4, dtype=torch.int8)},
            r"key_cache dtype must be one of float8_e4m3fn.*float32; got int8",
        ),
        (
            {
                "key_cache": torch.zeros(2, 4, 4, 2, dtype=torch.float8_e4m3fn),
                "value_cache": torch.zeros(2, 4, 4, 2, dtype=torch.float8_e4m3fn),
            },
            r"\[num_kv_heads, head_size\] = \(2, 4\), which does not match the caches' \(4, 2\)",
        ),
        ({"slot_mapping": [0, 1, 2]}, r"slot_mapping must be a 1-D integer tensor; got list"),
        ({"slot_mapping": torch.tensor([0.0, 1.0, 2.0])}, r"slot_mapping must be a 1-D integer"),
        ({"slot_mapping": torch.zeros(3, 1, dtype=torch.long)}, r"got shape \(3, 1\)"),
        ({"slot_mapping": torch.tensor([True, False, True])}, r"1-D integer tensor"),
        (
            {"slot_mapping": torch.tensor([0, 1])},
            r"slot_mapping must hold one slot per token: length 3; got length 2",
        ),
        (
            {"slot_mapping": torch.tensor([0, 8, 1])},
            r"slot_mapping holds slot 8, but the cache has 8 slots \(num_blocks=2 x block_size=4\)",
        ),
        ({"key": torch.ones(3, 2, 4, device="meta")}, r"all tensors must be on one device; got"),
    ],
)
def test_write_rejects_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_kv_cache(**args(**overrides), backend="torch")


@pytest.mark.parametrize(
    ("scale", "message"),
    [
        (0.0, r"k_scale must be a positive finite number; got 0\.0"),
        (-1.0, r"k_scale must be a positive finite number; got -1\.0"),
        (float("inf"), r"k_scale must be a positive finite number; got inf"),
        (float("nan"), r"k_scale must be a positive finite number; got nan"),
        (torch.tensor([1.0, 2.0]), r"k_scale must be a number or a 0-d/1-element tensor"),
        (torch.tensor(0.0), r"k_scale must be a positive finite number"),
        ("1.0", r"k_scale must be a positive finite float or a 0-d/1-element tensor; got str"),
        (True, r"k_scale must be a positive finite float"),
    ],
)
def test_bad_scales(scale: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_kv_cache(**args(), k_scale=scale, backend="torch")
    with pytest.raises(ValueError, match=message.replace("k_scale", "v_scale")):
        gather_kv_cache(
            args()["key_cache"],
            args()["value_cache"],
            torch.tensor([0]),
            v_scale=scale,
            dtype=torch.float32,
            backend="torch",
        )


def test_unknown_backend_lists_the_three() -> None:
    with pytest.raises(ValueError, match=r"backend must be one of 'auto', 'torch', 'triton'"):
        write_kv_cache(**args(), backend="cuda")
    with pytest.raises(ValueError, match=r"got 'numpy'"):
        gather_kv_cache(
            args()["key_cache"],
            args()["value_cache"],
            torch.tensor([0]),
            dtype=torch.float32,
            backend="numpy",
        )


def test_gather_rejects_bad_arguments() -> None:
    caches = args()["key_cache"], args()["value_cache"]
    with pytest.raises(ValueError, match=r"dtype must be one of bfloat16, float16, float32"):
        gather_kv_cache(*caches, torch.tensor([0]), dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"dtype must be one of .*got 'float32'"):
        gather_kv_cache(*caches, torch.tensor([0]), dtype="float32")
    with pytest.raises(ValueError, match=r"slot_mapping holds slot 9"):
        gather_kv_cache(*caches, torch.tensor([9, -1]), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"slot_mapping must be a 1-D integer tensor"):
        gather_kv_cache(*caches, torch.tensor([[0]]), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"all tensors must be on one device"):
        gather_kv_cache(*caches, torch.tensor([0], device="meta"), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"value_cache must be a torch\.Tensor"):
        gather_kv_cache(caches[0], None, torch.tensor([0]), dtype=torch.float32)


def test_empty_batches_are_fine() -> None:
    write_kv_cache(
        **args(
            key=torch.ones(0, 2, 4),
            value=torch.ones(0, 2, 4),
            slot_mapping=torch.zeros(0, dtype=torch.int64),
        ),
        backend="torch",
    )
    key, value = gather_kv_cache(
        args()["key_cache"],
        args()["value_cache"],
        torch.zeros(0, dtype=torch.int32),
        dtype=torch.bfloat16,
        backend="torch",
    )
    assert key.shape == value.shape == (0, 2, 4)
