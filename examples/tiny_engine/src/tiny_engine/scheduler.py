"""Continuous batching: which sequences run in the next step, and how many tokens each.

Each step the scheduler first serves the running sequences in admission order
(one token each when decoding, the next chunk of a prompt otherwise), then
admits waiting ones while ``scheduler.max_num_seqs`` and the step's budget of
``scheduler.max_num_batched_tokens`` allow. A prompt that does not fit the
remaining budget is cut into chunks when chunked prefill is on, and waits
otherwise. KV blocks are allocated only for the tokens a step computes. When
the pool runs dry, the most recently admitted running sequence is preempted:
its blocks are released and it waits at the head of the queue to be
recomputed (its prompt plus what it generated so far), often mostly from the
prefix cache.
"""

from __future__ import annotations

import collections
import dataclasses
import math

from hwplug.core.kv_cache import hash_block_tokens
from tiny_engine.blocks import BlockPool

__all__ = ["Scheduler", "Sequence", "Step"]


@dataclasses.dataclass(eq=False)
class Sequence:
    """One request: its tokens (prompt, then output), its blocks and its progress."""

    index: int
    """Position of the prompt in the ``generate`` call."""
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    generator: object = None
    """The sequence's own ``torch.Generator`` when sampling with a seed."""
    blocks: list[int] = dataclasses.field(default_factory=list)
    num_computed: int = 0
    """Tokens whose keys and values are in the cache."""
    hashes: list[bytes] = dataclasses.field(default_factory=list)
    """Chained hashes of the leading full blocks computed so far (prefix caching)."""
    finished: bool = False

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclasses.dataclass
class Step:
    """One scheduled step: sequences with their new-token counts, in batch order."""

    seqs: list[Sequence]
    num_new: list[int]
    preempted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new)

    @property
    def is_uniform_decode(self) -> bool:
        """Every sequence computes exactly one token (a pure decode batch)."""
        return all(n == 1 for n in self.num_new)


class Scheduler:
    """Admission, chunking, block allocation and preemption for one engine.

    ``max_model_len`` bounds each sequence's length (prompt and output).
    """

    def __init__(
        self,
        pool: BlockPool,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        chunked_prefill: bool,
    ) -> None:
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- blocks -------------------------------------------------------------------
    def _grow(self, seq: Sequence, total_tokens: int) -> bool:
        """Give ``seq`` blocks for ``total_tokens`` tokens; False when the pool is too small."""
        need = math.ceil(total_tokens / self.pool.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is None:
            return False
        seq.blocks.extend(blocks)
        return True

    def _admit_from_cache(self, seq: Sequence) -> int:
        """Take the cached prefix blocks of a sequence about to be admitted; returns how many.

        At least the last token is always computed, for its logits.
        """
        if self.pool.hash_fn is None:
            return 0
        full = (len(seq.tokens) - 1) // self.pool.block_size
        if full == 0:
            return 0
        if len(seq.hashes) < full:
            seq.hashes = self.pool.block_hashes(seq.tokens, full)
        cached = self.pool.cached_prefix(seq.hashes[:full])
        if cached:
            self.pool.take(cached)
            seq.blocks = list(cached)
            seq.num_computed = len(cached) * self.pool.block_size
        return len(cached)

    def _release(self, seq: Sequence) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0

    def _preempt_latest(self) -> Sequence:
        victim = self.running.pop()
        self._release(victim)
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    # -- one step -------------------------------------------------------------------
    def schedule(self) -> Step:
        """The next step's batch (empty when there is nothing to run).

        :raises RuntimeError: nothing runs and the next waiting sequence cannot
            start: the KV cache or the step's token budget is too small for it
            (the message names which). A step never comes back empty without
            a preemption, so a caller's loop always progresses.
        """
        budget = self.max_num_batched_tokens
        seqs: list[Sequence] = []
        counts: list[int] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(len(seq.tokens) - seq.num_computed, budget)
            while not self._grow(seq, seq.num_computed + num_new):
                victim = self._preempt_latest()
                preempted += 1
                if victim is seq:
                    break
            else:
                seqs.append(seq)
                counts.append(num_new)
                budget -= num_new
                i += 1
                continue
            break  # seq itself was preempted: it was the last running one
        if not preempted:
            while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
                seq = self.waiting[0]
                hits = self._admit_from_cache(seq)
                remaining = len(seq.tokens) - seq.num_computed
                num_new = min(remaining, budget)
                if (remaining > budget and not self.chunked_prefill) or not self._grow(
                    seq, seq.num_computed + num_new
                ):
                    self._release(seq)  # hold nothing while waiting
                    if not self.running:
                        raise self._stuck(seq, remaining, budget)
                    break
                self.pool.hits += hits
                self.waiting.popleft()
                self.running.append(seq)
                seqs.append(seq)
                counts.append(num_new)
                budget -= num_new
        return Step(seqs, counts, preempted)

    def _stuck(self, seq: Sequence, remaining: int, budget: int) -> RuntimeError:
        """The error for a waiting sequence that cannot start with nothing running."""
        if remaining > budget and not self.chunked_prefill:
            return RuntimeError(
                f"a sequence of {len(seq.tokens)} tokens cannot be scheduled: "
                f"scheduler.max_num_batched_tokens={self.max_num_batched_tokens} is smaller "
                "than its prompt and chunked prefill is off; raise "
                "scheduler.max_num_batched_tokens or set scheduler.enable_chunked_prefill=true"
            )
        size = self.pool.block_size
        chunk = min(remaining, budget)
        need = math.ceil((seq.num_computed + chunk) / size)
        return RuntimeError(
            f"the KV cache cannot start a sequence of {len(seq.tokens)} tokens: its next "
            f"step needs {need} blocks of {size} tokens and {self.pool.num_free} of the "
            f"cache's {self.pool.num_blocks} are free; raise the KV-cache budget "
            "(cache.num_gpu_blocks_override, cache.kv_cache_memory_bytes) or lower "
            "model.max_model_len"
        )

    def abort(self) -> None:
        """Drop every sequence, giving back the blocks they hold (a failed call)."""
        for seq in [*self.running, *self.waiting]:
            self._release(seq)
        self.running.clear()
        self.waiting.clear()

    def finish_step(self, step: Step) -> None:
        """Record the computed tokens and index the blocks that became full."""
        size = self.pool.block_size
        for seq, num_new in zip(step.seqs, step.num_new):
            seq.num_computed += num_new
            if self.pool.hash_fn is None:
                continue
            full = seq.num_computed // size
            parent = seq.hashes[-1] if seq.hashes else None
            for j in range(len(seq.hashes), full):
                parent = hash_block_tokens(
                    self.pool.hash_fn, parent, seq.tokens[j * size : (j + 1) * size]
                )
                seq.hashes.append(parent)
            for j in range((seq.num_computed - num_new) // size, full):
                self.pool.register(seq.blocks[j], seq.hashes[j])

    def finish(self, seq: Sequence) -> None:
        """Retire a finished sequence; its full blocks stay in the prefix index."""
        seq.finished = True
        self.running.remove(seq)
        self._release(seq)
