"""A float64 attention reference and batch builders for the attention tests."""

from __future__ import annotations

import dataclasses

import torch

from hwplug.attention import AttentionMetadata
from hwplug.kernels import FP8_FORMATS


def reference_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    *,
    scale: float,
    sliding_window: int | None = None,
    k_scale: float | torch.Tensor = 1.0,
    v_scale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """Attention in float64 over what the caches hold (dequantised), one sequence at a time.

    Returns ``[T, num_heads, head_size]`` float64 for the T real query rows.
    """
    fp8 = key_cache.dtype in FP8_FORMATS
    ks = float(k_scale) if fp8 else 1.0
    vs = float(v_scale) if fp8 else 1.0
    block_size = key_cache.shape[1]
    num_heads, num_kv_heads = query.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    starts = metadata.query_start_loc.tolist()
    lens = metadata.seq_lens.tolist()
    table = metadata.block_table.to(torch.int64)
    out = torch.zeros((starts[-1], *query.shape[1:]), dtype=torch.float64)
    for b, seq_len in enumerate(lens):
        start, end = starts[b], starts[b + 1]
        if end == start:
            continue
        positions = torch.arange(seq_len)
        slots = table[b, positions // block_size] * block_size + positions % block_size
        k = key_cache.reshape(-1, *key_cache.shape[2:])[slots].to(torch.float64) * ks
        v = value_cache.reshape(-1, *value_cache.shape[2:])[slots].to(torch.float64) * vs
        k = k.repeat_interleave(group, dim=1)  # [seq_len, heads, head_size]
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].to(torch.float64)
        q_pos = torch.arange(seq_len - (end - start), seq_len)
        visible = positions[None, :] <= q_pos[:, None]
        if sliding_window is not None:
            visible &= positions[None, :] > q_pos[:, None] - sliding_window
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


@dataclasses.dataclass
class Batch:
    """Inputs of one forward call."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    metadata: AttentionMetadata

    def args(self) -> tuple[torch.Tensor | AttentionMetadata, ...]:
        """The positional arguments of ``AttentionBackend.forward``, in order."""
        return (self.query, self.key, self.value, self.key_cache, self.value_cache, self.metadata)


def make_batch(
    seq_lens: list[int],
    query_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    padding: int = 0,
    seed: int = 0,
    device: str = "cpu",
    extra_blocks: int = 2,
    num_blocks: int | None = None,
) -> Batch:
    """Random queries/keys/values and caches whose earlier positions hold random data.

    Blocks are handed out in a shuffled order, so sequences' pages are scattered.
    The cache has ``num_blocks`` blocks, by default those needed plus ``extra_blocks``.
    """
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = dtype if cache_dtype is None else cache_dtype
    needed = [-(-n // block_size) for n in seq_lens]
    if num_blocks is None:
        num_blocks = sum(needed) + extra_blocks
    if num_blocks < sum(needed):
        raise ValueError(f"num_blocks={num_blocks} is fewer than the {sum(needed)} needed")
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table, used = [], 0
    for n in needed:
        table.append(order[used : used + n])
        used += n
    metadata = AttentionMetadata.from_lengths(
        seq_lens, query_lens, table, block_size, num_tokens=sum(query_lens) + padding
    )
    n = metadata.num_tokens
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    # old context: random values already in the cache's format
    key_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    value_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    query = torch.randn(n, num_heads, head_size, generator=gen).to(dtype)
    key = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(n, num_kv_heads, head_size, generator=gen).to(dtype)
    return Batch(
        query.to(device),
        key.to(device),
        value.to(device),
        key_cache.to(device),
        value_cache.to(device),
        metadata.to(device),
    )
