"""AttentionMetadata: building from lengths, and the checks of shapes and values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.attention import AttentionMetadata


def test_from_lengths_builds_the_spec_layout() -> None:
    meta = AttentionMetadata.from_lengths(
        seq_lens=[5, 2, 9],
        query_lens=[5, 1, 3],
        block_table=[[3, 0], [4], [1, 2, 5]],
        block_size=4,
        num_tokens=11,
    )
    assert meta.query_start_loc.tolist() == [0, 5, 6, 9]
    assert meta.query_start_loc.dtype == torch.int32
    assert meta.seq_lens.tolist() == [5, 2, 9]
    assert meta.block_table.tolist() == [[3, 0, 0], [4, 0, 0], [1, 2, 5]]
    assert meta.block_table.dtype == torch.int32
    # sequence 0: positions 0-4 -> block 3 offsets 0-3, block 0 offset 0
    # sequence 1: position 1 -> block 4 offset 1; sequence 2: positions 6-8 -> block 2, 5
    assert meta.slot_mapping.tolist() == [12, 13, 14, 15, 0, 17, 10, 11, 20, -1, -1]
    assert meta.slot_mapping.dtype == torch.int64
    assert (meta.num_seqs, meta.num_tokens) == (3, 11)
    meta.check(num_tokens=11)
    meta.check_values(num_blocks=6, block_size=4)


def test_from_lengths_accepts_a_tensor_block_table() -> None:
    table = torch.tensor([[2, 1]], dtype=torch.int32)
    meta = AttentionMetadata.from_lengths([3], [1], table, block_size=2)
    assert meta.slot_mapping.tolist() == [1 * 2 + 0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([3], [4], [[0, 1]], 2), r"query_lens\[0\]=4 must be between 0 and seq_lens\[0\]=3"),
        (([9], [1], [[0, 1]], 4), r"seq_lens\[0\]=9 needs 3 blocks of 4; block_table\[0\] has 2"),
        (([3, 1], [1], [[0]], 4), "need one entry per sequence; got 2, 1 and 1"),
        (([3], [1], [[0]], 0), "block_size must be a positive integer; got 0"),
    ],
)
def test_from_lengths_rejects_inconsistent_lengths(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttentionMetadata.from_lengths(*args)


def test_from_lengths_rejects_too_few_rows() -> None:
    with pytest.raises(ValueError, match="num_tokens=1 is smaller than the 2 query tokens"):
        AttentionMetadata.from_lengths([2], [2], [[0]], 4, num_tokens=1)


def test_check_values_reports_bad_query_start_loc() -> None:
    meta = AttentionMetadata.from_lengths([4, 4], [2, 2], [[0], [1]], 4)
    bad = AttentionMetadata(
        torch.tensor([1, 2, 4], dtype=torch.int32),
        meta.seq_lens,
        meta.block_table,
        meta.slot_mapping,
    )
    with pytest.raises(ValueError, match="query_start_loc must start at 0; got 1"):
        bad.check_values(2, 4)
    bad = AttentionMetadata(
        torch.tensor([0, 3, 2], dtype=torch.int32),
        meta.seq_lens,
        meta.block_table,
        meta.slot_mapping,
    )
    with pytest.raises(ValueError, match="must not decrease; sequence 1 has 3 -> 2"):
        bad.check_values(2, 4)
    bad = AttentionMetadata(
        torch.tensor([0, 2, 9], dtype=torch.int32),
        meta.seq_lens,
        meta.block_table,
        meta.slot_mapping,
    )
    with pytest.raises(ValueError, match=r"query_start_loc\[-1\]=9 query rows, but slot_mapping"):
        bad.check_values(2, 4)


def test_check_values_wants_enough_block_table_columns() -> None:
    meta = AttentionMetadata.from_lengths([4], [1], [[0]], 4)
    longer = AttentionMetadata(
        meta.query_start_loc,
        torch.tensor([5], dtype=torch.int32),
        meta.block_table,
        meta.slot_mapping,
    )
    with pytest.raises(ValueError, match="sequence 0 needs 2 blocks of 4 .* has 1 columns"):
        longer.check_values(4, 4)


def test_unused_block_table_entries_may_hold_anything() -> None:
    meta = AttentionMetadata.from_lengths([3], [1], [[1, -1, 10**6]], 4)
    meta.check_values(num_blocks=2, block_size=4)


def test_to_moves_every_tensor() -> None:
    meta = AttentionMetadata.from_lengths([3], [1], [[1]], 4).to("meta")
    tensors = (meta.query_start_loc, meta.seq_lens, meta.block_table, meta.slot_mapping)
    assert {t.device.type for t in tensors} == {"meta"}
    assert meta.query_lens == [1] and meta.seq_lens_cpu == [3]  # host values stay


# -- small and large steps are checked alike -----------------------------------------------


def _step_values(
    lens: list[tuple[int, int]], block_size: int, first_block: int
) -> tuple[list[int], list[int], list[list[int]], list[int]]:
    """Query lengths, context lengths, tables and slots of sequences whose blocks are
    numbered from ``first_block`` on."""
    query_lens, seq_lens, tables, slots = [], [], [], []
    block = first_block
    for context, new in lens:
        length = context + new
        blocks = list(range(block, block + -(-length // block_size)))
        block += len(blocks)
        query_lens.append(new)
        seq_lens.append(length)
        tables.append(blocks)
        slots += [
            blocks[p // block_size] * block_size + p % block_size for p in range(context, length)
        ]
    return query_lens, seq_lens, tables, slots


def _first_error(
    query_lens: list[int],
    seq_lens: list[int],
    tables: list[list[int]],
    slots: list[int],
    num_blocks: int,
    block_size: int,
) -> str | None:
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, slots, device="cpu")
    try:
        meta.check_values(num_blocks, block_size)
    except ValueError as error:
        return str(error)
    return None


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16]),
    fault=st.sampled_from(["none", "block", "slot past the cache", "slot elsewhere"]),
    where=st.integers(0, 10**6),
)
def test_a_small_step_and_the_same_step_in_a_large_batch_give_the_same_first_error(
    lens: list[tuple[int, int]], block_size: int, fault: str, where: int
) -> None:
    """Small steps are checked on Python lists, large ones with tensor ops: a fault in the
    first sequences is reported alike when a thousand more sequences follow them."""
    query_lens, seq_lens, tables, slots = _step_values(lens, block_size, 0)
    used = sum(len(t) for t in tables)
    extra = _step_values([(300, 1)] * 1000, block_size, used)
    num_blocks = used + sum(len(t) for t in extra[2])
    if fault == "block":
        b = where % len(tables)
        tables[b][where % len(tables[b])] = num_blocks + where % 3
    elif fault == "slot past the cache":
        slots[where % len(slots)] = num_blocks * block_size + where % 5
    elif fault == "slot elsewhere":
        row = where % len(slots)
        slots[row] = (slots[row] + 1 + where % 7) % (num_blocks * block_size)
    small = _first_error(query_lens, seq_lens, tables, slots, num_blocks, block_size)
    large = _first_error(
        query_lens + extra[0],
        seq_lens + extra[1],
        tables + extra[2],
        slots + extra[3],
        num_blocks,
        block_size,
    )
    assert small == large
    assert (small is None) == (fault == "none")
