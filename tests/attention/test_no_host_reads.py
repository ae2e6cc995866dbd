"""A prepared step's ``forward`` reads nothing back from the device (SPEC 12).

Two independent proofs:

- the torch backend's forward runs on ``meta`` tensors (no data at all: any
  read of a value raises there) with a step prepared from host values;
- under a ``TorchDispatchMode`` that records every aten op, no built-in
  backend's forward calls an op that hands a tensor value to the host
  (``_local_scalar_dense``, which ``.item()``, ``.tolist()``, ``bool()`` and
  ``int()`` go through, ``equal``, ``is_nonzero``) or whose result's shape
  depends on values (``nonzero``, ``masked_select``, ``unique``...).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hwplug.attention import (
    AttentionMetadata,
    TorchAttentionBackend,
    TritonAttentionBackend,
    forward_context,
    unified_attention,
)
from tests.attention.helpers import make_batch

HEADS, KV_HEADS, HEAD, BLOCK = 4, 2, 32, 4

HOST_READS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.equal",
        "aten.is_nonzero",
        "aten.nonzero",
        "aten.masked_select",
        "aten.unique_consecutive",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.argwhere",
        "aten.repeat_interleave",
    }
)
"""aten ops that read a value back to the host or whose output shape depends on values."""

BATCHES = {
    "prefill": ([12, 7], [12, 7]),
    "chunked prefill": ([30, 9], [6, 9]),
    "decode": ([9, 33, 17, 1], [1, 1, 1, 1]),
    "mixed": ([20, 5, 41, 3], [1, 5, 4, 1]),
}


class RecordOps(TorchDispatchMode):
    """Records the overload packet of every aten op dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.append(str(func.overloadpacket._qualified_op_name).replace("::", "."))
        return func(*args, **(kwargs or {}))

    def host_reads(self) -> list[str]:
        return [op for op in self.ops if op in HOST_READS]


def _prepared_batch(kind: str, *, padding: int = 3, cache_dtype: torch.dtype | None = None) -> Any:
    seq_lens, query_lens = BATCHES[kind]
    return make_batch(
        seq_lens,
        query_lens,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_size=HEAD,
        block_size=BLOCK,
        padding=padding,
        cache_dtype=cache_dtype,
    )


@pytest.mark.parametrize("kind", list(BATCHES))
@pytest.mark.parametrize("window", [None, 5])
def test_the_torch_backend_runs_a_prepared_step_on_meta_tensors(
    kind: str, window: int | None
) -> None:
    batch = _prepared_batch(kind)
    host = batch.metadata
    assert host.has_host_values
    meta = AttentionMetadata.build(
        host.query_lens or [],
        host.seq_lens_cpu or [],
        host.block_table.tolist(),
        host.slot_mapping.tolist(),
        device="meta",
    )
    num_blocks = batch.key_cache.shape[0]
    step = TorchAttentionBackend.prepare(meta, num_blocks=num_blocks, block_size=BLOCK)
    impl = TorchAttentionBackend(HEADS, HEAD, KV_HEADS, 0.2, sliding_window=window)
    on_meta = [t.to("meta") for t in batch.args()[:5]]
    for _ in range(2):  # every layer of the step
        out = impl.forward(*on_meta, step)  # type: ignore[arg-type]
        assert out.device.type == "meta" and out.shape == batch.query.shape


def test_meta_tensors_do_raise_on_a_host_read() -> None:
    """The proof above means something: reading a meta tensor's value fails."""
    with pytest.raises((RuntimeError, NotImplementedError)):
        torch.zeros(3, device="meta").tolist()
    meta = AttentionMetadata.from_lengths([5], [1], [[0, 1]], BLOCK, device="meta")
    raw = AttentionMetadata(
        meta.query_start_loc, meta.seq_lens, meta.block_table, meta.slot_mapping
    )
    impl = TorchAttentionBackend(HEADS, HEAD, KV_HEADS, 0.2)
    q = torch.zeros(1, HEADS, HEAD, device="meta")
    kv = torch.zeros(1, KV_HEADS, HEAD, device="meta")
    cache = torch.zeros(2, BLOCK, KV_HEADS, HEAD, device="meta")
    # metadata made from device tensors alone: preparing on the spot must read it back
    with pytest.raises((RuntimeError, NotImplementedError)):
        impl.forward(q, kv, kv.clone(), cache, cache.clone(), raw)


