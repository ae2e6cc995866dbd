"""The ``torch`` attention backend: paged attention in plain PyTorch, on any device.

Each step it writes the new keys and values with the reference write path of
:mod:`hwplug.kernels`, gathers each sequence's cache pages, dequantises fp8
pages (the key scale is folded into the queries and the value scale into the
output, so the gathered pages are only cast), and runs
``torch.nn.functional.scaled_dot_product_attention`` with causal and
sliding-window masks and grouped heads. All decoding sequences (one query
token each) run as one batched call; every other sequence runs on its own.
On a CPU, 16-bit models decode in float32 (converted while the pages are
gathered): CPU attention kernels are several times slower in 16 bits for one
query token. Their prefills attend in float32 too, except bfloat16 ones on a
CPU with bfloat16 dot products (AVX-512 BF16, AMX), where SDPA's bfloat16
kernel is about twice its float32 one. On a CPU, decoding sequences skip the gather: the C kernel of
:mod:`hwplug.kernels.cpu_decode` reads their pages where they lie (when it
cannot be built, or ``HWPLUG_NATIVE_KERNELS=0``, they are gathered as above).

What it derives from a step (the value checks, which rows are written, the
decode groups, gather indices and masks) is worked out once, from the
metadata's host values, by :meth:`TorchAttentionBackend.prepare`; every
layer's ``forward`` then reads nothing back from the device. The shapes of
its calls depend on the step's lengths (each gather is as long as its
longest sequence), so a captured device graph could not serve another step:
``graph_support = NEVER``.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from hwplug.attention.base import AttentionBackend, PreparedStep
from hwplug.core.graphs import AttentionGraphSupport

if TYPE_CHECKING:
    import torch

    from hwplug.attention.call import AttentionCall
    from hwplug.attention.metadata import AttentionMetadata

__all__ = ["TorchAttentionBackend", "TorchAttentionStep"]

_GATHER_BYTES = 2 << 20
"""Most bytes of gathered keys (and as many of values) one batched decode call holds."""


class TorchAttentionBackend(AttentionBackend):
    """Pure-PyTorch paged attention: every device, head size, dtype and cache dtype; not MLA."""

    name = "torch"
    graph_support = AttentionGraphSupport.NEVER

    @classmethod
    def prepare(
        cls, metadata: AttentionMetadata, *, num_blocks: int, block_size: int
    ) -> TorchAttentionStep:
        """Check the step's values and plan it (see :class:`TorchAttentionStep`)."""
        checked = super().prepare(metadata, num_blocks=num_blocks, block_size=block_size)
        step = TorchAttentionStep(checked, num_blocks, block_size)
        step.issue_ticket()
        return step

    def attend(self, call: AttentionCall) -> torch.Tensor:
        import torch

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels import reference

        query, key_cache, value_cache = call.query, call.key_cache, call.value_cache
        k_scale, v_scale = call.k_scale, call.v_scale
        plan = (
            call.step
            if isinstance(call.step, TorchAttentionStep)
            else type(self).prepare(
                call.metadata,
                num_blocks=int(key_cache.shape[0]),
                block_size=int(key_cache.shape[1]),
            )
        )
        route = plan.route(query, key_cache, value_cache)
        in_place, direct, fp8, compute = route.in_place, route.direct, route.fp8, route.compute
        # the native kernel stores the step's rows itself, in the same call, where it can
        # store them as they are (the cache's own dtype, rows contiguous)
        fused = route.stores_rows and call.key.is_contiguous() and call.value.is_contiguous()
        if not fused:
            reference.write_slots(plan.written(call.key), key_cache, plan.write_slots, k_scale)
            reference.write_slots(plan.written(call.value), value_cache, plan.write_slots, v_scale)

        # every row of the step's tokens is written below; padding rows past them are zero
        # (row-major whatever the query's strides: empty_like would keep a transposed
        # query's layout, and every path below writes rows)
        out = (
            call.out
            if call.out is not None
            else torch.empty(query.shape, dtype=query.dtype, device=query.device)
        )
        if plan.total < out.shape[0]:
            out[plan.total :].zero_()
        window = self.sliding_window
        # prefills attend in the model's bfloat16 where the CPU multiplies it natively
        prefill_dtype = route.prefill_dtype
        # the query in the decode dtype: for decoding rows the kernel does not take as they
        # are, and for prefills attending in that dtype
        queries = query
        if (plan.decode_lens and not direct) or (plan.prefills and prefill_dtype == compute):
            queries = query.to(compute)
            if fp8:
                # q . (k * k_scale) == (q * k_scale) . k: scale the few queries, not the keys
                queries = queries * _on(k_scale, queries)
        if in_place:
            # one query token per sequence: the C kernel follows the block table, no gather
            from hwplug.kernels import cpu_decode

            rows, table, lens = plan.native_decode()
            source = query if direct else queries
            # leading rows of the result's dtype are written in place; others are copied in
            if isinstance(rows, int):
                q = _leading(source, rows)
                target = _leading(out, rows) if out.dtype == q.dtype else None
            else:
                q, target = source.index_select(0, rows), None
            total = plan.total
            result = cpu_decode.run(
                q,
                key_cache,
                value_cache,
                table,
                lens,
                scale=self.scale,
                sliding_window=window,
                out=target,
                write=(_leading(call.key, total), _leading(call.value, total), plan.slots)
                if fused
                else None,
            )
            if not isinstance(rows, int):
                out.index_copy_(0, rows, result.to(out.dtype))
            elif target is None:
                out[:rows] = result
        if in_place and not plan.prefills:
            if fp8:
                out *= _on(v_scale, out)
            return out
        pages = _Pages(key_cache, value_cache, plan.block_size, compute)
        for group in [] if in_place else plan.decode_groups(pages.row_bytes):
            k, v = pages.gather(group.index, group.size, group.longest)
            mask = group.mask(window)
            if mask is not None:
                # Positions a sequence does not see (past its length: another
                # sequence's stale pages; before its window) hold anything, NaN
                # included, and SDPA's masked path would still add them in.
                hidden = ~mask.view(mask.shape[0], 1, -1, 1)
                k.masked_fill_(hidden, 0)
                v.masked_fill_(hidden, 0)
            # One query token per sequence: the query heads sharing a key/value head
            # attend as that head's rows ([n, kv_heads, group, head_size]), no repeats.
            q = queries.index_select(0, group.rows)
            q = q.view(q.shape[0], self.num_kv_heads, -1, q.shape[-1])
            result = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scale
            )
            out.index_copy_(0, group.rows, result.flatten(1, 2).to(out.dtype))
        prefill_pages, prefill_queries = pages, queries
        if prefill_dtype != compute:  # the model's own bfloat16: nothing converted
            prefill_pages = _Pages(key_cache, value_cache, plan.block_size, prefill_dtype)
            prefill_queries = query
        for chunk in plan.prefills:
            k, v = prefill_pages.gather(chunk.index, 1, chunk.seq_len)
            q = prefill_queries[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0)
            mask = chunk.mask(window)
            result = torch.nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=mask is None,
                scale=self.scale,
                enable_gqa=k.shape[1] != q.shape[1],
            )
            out[chunk.start : chunk.end] = result.squeeze(0).transpose(0, 1)
        if fp8:
            out *= _on(v_scale, out)
        if plan.prefills or not in_place:
            # SDPA's unmasked kernels give 0 for a NaN query row, its masked path NaN:
            # every batch shape gives NaN, as the attention it computes does (the native
            # kernel's rows already are).
            out.masked_fill_(query.isnan().any(dim=-1, keepdim=True), math.nan)
        return out


