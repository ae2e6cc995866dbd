"""Per-step attention metadata: where each sequence's queries and cached tokens are."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["AttentionMetadata"]

_FIELDS = (
    ("query_start_loc", "int32", 1, "[num_seqs + 1]"),
    ("seq_lens", "int32", 1, "[num_seqs]"),
    ("block_table", "int32", 2, "[num_seqs, max_blocks]"),
    ("slot_mapping", "int64", 1, "[num_tokens]"),
)


@dataclasses.dataclass(frozen=True)
class AttentionMetadata:
    """One step of a batch of B sequences, as tensors on the device.

    ``query_start_loc`` (int32 ``[B+1]``): cumulative query lengths from 0;
    sequence b's query rows are ``query_start_loc[b]:query_start_loc[b+1]``.
    ``seq_lens`` (int32 ``[B]``): each context length after this step, new
    tokens included. ``block_table`` (int32 ``[B, max_blocks]``): the cache
    blocks of each sequence, in order. ``slot_mapping`` (int64 ``[N]``): the
    cache slot of each query row's key and value; negative for padding rows.

    Build one from lengths with :meth:`from_lengths`.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor

    @property
    def num_seqs(self) -> int:
        """B, the number of sequences (from the shapes)."""
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """N, the number of query rows, padding included (from the shapes)."""
        return int(self.slot_mapping.shape[0])

    def to(self, device: torch.device | str) -> AttentionMetadata:
        """The same metadata with every tensor on ``device``."""
        return AttentionMetadata(*(getattr(self, name).to(device) for name, *_ in _FIELDS))

    def check(self, num_tokens: int | None = None) -> None:
        """Check the tensors' types, dtypes, shapes and device; reads no values.

        ``num_tokens``: the number of query rows ``slot_mapping`` must cover.

        :raises ValueError: the first problem, naming the field.
        """
        import torch

        for name, dtype_name, ndim, layout in _FIELDS:
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise ValueError(
                    f"AttentionMetadata.{name} must be a torch.Tensor {layout}; got "
                    f"{type(t).__name__}"
                )
            if t.dim() != ndim:
                raise ValueError(
                    f"AttentionMetadata.{name} must have shape {layout}; got {list(t.shape)}"
                )
            if t.dtype != getattr(torch, dtype_name):
                raise ValueError(
                    f"AttentionMetadata.{name} must be {dtype_name}; got "
                    f"{str(t.dtype).removeprefix('torch.')}"
                )
        b = self.num_seqs
        if self.query_start_loc.shape[0] != b + 1:
            raise ValueError(
                f"AttentionMetadata.query_start_loc must have num_seqs + 1 = {b + 1} entries "
                f"(seq_lens has {b}); got {self.query_start_loc.shape[0]}"
            )
        if self.block_table.shape[0] != b:
            raise ValueError(
                f"AttentionMetadata.block_table must have one row per sequence ({b}); got "
                f"{self.block_table.shape[0]} rows"
            )
        if num_tokens is not None and self.num_tokens != num_tokens:
            raise ValueError(
                f"AttentionMetadata.slot_mapping must have one slot per query row ({num_tokens}); "
                f"got {self.num_tokens}"
            )
        devices = {getattr(self, name).device for name, *_ in _FIELDS}
        if len(devices) > 1:
            listing = ", ".join(f"{name} on {getattr(self, name).device}" for name, *_ in _FIELDS)
            raise ValueError(f"AttentionMetadata tensors must be on one device; got {listing}")

    def check_values(self, num_blocks: int, block_size: int) -> None:
        """Check the values against a cache of ``num_blocks`` x ``block_size`` slots.

        Reads the tensors back to the host (a device synchronisation): for
        backends that may, and for tests.

        :raises ValueError: the first inconsistency, naming the sequence.
        """
        import torch

        self.check()
        qsl = self.query_start_loc.tolist()
        lens = self.seq_lens.tolist()
        if qsl[0] != 0:
            raise ValueError(f"AttentionMetadata.query_start_loc must start at 0; got {qsl[0]}")
        if qsl[-1] > self.num_tokens:
            raise ValueError(
                f"AttentionMetadata.query_start_loc[-1]={qsl[-1]} query rows, but slot_mapping "
                f"has only {self.num_tokens}"
            )
        width = self.block_table.shape[1]
        for b, (start, end, seq_len) in enumerate(zip(qsl, qsl[1:], lens)):
            if end < start:
                raise ValueError(
                    f"AttentionMetadata.query_start_loc must not decrease; sequence {b} has "
                    f"{start} -> {end}"
                )
            if not 0 <= end - start <= seq_len:
                raise ValueError(
                    f"sequence {b} has {end - start} query tokens but seq_lens[{b}]={seq_len}; "
                    "the context length includes the new tokens, so it cannot be smaller"
                )
            if -(-seq_len // block_size) > width:
                raise ValueError(
                    f"sequence {b} needs {-(-seq_len // block_size)} blocks of {block_size} for "
                    f"seq_lens[{b}]={seq_len}, but block_table has {width} columns"
                )
        # the blocks each sequence uses must exist; entries past them may hold anything
        needed = (self.seq_lens.to(torch.int64) + block_size - 1) // block_size
        columns = torch.arange(width, device=self.block_table.device)
        used = columns.unsqueeze(0) < needed.unsqueeze(1)
        table = self.block_table
        bad = used & ((table < 0) | (table >= num_blocks))
        if bool(bad.any()):
            b, column = (int(i) for i in bad.nonzero()[0].tolist())
            raise ValueError(
                f"block_table[{b}, {column}] = {int(table[b, column])}, but the cache has "
                f"{num_blocks} blocks (0 to {num_blocks - 1})"
            )
        num_slots = num_blocks * block_size
        top = int(self.slot_mapping.max().item()) if self.num_tokens else -1
        if top >= num_slots:
            raise ValueError(
                f"slot_mapping holds slot {top}, but the cache has {num_slots} slots "
                f"({num_blocks} blocks x {block_size}); a negative slot marks padding"
            )

    @classmethod
    def from_lengths(
        cls,
        seq_lens: Sequence[int],
        query_lens: Sequence[int],
        block_table: Sequence[Sequence[int]] | torch.Tensor,
        block_size: int,
        *,
        num_tokens: int | None = None,
        device: torch.device | str | None = None,
    ) -> AttentionMetadata:
        """Metadata for sequences with these context and query lengths.

        Sequence b has ``seq_lens[b]`` tokens after this step, of which the
        last ``query_lens[b]`` are new; its cache blocks are ``block_table[b]``
        (rows may be ragged: they are padded with block 0). ``num_tokens``
        pads the batch to that many query rows (slot -1). Tensors are built on
        the CPU and moved to ``device``.

        :raises ValueError: inconsistent lengths or too few blocks (naming the sequence).
        """
        import torch

        if len(seq_lens) != len(query_lens) or len(block_table) != len(seq_lens):
            raise ValueError(
                f"seq_lens, query_lens and block_table need one entry per sequence; got "
                f"{len(seq_lens)}, {len(query_lens)} and {len(block_table)}"
            )
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer; got {block_size!r}")
        rows = block_table.tolist() if isinstance(block_table, torch.Tensor) else block_table
        rows = [[int(x) for x in row] for row in rows]
        slots: list[int] = []
        starts = [0]
        for b, (seq_len, q_len, row) in enumerate(zip(seq_lens, query_lens, rows)):
            if not 0 <= q_len <= seq_len:
                raise ValueError(
                    f"sequence {b}: query_lens[{b}]={q_len} must be between 0 and "
                    f"seq_lens[{b}]={seq_len} (the context length includes the new tokens)"
                )
            needed = -(-seq_len // block_size)
            if len(row) < needed:
                raise ValueError(
                    f"sequence {b}: seq_lens[{b}]={seq_len} needs {needed} blocks of "
                    f"{block_size}; block_table[{b}] has {len(row)}"
                )
            for pos in range(seq_len - q_len, seq_len):
                slots.append(row[pos // block_size] * block_size + pos % block_size)
            starts.append(starts[-1] + q_len)
        total = starts[-1]
        if num_tokens is None:
            num_tokens = total
        if num_tokens < total:
            raise ValueError(
                f"num_tokens={num_tokens} is smaller than the {total} query tokens of the batch"
            )
        slots.extend([-1] * (num_tokens - total))
        width = max([1, *(len(row) for row in rows)])
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        for b, row in enumerate(rows):
            if row:
                table[b, : len(row)] = torch.tensor(row, dtype=torch.int32)
        meta = cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32),
            block_table=table,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
        )
        return meta if device is None else meta.to(device)
