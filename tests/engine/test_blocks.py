"""The block pool and the scheduler on their own (no model)."""

from __future__ import annotations

import pytest
from tiny_engine.blocks import BlockPool
from tiny_engine.scheduler import Scheduler, Sequence

from hwplug.core.kv_cache import hash_block_tokens, hash_function

SHA = hash_function("sha256")


def pool(blocks: int = 8, caching: bool = True) -> BlockPool:
    return BlockPool(blocks, 4, hash_fn=SHA if caching else None)


def scheduler(p: BlockPool, *, seqs: int = 8, tokens: int = 64, chunked: bool = True) -> Scheduler:
    return Scheduler(p, max_num_seqs=seqs, max_num_batched_tokens=tokens, chunked_prefill=chunked)


def test_hashes_chain_like_hwplug() -> None:
    p = pool()
    tokens = list(range(12))
    first = hash_block_tokens(SHA, None, tokens[:4])
    assert p.block_hashes(tokens, 3) == [
        first,
        second := hash_block_tokens(SHA, first, tokens[4:8]),
        hash_block_tokens(SHA, second, tokens[8:12]),
    ]


def test_freed_blocks_stay_cached_until_evicted_oldest_first() -> None:
    p = pool(blocks=4)
    a = p.allocate(2)
    assert a is not None
    p.register(a[0], b"h0")
    p.register(a[1], b"h1")
    p.release(a)  # the last block is freed first: it is evicted first
    assert p.cached_prefix([b"h0", b"h1"]) == a
    fresh = p.allocate(3)
    assert fresh is not None and a[1] in fresh and a[0] not in fresh
    assert p.cached_prefix([b"h0", b"h1"]) == [a[0]]
    p.take([a[0]])
    assert p.ref_counts[a[0]] == 1 and p.num_free == 0


def test_allocation_fails_without_enough_free_blocks() -> None:
    p = pool(blocks=2)
    assert p.allocate(3) is None
    assert p.num_free == 2


def run_to_end(s: Scheduler, seqs: list[Sequence], new_token: int = 7) -> int:
    """Drive the scheduler as the engine does; returns the number of steps."""
    steps = 0
    while s.has_work:
        step = s.schedule()
        steps += 1
        s.finish_step(step)
        for seq, n in zip(step.seqs, step.num_new):
            if seq.num_computed == len(seq.tokens):
                seq.tokens.append(new_token)
                if seq.num_generated >= seq.max_tokens:
                    s.finish(seq)
        assert steps < 1000
    return steps


def test_prompt_chunks_respect_the_token_budget() -> None:
    s = scheduler(pool(blocks=32), tokens=8)
    seq = Sequence(0, list(range(20)), 20, max_tokens=1)
    s.add(seq)
    counts = []
    while s.has_work:
        step = s.schedule()
        counts.append(step.num_tokens)
        s.finish_step(step)
        if seq.num_computed == len(seq.tokens):
            seq.tokens.append(1)
            s.finish(seq)
    assert counts == [8, 8, 4]


def test_without_chunking_a_prompt_waits_for_a_budget_that_holds_it() -> None:
    s = scheduler(pool(blocks=32), tokens=24, chunked=False)
    first, second = Sequence(0, [1] * 20, 20, 2), Sequence(1, [2] * 10, 10, 2)
    s.add(first)
    s.add(second)
    step = s.schedule()
    assert step.seqs == [first] and step.num_new == [20]


def test_blocks_grow_with_the_tokens_not_with_max_tokens() -> None:
    p = pool(blocks=32)
    s = scheduler(p)
    seq = Sequence(0, [1] * 5, 5, max_tokens=100)
    s.add(seq)
    s.finish_step(s.schedule())
    assert len(seq.blocks) == 2  # 5 tokens in blocks of 4


def test_latest_admitted_sequence_is_preempted_first() -> None:
    p = pool(blocks=4, caching=False)
    s = scheduler(p)
    early, late = Sequence(0, [1] * 8, 8, 8), Sequence(1, [2] * 7, 7, 8)
    s.add(early)
    s.add(late)
    step = s.schedule()
    assert step.seqs == [early, late]
    s.finish_step(step)
    for seq in (early, late):
        seq.tokens.append(3)
    # early needs a third block, none is free: late goes back to the queue.
    step = s.schedule()
    assert step.seqs == [early] and step.preempted == 1
    assert s.waiting[0] is late and late.blocks == [] and late.num_computed == 0
    assert s.preemptions == 1


def test_preempted_sequences_finish_with_all_their_tokens() -> None:
    p = pool(blocks=6)
    s = scheduler(p, seqs=4)
    seqs = [Sequence(i, [i + 1] * (5 + i), 5 + i, max_tokens=10) for i in range(4)]
    for seq in seqs:
        s.add(seq)
    run_to_end(s, seqs)
    assert s.preemptions > 0
    assert all(seq.num_generated == 10 for seq in seqs)
    assert p.num_free == 6


def test_a_sequence_larger_than_the_pool_is_an_error() -> None:
    s = scheduler(pool(blocks=2))
    s.add(Sequence(0, [1] * 12, 12, 1))
    with pytest.raises(
        RuntimeError,
        match="cannot start a sequence of 12 tokens: its next step needs 3 blocks of 4 tokens and 2 of the cache.s 2 are free",
    ):
        s.schedule()


def test_prefix_hits_count_blocks_and_leave_the_last_token_to_compute() -> None:
    p = pool(blocks=16)
    s = scheduler(p)
    prompt = list(range(8))  # exactly two blocks
    first = Sequence(0, list(prompt), 8, 1)
    s.add(first)
    run_to_end(s, [first])
    again = Sequence(1, list(prompt), 8, 1)
    s.add(again)
    step = s.schedule()
    # Only the first block is taken: the second holds the last token, which is recomputed.
    assert p.hits == 1 and step.num_new == [4] and again.num_computed == 4