def _forward_ops(backend: type, kind: str, cache_dtype: torch.dtype | None = None) -> RecordOps:
    batch = _prepared_batch(kind, cache_dtype=cache_dtype)
    step = backend.prepare(batch.metadata, num_blocks=batch.key_cache.shape[0], block_size=BLOCK)
    impl = backend(HEADS, HEAD, KV_HEADS, 0.2, sliding_window=5, cache_dtype=batch.key_cache.dtype)
    recorder = RecordOps()
    with recorder:
        impl.forward(*batch.args()[:5], step, k_scale=torch.tensor(0.5), v_scale=0.25)
    assert recorder.ops, "the recorder saw no op: the test would prove nothing"
    return recorder


@pytest.mark.parametrize("kind", list(BATCHES))
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn], ids=["model", "fp8"])
def test_the_torch_backend_forward_reads_nothing_back(
    kind: str, cache_dtype: torch.dtype | None
) -> None:
    assert _forward_ops(TorchAttentionBackend, kind, cache_dtype).host_reads() == []


@pytest.fixture
def triton_interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_the_triton_backend_forward_reads_nothing_back(kind: str, triton_interpreted: None) -> None:
    assert _forward_ops(TritonAttentionBackend, kind).host_reads() == []


def test_the_recorder_catches_a_host_read() -> None:
    recorder = RecordOps()
    with recorder:
        x = torch.arange(4)
        x.tolist()
        bool(x.sum() > 0)
        x.nonzero()
    assert "aten._local_scalar_dense" in recorder.host_reads()
    assert "aten.nonzero" in recorder.host_reads()


def test_unprepared_metadata_without_host_values_is_read_in_prepare_only() -> None:
    """Raw metadata still works (prepared on the spot): the reads happen there."""
    batch = _prepared_batch("mixed")
    meta = batch.metadata
    raw = AttentionMetadata(
        meta.query_start_loc, meta.seq_lens, meta.block_table, meta.slot_mapping
    )
    impl = TorchAttentionBackend(HEADS, HEAD, KV_HEADS, 0.2)
    want = impl.forward(*(t.clone() for t in batch.args()[:5]), meta)  # type: ignore[arg-type]
    got = impl.forward(*batch.args()[:5], raw)  # type: ignore[arg-type]
    torch.testing.assert_close(got, want)


def test_the_op_runs_the_step_the_engine_prepared() -> None:
    """Inside forward_context the op hands the engine's prepared step to forward."""
    batch = _prepared_batch("mixed")
    step = TorchAttentionBackend.prepare(
        batch.metadata, num_blocks=batch.key_cache.shape[0], block_size=BLOCK
    )
    prepares: list[int] = []
    original = TorchAttentionBackend.prepare.__func__  # type: ignore[attr-defined]

    def counting(cls: type, *args: Any, **kwargs: Any) -> Any:
        prepares.append(1)
        return original(cls, *args, **kwargs)

    recorder = RecordOps()
    try:
        TorchAttentionBackend.prepare = classmethod(counting)  # type: ignore[assignment,method-assign]
        with forward_context(step), recorder:
            for _ in range(3):  # three layers
                unified_attention(*batch.args(), backend="torch", scale=0.2)
        assert prepares == []
        assert recorder.host_reads() == []
        # outside the context (or with other tensors) the op prepares on the spot
        unified_attention(*batch.args(), backend="torch", scale=0.2)
        assert prepares == [1]
    finally:
        TorchAttentionBackend.prepare = classmethod(original)  # type: ignore[assignment,method-assign]


def test_forward_context_takes_a_prepared_step_only() -> None:
    with pytest.raises(ValueError, match="forward_context\\(\\) takes what a backend's prepare"):
        with forward_context("step"):
            pass


def test_a_step_prepared_for_another_cache_is_refused() -> None:
    batch = _prepared_batch("decode")
    step = TorchAttentionBackend.prepare(batch.metadata, num_blocks=1000, block_size=BLOCK)
    impl = TorchAttentionBackend(HEADS, HEAD, KV_HEADS, 0.2)
    with pytest.raises(ValueError, match="prepared for a cache of 1000 blocks of 4"):
        impl.forward(*batch.args()[:5], step)
