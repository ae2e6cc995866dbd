"""The KV-cache block pool, with prefix caching.

Blocks are numbered ``0 .. num_blocks - 1`` and shared by reference count. A
block whose ``block_size`` tokens have all been written gets a hash chained to
the hash of the block before it (:func:`hwplug.core.kv_cache.hash_block_tokens`
with ``cache.prefix_caching_hash_algo``) and enters the prefix index. A block
no sequence holds goes to the back of the free queue but keeps its hash: a
later sequence with the same prefix takes it back (a prefix-cache hit) until it
is reused for other tokens, least recently freed first. The pool and its index
live as long as the engine, so finished prompts speed up later ones.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

from hwplug.core.kv_cache import hash_block_tokens

__all__ = ["BlockPool"]


class BlockPool:
    """Reference-counted KV blocks, a least-recently-freed queue and the prefix index."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hash_fn: Callable[[Any], bytes] | None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_fn = hash_fn
        """The block hash function, or None when prefix caching is off."""
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(
            range(num_blocks)
        )
        self.index: dict[bytes, int] = {}
        self.hits = 0
        """Blocks taken from the prefix index instead of being computed (the scheduler
        counts them when the sequence is admitted)."""

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (some may still serve as prefix cache)."""
        return len(self.free)

    def block_hashes(self, tokens: Sequence[int], count: int) -> list[bytes]:
        """The chained hashes of the first ``count`` full blocks of ``tokens``."""
        assert self.hash_fn is not None
        hashes: list[bytes] = []
        parent: bytes | None = None
        size = self.block_size
        for i in range(count):
            parent = hash_block_tokens(self.hash_fn, parent, tokens[i * size : (i + 1) * size])
            hashes.append(parent)
        return hashes

    def cached_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks of the longest run of ``hashes`` found in the prefix index."""
        found: list[int] = []
        for h in hashes:
            block = self.index.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def take(self, blocks: Sequence[int]) -> None:
        """Hold cached ``blocks`` for one more sequence (prefix-cache hits)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free[block]
            self.ref_counts[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks (evicting cached ones, oldest first), or None if too few."""
        if count > len(self.free):
            return None
        blocks = []
        for _ in range(count):
            block, _ = self.free.popitem(last=False)
            old = self.block_hash[block]
            if old is not None:
                if self.index.get(old) == block:
                    del self.index[old]
                self.block_hash[block] = None
            self.ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one sequence's hold on ``blocks``; last blocks are evicted first."""
        for block in reversed(blocks):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free[block] = None

    def reset_prefix_cache(self) -> int:
        """Drop the prefix index (blocks held by sequences keep their contents);
        returns how many blocks it held."""
        dropped = len(self.index)
        self.index.clear()
        self.block_hash = [None] * self.num_blocks
        return dropped

    def register(self, block: int, block_hash: bytes) -> None:
        """Enter a full block into the prefix index (the first block with a hash keeps it)."""
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        self.index.setdefault(block_hash, block)