def _native_query_dtypes() -> frozenset[torch.dtype]:
    """The query dtypes the native decode kernel takes as they are."""
    # lazy: torch; `import hwplug` (which lists the backends) stays light
    from hwplug.kernels import cpu_decode

    return cpu_decode.NATIVE_QUERY_DTYPES


def _reads_pages_in_place(
    query: torch.Tensor, key_cache: torch.Tensor, plan: TorchAttentionStep
) -> bool:
    """Whether decode attention runs on the native CPU kernel, which reads the pages where
    they lie, instead of gathering them: CPU tensors (attention computed in float32), a
    cache dtype and block size it reads, and the kernel built (see
    :mod:`hwplug.kernels.cpu_decode`)."""
    import torch

    # lazy: torch; `import hwplug` (which lists the backends) stays light
    from hwplug.kernels import cpu_decode, native

    return (
        query.device.type == "cpu"
        and _compute_dtype(query) == torch.float32
        and key_cache.dtype in cpu_decode.NATIVE_CACHE_DTYPES
        and plan.block_size <= cpu_decode.NATIVE_MAX_BLOCK_SIZE
        and native.runs(cpu_decode.loaded)
    )


def _leading(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of ``tensor``: the tensor itself where it has no more (a
    view costs about a microsecond, and a step's layers take these several times)."""
    return tensor if rows == tensor.shape[0] else tensor[:rows]


def _compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype decode attention runs in: float32 for 16-bit queries on a CPU, whose
    16-bit attention kernels are several times slower for one query token (the pages are
    converted while they are gathered anyway); the query's own dtype elsewhere."""
    import torch

    if query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return query.dtype


def _prefill_dtype(
    query: torch.Tensor, key_cache: torch.Tensor, compute: torch.dtype
) -> torch.dtype:
    """The dtype prefills attend in: bfloat16 for a bfloat16 query and cache on a CPU with
    native bfloat16 dot products (AVX-512 BF16 or AMX), where SDPA's bfloat16 flash kernel
    is 1.7-2.3x its float32 one on prompts of 64-512 tokens (3-4x a float32 pass with its
    conversions; docs/decisions.md); ``compute`` (the decode dtype) elsewhere."""
    import torch

    if (
        query.device.type == "cpu"
        and query.dtype == torch.bfloat16
        and key_cache.dtype == torch.bfloat16
        and _native_bfloat16_cpu()
    ):
        return torch.bfloat16
    return compute


@functools.cache
def _native_bfloat16_cpu() -> bool:
    """Whether this CPU has bfloat16 dot products (AVX-512 BF16 or AMX-BF16), as torch
    sees it (its private probes; False where this torch has none)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


class TorchAttentionStep(PreparedStep):
    """The torch backend's plan of one step, made once by ``prepare`` from host values.

    It holds, as device tensors built from the step's host values: which rows
    are written and to which slots, each prefill's gather index, and, on first
    use, the decoding sequences (one query token each) with their query rows,
    lengths and block-table rows: in batch order for the native CPU kernel
    (:meth:`native_decode`), sorted by length for the gather path
    (:meth:`sorted_decodes`). Every layer of the step attends from it without
    reading anything back from the device. Decode groups (sequences gathered
    in one batched call) are slices of the sorted decode sequences, made on
    first use per row size; masks are made on first use per sliding window.
    It lives for one step: nothing is kept between steps.
    """

    def __init__(self, metadata: AttentionMetadata, num_blocks: int, block_size: int) -> None:

        super().__init__(metadata, num_blocks, block_size)
        query_lens, seq_lens, _, slots = metadata.host_values()
        device = metadata.device
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        total = starts[-1]
        self.total = total
        """The rows of the step's tokens (rows past them are padding)."""
        self.seq_lens = list(seq_lens)
        self._starts = starts
        self._decoding = [b for b, q in enumerate(query_lens) if q == 1]
        """The decoding sequences (one query token each), in batch order."""
        self.decode_lens = sorted(seq_lens[b] for b in self._decoding)
        """Their lengths, shortest first (the order of the gather path's decode groups)."""
        self._native: tuple[torch.Tensor | int, torch.Tensor, torch.Tensor] | None = None
        self._sorted: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._routes: dict[tuple[object, ...], _Route] = {}
        self.slots = metadata.slot_mapping[:total].contiguous()
        """Every token's slot (negative: padding, not written)."""

        # rows whose key and value are written: the first `total`, but a negative slot
        real = slots[:total] >= 0
        if bool(real.all()):
            self._write_rows: torch.Tensor | int = total
            self.write_slots = metadata.slot_mapping[:total]
        else:
            rows = real.nonzero().flatten()
            self._write_rows = rows.to(device)
            self.write_slots = slots[rows].to(device)

        self._groups: dict[int, list[_DecodeGroup]] = {}
        self.prefills = [
            _Prefill(self, b, starts[b], starts[b + 1], seq_lens[b])
            for b in range(len(seq_lens))
            if starts[b + 1] - starts[b] > 1
        ]

    def route(
        self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
    ) -> _Route:
        """How this step's layers with this query and these caches attend (worked out for
        the first such layer, then reused by the rest)."""
        key = (query.dtype, query.device, key_cache.dtype, key_cache.stride(), value_cache.stride())
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _Route(self, query, key_cache, value_cache)
        return route

    def native_decode(self) -> tuple[torch.Tensor | int, torch.Tensor, torch.Tensor]:
        """The decoding sequences for the native CPU kernel, in batch order: their query rows
        (an int ``n`` when they are rows ``0..n-1``), block-table rows and lengths (int64)."""

        if self._native is None:
            self._native = self._decode_tensors()
        return self._native

    def _decode_tensors(self) -> tuple[torch.Tensor | int, torch.Tensor, torch.Tensor]:
        """:meth:`native_decode`'s tensors, made now from the block table as it is."""
        import torch

        decoding = self._decoding
        device = self.metadata.device
        table = self.metadata.block_table
        rows: torch.Tensor | int
        if decoding == list(range(len(decoding))):
            rows, table = len(decoding), table[: len(decoding)]
        else:
            rows = torch.tensor([self._starts[b] for b in decoding], device=device)
            table = table.index_select(0, torch.tensor(decoding, device=device))
        lens = torch.tensor([self.seq_lens[b] for b in decoding], device=device)
        # columns past a sequence's own blocks are never read (prepare checked the rest)
        return rows, table.to(torch.int64), lens

    def issue_ticket(self) -> bool:
        """Issue this step's ticket to the attention ops' C++ door where it is open (a
        CPU op call in this process loaded it) and this is a pure decode step: every
        sequence with a token decodes one, from the first query rows, so the door
        attends each layer from :meth:`native_decode` as :meth:`TorchAttentionBackend.
        attend` does; whether it was issued. The ticket serves only while this step is
        the current one (:func:`~hwplug.attention.forward_context`) and is revoked when
        the step is freed."""
        import torch

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels import op_door

        door = op_door.bound_attention_door()
        decoding = len(self._decoding)
        if door is None or self.prefills or decoding == 0 or self.total != decoding:
            return False
        metadata = self.metadata
        if metadata.device.type != "cpu":
            return False
        # the table as it is now, which the door copies into the ticket (it compares the
        # step's block table with its copy at each call, and hands the call over where they
        # differ: the Python op reads the table at the step's first layer, so a table
        # changed after prepare is followed or refused there, never ignored)
        rows, table, lens = self._decode_tensors()
        slots = self.slots
        if not (
            isinstance(rows, int)
            and table.is_contiguous()
            and slots.dtype == torch.int64
            and slots.is_contiguous()
        ):
            return False
        tensors = (
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_table,
            metadata.slot_mapping,
        )
        return door.issue(
            self,
            tensors,
            table,
            lens,
            slots,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
        )

    def sorted_decodes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoding sequences for the gather path, shortest first: their query rows,
        lengths and block-table rows (int64, as many columns as the longest needs, every
        entry within the cache). Made on first use: a step the native kernel serves never
        needs them."""
        import torch

        if self._sorted is None:
            order = sorted(self._decoding, key=lambda b: self.seq_lens[b])
            device = self.metadata.device
            rows = torch.tensor([self._starts[b] for b in order], device=device)
            lens = torch.tensor(self.decode_lens, device=device)
            blocks = -(-self.decode_lens[-1] // self.block_size)
            table = self.metadata.block_table.index_select(0, torch.tensor(order, device=device))
            # entries past a sequence's own blocks may hold anything: keep them in range
            self._sorted = (rows, lens, table[:, :blocks].clamp(0, self.num_blocks - 1).long())
        return self._sorted

    def written(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows of ``rows`` (key or value) that are written to the cache, in slot order."""
        if isinstance(self._write_rows, int):
            return rows[: self._write_rows]
        return rows.index_select(0, self._write_rows)

    def table_index(self, b: int, length: int) -> torch.Tensor:
        """The flat cache-block index of positions ``0..length-1`` of sequence ``b``."""
        blocks = -(-length // self.block_size)
        row = self.metadata.block_table[b, :blocks]
        return row.clamp(0, self.num_blocks - 1).long()

    def decode_groups(self, row_bytes: int) -> list[_DecodeGroup]:
        """The decoding sequences in groups of similar length (shortest first).

        Each group's gathered pages stay under ``_GATHER_BYTES`` (of keys, as
        many of values) for positions of ``row_bytes``: that bounds the memory
        a large batch takes, and small buffers are reused instead of being
        mapped (and faulted in) afresh.
        """
        groups = self._groups.get(row_bytes)
        if groups is not None:
            return groups
        groups = []
        lo = 0
        for hi, length in enumerate(self.decode_lens):
            padded = -(-length // self.block_size) * self.block_size
            if hi > lo and (hi - lo + 1) * padded * row_bytes > _GATHER_BYTES:
                groups.append(_DecodeGroup(self, lo, hi))
                lo = hi
        if self.decode_lens:
            groups.append(_DecodeGroup(self, lo, len(self.decode_lens)))
        self._groups[row_bytes] = groups
        return groups


class _Route:
    """The paths one step's layers take for a query dtype and a cache: decode on the
    native kernel (``in_place``), its query taken as it is (``direct``), the step's rows
    stored by the kernel's own call (``stores_rows``), the dtypes of decode and prefill
    attention."""

    def __init__(
        self,
        step: TorchAttentionStep,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> None:
        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels import cpu_decode
        from hwplug.kernels.formats import FP8_FORMATS

        self.fp8 = key_cache.dtype in FP8_FORMATS
        self.compute = _compute_dtype(query)
        self.in_place = bool(step.decode_lens) and _reads_pages_in_place(query, key_cache, step)
        # the native kernel takes a float32 or bfloat16 query as it is (no conversion on
        # either side); an fp8 cache's scaled query and float16 go through float32
        self.direct = self.in_place and not self.fp8 and query.dtype in _native_query_dtypes()
        self.stores_rows = (
            self.direct
            and key_cache.dtype == query.dtype
            and cpu_decode.in_place_layout(key_cache, value_cache)
        )
        self.prefill_dtype = _prefill_dtype(query, key_cache, self.compute)


class _Masked:
    """A piece of a step whose attention mask depends on the layer's sliding window:
    made on first use per window, then reused by every layer with that window."""

    def __init__(self) -> None:
        self._masks: dict[int | None, torch.Tensor | None] = {}

    def mask(self, window: int | None) -> torch.Tensor | None:
        """The mask for ``window`` (None: no mask needed)."""
        if window not in self._masks:
            self._masks[window] = self._make_mask(window)
        return self._masks[window]

    def _make_mask(self, window: int | None) -> torch.Tensor | None:
        raise NotImplementedError


class _DecodeGroup(_Masked):
    """Sorted decoding sequences ``lo:hi`` of a step, attended in one batched call."""

    def __init__(self, step: TorchAttentionStep, lo: int, hi: int) -> None:
        super().__init__()
        self.size = hi - lo
        lens = step.decode_lens[lo:hi]
        self.shortest, self.longest = lens[0], lens[-1]
        rows, lengths, table = step.sorted_decodes()
        self.rows = rows[lo:hi]
        self._lens = lengths[lo:hi]
        blocks = -(-self.longest // step.block_size)
        self.index = table[lo:hi, :blocks].reshape(-1)

    def _make_mask(self, window: int | None) -> torch.Tensor | None:
        """Which gathered positions each sequence attends to (None: all of them)."""
        import torch

        if self.shortest == self.longest and (window is None or window >= self.longest):
            return None
        length = self._lens.unsqueeze(1)
        positions = torch.arange(self.longest, device=length.device).unsqueeze(0)
        keep = positions < length
        if window is not None:
            keep &= positions >= length - window
        return keep[:, None, None, :]


class _Prefill(_Masked):
    """One sequence with several query tokens: the last ``end - start`` of its context."""

    def __init__(
        self, step: TorchAttentionStep, b: int, start: int, end: int, seq_len: int
    ) -> None:
        super().__init__()
        self.start = start
        self.end = end
        self.seq_len = seq_len
        self.index = step.table_index(b, seq_len)
        self._device = step.metadata.device

    def _make_mask(self, window: int | None) -> torch.Tensor | None:
        """The causal (and window) mask; None when plain causal attention does."""
        import torch

        q_len, seq_len = self.end - self.start, self.seq_len
        if q_len == seq_len and (window is None or window >= seq_len):
            return None
        positions = torch.arange(seq_len, device=self._device).unsqueeze(0)
        query_pos = torch.arange(seq_len - q_len, seq_len, device=self._device).unsqueeze(1)
        mask = positions <= query_pos
        if window is not None:
            mask &= positions > query_pos - window
        return mask


class _Pages:
    """Gathers sequences' cache pages into dense ``[n, kv_heads, length, head_size]`` tensors.

    fp8 pages are decoded exactly: ``float8_e5m2`` (the top byte of a
    float16) by torch's cast, which is fast for it, the other formats through
    a 256-entry table of their values in the compute dtype (several times
    faster on CPUs than torch's cast). Pages already in the compute dtype
    are left strided for fp32 (the CPU kernels read them as fast); others are
    converted into contiguous buffers as they are copied.
    """

    def __init__(
        self,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_size: int,
        dtype: torch.dtype,
    ) -> None:
        import torch

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels.formats import FP8_FORMATS

        self.key_cache = key_cache
        self.value_cache = value_cache
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

    def gather(self, index: torch.Tensor, n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``0..length-1`` of ``n`` sequences whose cache
        blocks ``index`` lists (``n`` rows of whole blocks, flattened)."""
        import torch

        # lazy: torch; `import hwplug` (which lists the backends) stays light
        from hwplug.kernels.scratch import scratch

        blocks = index.shape[0] // n
        result = []
        for name, cache in (("key", self.key_cache), ("value", self.value_cache)):
            # whole blocks are contiguous slices: index_select copies them wholesale
            # (fp8 as bytes: not every device indexes every fp8 dtype)
            source = cache.view(torch.uint8) if cache.dtype.itemsize == 1 else cache
            shape = (index.shape[0], *source.shape[1:])
            into = scratch.get(f"gather.{name}", shape, source.dtype, source.device)
            paged = torch.index_select(source, 0, index, out=into).view(cache.dtype)
            dense = paged.view(n, blocks * self.block_size, *cache.shape[2:])[:, :length]
            dense = dense.transpose(1, 2)  # [n, kv_heads, length, head_size], strided
            if self.values is not None:
                codes = scratch.get("gather.codes", dense.shape, torch.int32, dense.device)
                codes.copy_(dense.view(torch.uint8))
                flat = scratch.get(
                    f"gather.{name}.dense", (codes.numel(),), self.dtype, dense.device
                )
                dense = torch.index_select(self.values, 0, codes.view(-1), out=flat)
                dense = dense.view(codes.shape)
            elif dense.dtype != self.dtype or self.dtype != torch.float32:
                into = scratch.get(f"gather.{name}.dense", dense.shape, self.dtype, dense.device)
                dense = into.copy_(dense)
            result.append(dense)
        return result[0], result[1]


def _on(scale: float | torch.Tensor, like: torch.Tensor) -> float | torch.Tensor:
    """A scale ready to multiply ``like`` without changing its dtype (a 0-d tensor or float)."""
    import torch

    if isinstance(scale, torch.Tensor):
        return scale.reshape(()).to(like.device)
    return float(scale)
