"""Per-step attention metadata: where each sequence's queries and cached tokens are.

An engine knows each step's lengths and blocks on the host before it runs the
model. :meth:`AttentionMetadata.build` turns those host values into the
device tensors attention reads (one copy per tensor), checks them, and keeps
the host values beside the tensors, so that a backend's
:meth:`~hwplug.attention.AttentionBackend.prepare` works out what it needs for
the step without reading anything back from the device.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hwplug.core.session import platform_for_device

if TYPE_CHECKING:
    import torch

__all__ = ["AttentionMetadata", "PreparedStep", "metadata_of"]

_FIELDS = (
    ("query_start_loc", "int32", 1, "[num_seqs + 1]"),
    ("seq_lens", "int32", 1, "[num_seqs]"),
    ("block_table", "int32", 2, "[num_seqs, max_blocks]"),
    ("slot_mapping", "int64", 1, "[num_tokens]"),
)

_MAX_LEN = 1 << 40
"""Lengths and ids beyond this are refused (they overflow the kernels' index arithmetic)."""


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """One step of a batch of B sequences: device tensors and, when known, host values.

    Tensors (on the device):
    ``query_start_loc`` (int32 ``[B+1]``): cumulative query lengths from 0;
    sequence b's query rows are ``query_start_loc[b]:query_start_loc[b+1]``.
    ``seq_lens`` (int32 ``[B]``): each context length after this step, new
    tokens included. ``block_table`` (int32 ``[B, max_blocks]``): the cache
    blocks of each sequence, in order. ``slot_mapping`` (int64 ``[N]``): the
    cache slot of each query row's key and value; negative for padding rows.

    Host values (plain Python, set by :meth:`build` and :meth:`from_lengths`;
    None when the metadata was made from device tensors alone):
    ``query_lens`` and ``seq_lens_cpu`` (lists of B ints), ``max_query_len``
    and ``max_seq_len``, and the host copies ``block_table_cpu`` and
    ``slot_mapping_cpu`` (CPU tensors) the value checks read.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    max_query_len: int | None = None
    max_seq_len: int | None = None
    block_table_cpu: torch.Tensor | None = dataclasses.field(default=None, repr=False)
    slot_mapping_cpu: torch.Tensor | None = dataclasses.field(default=None, repr=False)

    @property
    def num_seqs(self) -> int:
        """B, the number of sequences (from the shapes)."""
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        """N, the number of query rows, padding included (from the shapes)."""
        return int(self.slot_mapping.shape[0])

    @property
    def has_host_values(self) -> bool:
        """Whether the host values are here (:meth:`build`), so nothing need be read back."""
        return (
            self.query_lens is not None
            and self.seq_lens_cpu is not None
            and self.block_table_cpu is not None
            and self.slot_mapping_cpu is not None
        )

    @property
    def device(self) -> torch.device:
        """The device of the tensors."""
        return self.slot_mapping.device

    def to(self, device: torch.device | str) -> AttentionMetadata:
        """The same metadata with every tensor on ``device`` (host values kept)."""
        moved = {name: getattr(self, name).to(device) for name, *_ in _FIELDS}
        return dataclasses.replace(self, **moved)

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
        if self.query_lens is not None and len(self.query_lens) != b:
            raise ValueError(
                f"AttentionMetadata.query_lens has {len(self.query_lens)} entries for {b} sequences"
            )
        if self.seq_lens_cpu is not None and len(self.seq_lens_cpu) != b:
            raise ValueError(
                f"AttentionMetadata.seq_lens_cpu has {len(self.seq_lens_cpu)} entries for "
                f"{b} sequences"
            )

    def host_values(self) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
        """``(query_lens, seq_lens, block_table, slot_mapping)`` on the host.

        From the host values when the metadata has them; otherwise read back
        from the device (one synchronisation): for metadata made from tensors
        alone, in :meth:`~hwplug.attention.AttentionBackend.prepare`, never in
        ``forward``.
        """
        import torch

        if self.has_host_values:
            assert self.query_lens is not None
            assert self.seq_lens_cpu is not None
            assert self.block_table_cpu is not None
            assert self.slot_mapping_cpu is not None
            return (
                self.query_lens,
                self.seq_lens_cpu,
                self.block_table_cpu,
                self.slot_mapping_cpu,
            )
        starts = self.query_start_loc.tolist()
        query_lens = [end - start for start, end in itertools.pairwise(starts)]
        if starts and starts[0] != 0:
            raise ValueError(f"AttentionMetadata.query_start_loc must start at 0; got {starts[0]}")
        for b, q in enumerate(query_lens):
            if q < 0:
                raise ValueError(
                    f"AttentionMetadata.query_start_loc must not decrease; sequence {b} has "
                    f"{starts[b]} -> {starts[b + 1]}"
                )
        return (
            query_lens,
            self.seq_lens.tolist(),
            self.block_table.to("cpu", torch.int64),
            self.slot_mapping.to("cpu"),
        )

    def check_values(self, num_blocks: int, block_size: int) -> None:
        """Check the values against a cache of ``num_blocks`` x ``block_size`` slots.

        From the host values when the metadata has them (:meth:`build`),
        otherwise read back from the device (a synchronisation): for
        :meth:`~hwplug.attention.AttentionBackend.prepare` and tests.

        :raises ValueError: the first inconsistency, naming the field and sequence.
        """
        self.check()
        query_lens, seq_lens, table, slots = self.host_values()
        _check_slots_of_padding(query_lens, slots)
        _check_lengths(query_lens, seq_lens, "AttentionMetadata")
        _check_against_cache(query_lens, seq_lens, table, slots, num_blocks, block_size)

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int] | torch.Tensor,
        seq_lens: Sequence[int] | torch.Tensor,
        block_table: Sequence[Sequence[int]] | torch.Tensor,
        slot_mapping: Sequence[int] | torch.Tensor,
        *,
        device: torch.device | str,
        out: AttentionMetadata | None = None,
    ) -> AttentionMetadata:
        """Metadata for one step from host values, with one copy per tensor to ``device``.

        ``query_lens[b]`` new tokens end sequence b's context of ``seq_lens[b]``
        tokens; ``block_table`` holds each sequence's cache blocks (rows may be
        ragged lists: they are padded with block 0); ``slot_mapping`` the slot
        of each query row, negative for padding rows (every row past
        ``sum(query_lens)`` is padding). Lists or CPU tensors.

        ``out``: persistent metadata to copy into (the buffers a captured device
        graph reads); the result's tensors are leading slices of its tensors
        (the block table keeps all of ``out``'s columns: those past a
        sequence's blocks are never read).

        Lengths and the padding rows are checked here; whether blocks and slots
        fit a cache is checked by :meth:`check_values` (a backend's
        ``prepare``), which knows the cache.

        :raises ValueError: inconsistent values, naming the field and sequence.
        """
        import torch

        q_lens = _int_list(query_lens, "query_lens")
        s_lens = _int_list(seq_lens, "seq_lens")
        if len(q_lens) != len(s_lens):
            raise ValueError(
                f"query_lens and seq_lens need one entry per sequence; got {len(q_lens)} and "
                f"{len(s_lens)}"
            )
        _check_lengths(q_lens, s_lens, "build")
        table = _table(block_table, len(q_lens))
        slots = _slots(slot_mapping)
        total = sum(q_lens)
        if slots.shape[0] < total:
            raise ValueError(
                f"slot_mapping has {slots.shape[0]} rows for the {total} query tokens of the "
                "step (sum(query_lens)); give one slot per query row"
            )
        _check_slots_of_padding(q_lens, slots)
        starts = [0]
        for q in q_lens:
            starts.append(starts[-1] + q)
        host = {
            "query_start_loc": torch.tensor(starts, dtype=torch.int32),
            "seq_lens": torch.tensor(s_lens, dtype=torch.int32),
            "block_table": table.to(torch.int32),
            "slot_mapping": slots,
        }
        target = torch.device(device)
        tensors = _to_device(host, target, out)
        return cls(
            **tensors,
            query_lens=q_lens,
            seq_lens_cpu=s_lens,
            max_query_len=max(q_lens, default=0),
            max_seq_len=max(s_lens, default=0),
            block_table_cpu=table,
            slot_mapping_cpu=slots,
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
        """Metadata for sequences with these context and query lengths, slots derived.

        Sequence b has ``seq_lens[b]`` tokens after this step, of which the
        last ``query_lens[b]`` are new; its cache blocks are ``block_table[b]``
        (rows may be ragged: they are padded with block 0). Each new token's
        slot follows from its position and the table. ``num_tokens`` pads the
        batch to that many query rows (slot -1). Tensors go to ``device``
        (default: the CPU); host values are kept, as :meth:`build` keeps them.

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
        total = len(slots)
        if num_tokens is None:
            num_tokens = total
        if num_tokens < total:
            raise ValueError(
                f"num_tokens={num_tokens} is smaller than the {total} query tokens of the batch"
            )
        slots.extend([-1] * (num_tokens - total))
        return cls.build(list(query_lens), list(seq_lens), rows, slots, device=device or "cpu")


# -- host-side checks ------------------------------------------------------------------


def _check_lengths(query_lens: Sequence[int], seq_lens: Sequence[int], where: str) -> None:
    for b, (q, s) in enumerate(zip(query_lens, seq_lens)):
        if not 0 <= q <= s:
            raise ValueError(
                f"{where}: sequence {b} has query_lens[{b}]={q} and seq_lens[{b}]={s}; the "
                "context length includes the new tokens, so 0 <= query_lens <= seq_lens"
            )


def _check_slots_of_padding(query_lens: Sequence[int], slots: torch.Tensor) -> None:
    total = sum(query_lens)
    if slots.shape[0] < total:
        raise ValueError(
            f"AttentionMetadata.query_start_loc[-1]={total} query rows, but slot_mapping has "
            f"only {slots.shape[0]}"
        )
    padding = slots[total:]
    if padding.numel() and bool((padding >= 0).any()):
        row = total + int((padding >= 0).nonzero()[0, 0])
        raise ValueError(
            f"slot_mapping[{row}] = {int(slots[row])}, but row {row} is padding (past the "
            f"{total} query tokens); padding rows must have a negative slot"
        )


def _check_against_cache(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    table: torch.Tensor,
    slots: torch.Tensor,
    num_blocks: int,
    block_size: int,
) -> None:
    """Blocks and slots in range, and each new token's slot where the table puts it.

    A small step (decoding, the common case) is checked on Python lists, a large one
    with tensor ops: the same checks in the same order, so the same first error.
    """
    import torch

    width = int(table.shape[1]) if table.dim() == 2 else 0
    for b, seq_len in enumerate(seq_lens):
        if -(-seq_len // block_size) > width:
            raise ValueError(
                f"sequence {b} needs {-(-seq_len // block_size)} blocks of {block_size} for "
                f"seq_lens[{b}]={seq_len}, but block_table has {width} columns"
            )
    if not seq_lens:
        return
    if len(seq_lens) * width + slots.numel() <= _LISTED_CHECK_LIMIT:
        _check_listed(query_lens, seq_lens, table, slots, num_blocks, block_size)
        return
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    needed = (lens + block_size - 1) // block_size
    used = torch.arange(width).unsqueeze(0) < needed.unsqueeze(1)
    table = table.to(torch.int64)
    bad = used & ((table < 0) | (table >= num_blocks))
    if bool(bad.any()):
        b, column = (int(i) for i in bad.nonzero()[0].tolist())
        raise _block_out_of_range(b, column, int(table[b, column]), num_blocks)
    num_slots = num_blocks * block_size
    if slots.numel() and int(slots.max()) >= num_slots:
        raise _slot_out_of_range(int(slots.max()), num_blocks, block_size)
    # each new token's slot is where its position lives in its sequence's blocks
    q = torch.tensor(query_lens, dtype=torch.int64)
    total = int(q.sum())
    if total == 0:
        return
    seq_of_row = torch.repeat_interleave(torch.arange(len(seq_lens)), q)
    first = torch.cumsum(q, 0) - q
    position = lens[seq_of_row] - q[seq_of_row] + (torch.arange(total) - first[seq_of_row])
    expected = table[seq_of_row, position // block_size] * block_size + position % block_size
    given = slots[:total]
    wrong = (given >= 0) & (given != expected)
    if bool(wrong.any()):
        row = int(wrong.nonzero()[0, 0])
        raise _slot_elsewhere(
            row, int(given[row]), int(position[row]), int(seq_of_row[row]), int(expected[row])
        )


_LISTED_CHECK_LIMIT = 4096
"""Table cells and slots up to which a step's values are checked on Python lists
(about 30 us for 16 decoding sequences, against about 150 us of small tensor ops)."""


def _check_listed(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    table: torch.Tensor,
    slots: torch.Tensor,
    num_blocks: int,
    block_size: int,
) -> None:
    """:func:`_check_against_cache` of a small step, on Python lists."""
    rows = table.tolist()
    for b, seq_len in enumerate(seq_lens):
        row = rows[b]
        for column in range(-(-seq_len // block_size)):
            if not 0 <= row[column] < num_blocks:
                raise _block_out_of_range(b, column, row[column], num_blocks)
    given = slots.tolist()
    if given and max(given) >= num_blocks * block_size:
        raise _slot_out_of_range(max(given), num_blocks, block_size)
    r = 0
    for b, (q, seq_len) in enumerate(zip(query_lens, seq_lens)):
        row = rows[b]
        for position in range(seq_len - q, seq_len):
            slot = given[r]
            expected = row[position // block_size] * block_size + position % block_size
            if slot >= 0 and slot != expected:
                raise _slot_elsewhere(r, slot, position, b, expected)
            r += 1


def _block_out_of_range(b: int, column: int, block: int, num_blocks: int) -> ValueError:
    return ValueError(
        f"block_table[{b}, {column}] = {block}, but the cache has {num_blocks} blocks "
        f"(0 to {num_blocks - 1})"
    )


def _slot_out_of_range(slot: int, num_blocks: int, block_size: int) -> ValueError:
    return ValueError(
        f"slot_mapping holds slot {slot}, but the cache has {num_blocks * block_size} slots "
        f"({num_blocks} blocks x {block_size}); a negative slot marks padding"
    )


def _slot_elsewhere(row: int, slot: int, position: int, b: int, expected: int) -> ValueError:
    return ValueError(
        f"slot_mapping[{row}] = {slot}, but row {row} is position {position} of sequence "
        f"{b}, which block_table puts at slot {expected}; attention would never read what "
        "is written there"
    )


# -- conversions -----------------------------------------------------------------------


def _int_list(values: Any, name: str) -> list[int]:
    import torch

    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.device.type != "cpu" or values.is_floating_point():
            raise ValueError(
                f"{name} must be a list of ints or a 1-D integer CPU tensor; got a "
                f"{str(values.dtype).removeprefix('torch.')} tensor of shape "
                f"{list(values.shape)} on {values.device}"
            )
        values = values.tolist()
    if type(values) is list and all(type(v) is int and 0 <= v < _MAX_LEN for v in values):
        return list(values)  # the usual case, checked without the ABCs
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a list of ints; got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= int(v) < _MAX_LEN:
            raise ValueError(f"{name}[{i}] must be an int from 0 to 2**40; got {v!r}")
        out.append(int(v))
    return out


def _table(block_table: Any, num_seqs: int) -> torch.Tensor:
    """The block table as an int64 CPU tensor ``[num_seqs, width]`` (width at least 1)."""
    import torch

    if isinstance(block_table, torch.Tensor):
        if block_table.dim() != 2 or block_table.device.type != "cpu":
            raise ValueError(
                f"block_table must be [num_seqs, max_blocks] on the CPU; got shape "
                f"{list(block_table.shape)} on {block_table.device}"
            )
        if block_table.is_floating_point():
            raise ValueError(f"block_table must hold integers; got {block_table.dtype}")
        table = block_table.to(torch.int64, copy=True)
    else:
        if isinstance(block_table, (str, bytes)) or not isinstance(block_table, Sequence):
            raise ValueError(
                f"block_table must be a list of lists of block ids; got "
                f"{type(block_table).__name__}"
            )
        rows = [_block_row(row, b) for b, row in enumerate(block_table)]
        width = max([1, *(len(row) for row in rows)])
        # one tensor from padded lists: a copy per row costs more than the rows
        padded = [row + [0] * (width - len(row)) for row in rows]
        table = torch.tensor(padded, dtype=torch.int64).reshape(len(rows), width)
    if table.shape[0] != num_seqs:
        raise ValueError(
            f"block_table must have one row per sequence ({num_seqs}); got {table.shape[0]}"
        )
    if table.shape[1] == 0:
        table = torch.zeros((num_seqs, 1), dtype=torch.int64)
    if table.numel() and (int(table.max()) >= 2**31 or int(table.min()) < -(2**31)):
        raise ValueError("block_table holds a block id beyond int32")
    return table


def _block_row(row: Any, b: int) -> list[int]:
    if type(row) is list and all(type(v) is int for v in row):
        return list(row)  # the usual case, checked without the ABCs
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
        raise ValueError(f"block_table[{b}] must be a list of block ids; got {type(row).__name__}")
    if all(type(v) is int for v in row):
        return list(row)
    out = []
    for i, v in enumerate(row):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError(f"block_table[{b}][{i}] must be an int; got {v!r}")
        out.append(int(v))
    return out


def _slots(slot_mapping: Any) -> torch.Tensor:
    import torch

    if isinstance(slot_mapping, torch.Tensor):
        if slot_mapping.dim() != 1 or slot_mapping.device.type != "cpu":
            raise ValueError(
                f"slot_mapping must be [num_tokens] on the CPU; got shape "
                f"{list(slot_mapping.shape)} on {slot_mapping.device}"
            )
        if slot_mapping.is_floating_point():
            raise ValueError(f"slot_mapping must hold integers; got {slot_mapping.dtype}")
        return slot_mapping.to(torch.int64, copy=True)
    if type(slot_mapping) is list and all(
        type(v) is int and -(2**62) < v < 2**62 for v in slot_mapping
    ):  # the usual case, checked without the ABCs
        return torch.tensor(slot_mapping, dtype=torch.int64)
    if isinstance(slot_mapping, (str, bytes)) or not isinstance(slot_mapping, Sequence):
        raise ValueError(f"slot_mapping must be a list of ints; got {type(slot_mapping).__name__}")
    for i, v in enumerate(slot_mapping):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or abs(int(v)) >= 2**62:
            raise ValueError(f"slot_mapping[{i}] must be an int; got {v!r}")
    return torch.tensor(list(slot_mapping), dtype=torch.int64)


def _pins_host_memory(device: torch.device) -> bool:
    """Whether copies to ``device`` go through pinned host memory: the platform answers."""
    if device.type == "cpu":  # a host-to-host copy
        return False
    platform = platform_for_device(device.type)
    return platform is not None and platform.pins_host_memory


def _to_device(
    host: dict[str, torch.Tensor], device: torch.device, out: AttentionMetadata | None
) -> dict[str, torch.Tensor]:
    """One copy per tensor: into fresh device tensors, or into ``out``'s leading slices."""
    pin = _pins_host_memory(device)
    result = {}
    for name, tensor in host.items():
        if pin:
            tensor = tensor.pin_memory()
        if out is None:
            result[name] = tensor.to(device, non_blocking=pin)
            continue
        buffer = getattr(out, name)
        if buffer.device != device:
            raise ValueError(
                f"out.{name} is on {buffer.device}, but the metadata is built for {device}"
            )
        if tensor.dim() == 2:
            rows, cols = tensor.shape
            if rows > buffer.shape[0] or cols > buffer.shape[1]:
                raise ValueError(
                    f"out.{name} has shape {list(buffer.shape)}; the step needs "
                    f"{list(tensor.shape)}"
                )
            buffer[:rows, :cols].copy_(tensor, non_blocking=pin)
            # every column of the buffer (a captured graph was recorded with them all);
            # columns past a sequence's blocks are never read
            result[name] = buffer[:rows]
            continue
        else:
            if tensor.shape[0] > buffer.shape[0]:
                raise ValueError(
                    f"out.{name} has {buffer.shape[0]} entries; the step needs {tensor.shape[0]}"
                )
            view = buffer[: tensor.shape[0]]
        view.copy_(tensor, non_blocking=pin)
        result[name] = view
    return result


class PreparedStep:
    """What a backend's :meth:`AttentionBackend.prepare` derived from one step.

    Subclasses add the backend's own per-step structures. Every layer of the
    step passes it to ``forward``; it lives for one step (nothing is cached
    between steps).
    """

    metadata: AttentionMetadata
    """The step's metadata."""
    num_blocks: int
    """The number of blocks of the caches it was prepared for."""
    block_size: int
    """Their block size."""

    def __init__(self, metadata: AttentionMetadata, num_blocks: int, block_size: int) -> None:
        self.metadata = metadata
        self.num_blocks = num_blocks
        self.block_size = block_size


def metadata_of(step: object) -> AttentionMetadata:
    """The metadata of a prepared step (a :class:`PreparedStep`, or metadata itself)."""
    if isinstance(step, PreparedStep):
        return step.metadata
    return step  # type: ignore[return-value]
