"""The ``torch`` attention backend: paged attention in plain PyTorch, on any device.

Each step it writes the new keys and values with the reference write path of
:mod:`hwplug.kernels`, gathers each sequence's cache pages, dequantises fp8
pages (the key scale is folded into the queries and the value scale into the
output, so the gathered pages are only cast), and runs
``torch.nn.functional.scaled_dot_product_attention`` with causal and
sliding-window masks and grouped heads. All decoding sequences (one query
token each) run as one batched call; every other sequence runs on its own.

It reads lengths back to the host, so it cannot run inside a device graph
(``graph_support = NEVER``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwplug.attention.base import AttentionBackend
from hwplug.core.graphs import AttentionGraphSupport

if TYPE_CHECKING:
    import torch

    from hwplug.attention.metadata import AttentionMetadata

__all__ = ["TorchAttentionBackend"]

_GATHER_BYTES = 2 << 20
"""Most bytes of gathered keys (and as many of values) one batched decode call holds."""


class TorchAttentionBackend(AttentionBackend):
    """Pure-PyTorch paged attention: every device, head size, dtype and cache dtype; not MLA."""

    name = "torch"
    graph_support = AttentionGraphSupport.NEVER

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        *,
        k_scale: float | torch.Tensor,
        v_scale: float | torch.Tensor,
    ) -> torch.Tensor:
        import torch

        from hwplug.kernels import reference
        from hwplug.kernels.formats import FP8_FORMATS

        num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
        metadata.check_values(num_blocks, block_size)
        reference.write_rows(key, key_cache, metadata.slot_mapping, k_scale)
        reference.write_rows(value, value_cache, metadata.slot_mapping, v_scale)

        starts = metadata.query_start_loc.tolist()
        lens = metadata.seq_lens.tolist()
        out = torch.zeros_like(query)
        fp8 = key_cache.dtype in FP8_FORMATS
        # q . (k * k_scale) == (q * k_scale) . k: scale the few queries, not the many keys
        queries = query * _on(k_scale, query) if fp8 else query
        pages = _Pages(key_cache, value_cache, metadata.block_table, block_size, query.dtype)

        decoding = [b for b in range(len(lens)) if starts[b + 1] - starts[b] == 1]
        if decoding:
            self._decode(queries, out, pages, decoding, starts, lens)
        for b, seq_len in enumerate(lens):
            start, end = starts[b], starts[b + 1]
            if end - start > 1:
                self._prefill(queries, out, pages, b, start, end, seq_len)
        if fp8:
            out *= _on(v_scale, out)
        return out

    def _decode(
        self,
        queries: torch.Tensor,
        out: torch.Tensor,
        pages: _Pages,
        seqs: list[int],
        starts: list[int],
        lens: list[int],
    ) -> None:
        """One query token per sequence: batched calls over groups of similar length.

        Each group's gathered pages stay under ``_GATHER_BYTES``: that bounds the
        memory a large batch takes, and small buffers are reused by the
        allocator instead of being mapped (and faulted in) afresh each step.
        """
        row_bytes = pages.row_bytes
        group: list[int] = []
        for b in sorted(seqs, key=lambda s: lens[s]):
            padded = -(-lens[b] // pages.block_size) * pages.block_size
            if group and (len(group) + 1) * padded * row_bytes > _GATHER_BYTES:
                self._decode_group(queries, out, pages, group, starts, lens)
                group = []
            group.append(b)
        self._decode_group(queries, out, pages, group, starts, lens)

    def _decode_group(
        self,
        queries: torch.Tensor,
        out: torch.Tensor,
        pages: _Pages,
        seqs: list[int],
        starts: list[int],
        lens: list[int],
    ) -> None:
        import torch

        device = queries.device
        seq_lens = [lens[b] for b in seqs]
        longest = max(seq_lens)
        rows = torch.tensor([starts[b] for b in seqs], device=device)
        k, v = pages.gather(torch.tensor(seqs, device=device), longest)
        q = queries.index_select(0, rows).unsqueeze(2)  # [n, heads, 1, head_size]
        window = self.sliding_window
        mask = None
        if min(seq_lens) != longest or (window is not None and window < longest):
            length = torch.tensor(seq_lens, device=device).unsqueeze(1)
            positions = torch.arange(longest, device=device).unsqueeze(0)
            keep = positions < length
            if window is not None:
                keep &= positions >= length - window
            mask = keep[:, None, None, :]
        result = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1]
        )
        out.index_copy_(0, rows, result.squeeze(2))

    def _prefill(
        self,
        queries: torch.Tensor,
        out: torch.Tensor,
        pages: _Pages,
        b: int,
        start: int,
        end: int,
        seq_len: int,
    ) -> None:
        """One sequence with several query tokens: the last ``end - start`` of its context."""
        import torch

        device = queries.device
        k, v = pages.gather(torch.tensor([b], device=device), seq_len)
        q = queries[start:end].transpose(0, 1).unsqueeze(0)  # [1, heads, q_len, head_size]
        q_len = end - start
        window = self.sliding_window
        mask = None
        causal = q_len == seq_len and (window is None or window >= seq_len)
        if not causal:
            positions = torch.arange(seq_len, device=device).unsqueeze(0)
            query_pos = torch.arange(seq_len - q_len, seq_len, device=device).unsqueeze(1)
            mask = positions <= query_pos
            if window is not None:
                mask &= positions > query_pos - window
        result = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        out[start:end] = result.squeeze(0).transpose(0, 1)


class _Pages:
    """Gathers sequences' cache pages into dense ``[n, kv_heads, length, head_size]`` tensors.

    fp8 pages are decoded exactly: ``float8_e5m2`` (the top byte of a
    float16) by torch's cast, which is fast for it, the other formats through
    a 256-entry table of their values in the compute dtype (several times
    faster on CPUs than torch's cast). Pages are laid out contiguously for
    attention unless they are already fp32 (16-bit attention on CPUs is much
    slower on strided keys).
    """

    def __init__(
        self,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        dtype: torch.dtype,
    ) -> None:
        import torch

        from hwplug.kernels.formats import FP8_FORMATS

        self.key_cache = key_cache
        self.value_cache = value_cache
        self.block_table = block_table
        self.block_size = block_size
        self.dtype = dtype
        self.values: torch.Tensor | None = None
        """For an fp8 cache: the value of each code, in the compute dtype."""
        if key_cache.dtype in FP8_FORMATS and key_cache.dtype != torch.float8_e5m2:
            codes = torch.arange(256, dtype=torch.uint8, device=key_cache.device)
            self.values = codes.view(key_cache.dtype).to(dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one gathered position (all key/value heads, in the compute dtype)."""
        _, _, heads, head_size = self.key_cache.shape
        return int(heads * head_size * self.dtype.itemsize)

    def gather(self, seqs: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``0..length-1`` of sequences ``seqs``."""
        import torch

        blocks = -(-length // self.block_size)
        table = self.block_table.index_select(0, seqs)
        # entries past a sequence's own blocks may hold anything: keep them in range
        table = table[:, :blocks].clamp(0, self.key_cache.shape[0] - 1).long()
        n = table.shape[0]
        result = []
        for cache in (self.key_cache, self.value_cache):
            # whole blocks are contiguous slices: index_select copies them wholesale
            # (fp8 as bytes: not every device indexes every fp8 dtype)
            source = cache.view(torch.uint8) if cache.dtype.itemsize == 1 else cache
            paged = source.index_select(0, table.reshape(-1)).view(cache.dtype)
            dense = paged.view(n, blocks * self.block_size, *cache.shape[2:])[:, :length]
            dense = dense.transpose(1, 2)  # [n, kv_heads, length, head_size], strided
            if self.values is not None:
                codes = torch.empty(dense.shape, dtype=torch.int32, device=dense.device)
                codes.copy_(dense.view(torch.uint8))
                dense = self.values.index_select(0, codes.view(-1)).view(codes.shape)
            elif dense.dtype != self.dtype or self.dtype != torch.float32:
                dense = torch.empty(dense.shape, dtype=self.dtype, device=dense.device).copy_(dense)
            result.append(dense)
        return result[0], result[1]


def _on(scale: float | torch.Tensor, like: torch.Tensor) -> float | torch.Tensor:
    """A scale ready to multiply ``like`` without changing its dtype (a 0-d tensor or float)."""
    import torch

    if isinstance(scale, torch.Tensor):
        return scale.reshape(()).to(like.device)
    return float(scale)
