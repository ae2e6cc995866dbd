"""The C++ door of ``hwplug::unified_attention`` and ``..._with_output``.

A decode call runs from the dispatcher with no Python only when Python approved its
layer (the validated op computed a call of that layout on the native path) and issued
a ticket for its step (``prepare`` of a pure decode step), and only while that step is
the current one. Everything else goes to the validated ops, whose results and errors are
the reference: the door's results and cache writes equal theirs bit for bit; misuse
after approval gets their named errors; a closed door, another context, other metadata
tensors, shared memory and a cache of another geometry are handed over; tickets go with
their steps. ``make test-sanitize`` runs this file on a door built with ASan and UBSan.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwplug.attention import AttentionMetadata, forward_context, get_backend, unified_attention
from hwplug.kernels import KernelArgumentError, native_decode_unavailable_reason, op_door

pytestmark = pytest.mark.skipif(
    native_decode_unavailable_reason() is not None,
    reason=f"the native kernels cannot run here: {native_decode_unavailable_reason()}",
)

BACKEND = get_backend("torch")
NUM_BLOCKS, BLOCK_SIZE = 24, 16
_heads = itertools.count(3)


def fresh_scale() -> float:
    """A scale no other test uses: a layer the door has not approved yet."""
    return 0.1 + next(_heads) / 1024


class Layer:
    """One attention layer's caches and arguments, in ``dtype``."""

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        heads: int = 4,
        kv_heads: int = 2,
        head_size: int = 64,
        scale: float | None = None,
        window: int | None = None,
        num_blocks: int = NUM_BLOCKS,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        self.dtype, self.heads, self.kv_heads, self.head_size = dtype, heads, kv_heads, head_size
        self.scale = fresh_scale() if scale is None else scale
        self.window = window
        shape = (num_blocks, block_size, kv_heads, head_size)
        self.key_cache = torch.randn(shape).to(dtype)
        self.value_cache = torch.randn(shape).to(dtype)
        self.k_scale = torch.ones((), dtype=torch.float32)
        self.v_scale = torch.ones((), dtype=torch.float32)

    def rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = torch.randn(n, self.heads, self.head_size).to(self.dtype)
        k = torch.randn(n, self.kv_heads, self.head_size).to(self.dtype)
        v = torch.randn(n, self.kv_heads, self.head_size).to(self.dtype)
        return q, k, v

    def call(
        self,
        rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        *,
        caches: tuple[torch.Tensor, torch.Tensor] | None = None,
        out: torch.Tensor | bool | None = True,
    ) -> torch.Tensor:
        q, k, v = rows
        key_cache, value_cache = (
            caches if caches is not None else (self.key_cache, self.value_cache)
        )
        buffer = torch.empty_like(q) if out is True else None if out is False else out
        return unified_attention(
            q,
            k,
            v,
            key_cache,
            value_cache,
            metadata,
            backend="torch",
            scale=self.scale,
            sliding_window=self.window,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            out=buffer,
        )

    def approve(
        self, lens: list[int], *, out: torch.Tensor | bool | None = True, **padding: int
    ) -> tuple[AttentionMetadata, object]:
        """Approve this layer: one call of it in a fresh decode step of ``lens`` (padded as
        :func:`decode_step` pads), whose metadata and prepared step are returned."""
        metadata, step = decode_step(lens, **padding)
        with forward_context(step):
            self.call(self.rows(len(lens) + padding.get("pad_rows", 0)), metadata, out=out)
        return metadata, step


def decode_step(
    lens: list[int], *, pad_seqs: int = 0, pad_rows: int = 0, block_size: int = BLOCK_SIZE
) -> tuple[AttentionMetadata, object]:
    """A decode step of ``len(lens)`` sequences (one token each, at position len - 1), then
    ``pad_seqs`` empty sequences and ``pad_rows`` padding rows; its metadata and the step
    the torch backend prepared (a ticket issued where the door is open)."""
    blocks = [-(-n // block_size) for n in lens]
    tables, used = [], 0
    for count in blocks:
        tables.append([(used + j) % NUM_BLOCKS for j in range(count)])
        used += count
    slots = [
        tables[b][(n - 1) // block_size] * block_size + (n - 1) % block_size
        for b, n in enumerate(lens)
    ]
    metadata = AttentionMetadata.build(
        [1] * len(lens) + [0] * pad_seqs,
        lens + [0] * pad_seqs,
        tables + [[]] * pad_seqs,
        slots + [-1] * pad_rows,
        device="cpu",
    )
    return metadata, BACKEND.prepare(metadata, num_blocks=NUM_BLOCKS, block_size=block_size)


@pytest.fixture(scope="module")
def door() -> op_door.AttentionDoor:
    """The attention door, loaded by a first CPU call of the op."""
    Layer().approve([5])
    bound = op_door.bound_attention_door()
    if bound is None:
        pytest.skip(f"the attention door cannot run here: {op_door.unavailable_reason()}")
    return bound


@contextlib.contextmanager
def counted(door: op_door.AttentionDoor) -> Iterator[dict[str, int]]:
    """Calls the door served and handed to the validated ops inside the block."""
    before = door.counts()
    seen: dict[str, int] = {}
    yield seen
    after = door.counts()
    seen.update({k: after[k] - before[k] for k in ("served", "handed")})


@contextlib.contextmanager
def door_closed(variable: str = "HWPLUG_NATIVE_DOOR", value: str = "0") -> Iterator[None]:
    """``variable`` set to ``value`` (a switch that closes the door) inside the block."""
    saved = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[variable]
        else:
            os.environ[variable] = saved


def both_ways(
    layer: Layer, run: Callable[[Layer], torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """``run`` on copies of the layer's caches with the door open, then closed: each
    way's result and caches."""
    results = []
    for closed in (False, True):
        saved = layer.key_cache, layer.value_cache
        layer.key_cache, layer.value_cache = saved[0].clone(), saved[1].clone()
        with door_closed() if closed else contextlib.nullcontext():
            out = run(layer)
        results.append((out.clone(), layer.key_cache, layer.value_cache))
        layer.key_cache, layer.value_cache = saved
    return results[0], results[1]


def assert_same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_a_layers_first_call_is_checked_in_python_and_later_steps_are_served(
    door: op_door.AttentionDoor,
) -> None:
    layer = Layer()
    metadata, step = decode_step([7, 20])
    rows = layer.rows(2)
    with counted(door) as first, forward_context(step):
        layer.call(rows, metadata)
    assert first == {"served": 0, "handed": 1}
    with counted(door) as same_step, forward_context(step):
        layer.call(rows, metadata)
    assert same_step == {"served": 1, "handed": 0}
    metadata, step = decode_step([8, 21])
    with counted(door) as next_step, forward_context(step):
        out = layer.call(layer.rows(2), metadata)
    assert next_step == {"served": 1, "handed": 0}
    assert torch.isfinite(out).all()


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    heads=st.sampled_from([(4, 4), (4, 2), (8, 1)]),
    head_size=st.sampled_from([32, 64, 128]),
    lens=st.lists(st.integers(1, 90), min_size=1, max_size=5),
    pad_seqs=st.integers(0, 2),
    pad_rows=st.integers(0, 3),
    window=st.sampled_from([None, 1, 5, 40]),
    with_output=st.booleans(),
)
def test_the_doors_results_and_cache_writes_are_the_validated_ops_bit_for_bit(
    door: op_door.AttentionDoor,
    dtype: torch.dtype,
    heads: tuple[int, int],
    head_size: int,
    lens: list[int],
    pad_seqs: int,
    pad_rows: int,
    window: int | None,
    with_output: bool,
) -> None:
    layer = Layer(dtype, heads[0], heads[1], head_size, window=window)
    layer.approve(lens, out=with_output, pad_seqs=pad_seqs, pad_rows=pad_rows)
    metadata, step = decode_step(lens, pad_seqs=pad_seqs, pad_rows=pad_rows)
    rows = layer.rows(len(lens) + pad_rows)

    def run(layer: Layer) -> torch.Tensor:
        with forward_context(step):
            return layer.call(rows, metadata, out=with_output)

    with counted(door) as seen:
        served, checked = both_ways(layer, run)
    assert seen == {"served": 1, "handed": 1}
    assert_same(served, checked)
    if pad_rows:
        assert not served[0][len(lens) :].any()


def test_another_context_or_other_metadata_tensors_are_handed_over(
    door: op_door.AttentionDoor,
) -> None:
    layer = Layer()
    metadata, step = layer.approve([9, 30])
    rows = layer.rows(2)
    with counted(door) as outside:
        layer.call(rows, metadata)  # no forward_context: the op prepares on the spot
    assert outside == {"served": 0, "handed": 1}
    _, other_step = decode_step([9, 30])
    with counted(door) as other, forward_context(other_step):
        layer.call(rows, metadata)  # the current step describes other tensors
    assert other == {"served": 0, "handed": 1}
    # the same values in other memory are other tensors too
    copied = AttentionMetadata(
        *(
            t.clone()
            for t in (
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_table,
                metadata.slot_mapping,
            )
        )
    )
    with counted(door) as copies, forward_context(step):
        layer.call(rows, copied)
    assert copies == {"served": 0, "handed": 1}
    # another thread runs in its own context, where this step is not current
    seen: list[int] = []

    def elsewhere() -> None:
        before = door.counts()["served"]
        layer.call(rows, metadata)
        seen.append(door.counts()["served"] - before)

    with forward_context(step):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert seen == [0]


def test_a_closed_door_hands_every_call_over(door: op_door.AttentionDoor) -> None:
    layer = Layer()
    metadata, step = layer.approve([4])
    rows = layer.rows(1)
    for variable in ("HWPLUG_NATIVE_DOOR", "HWPLUG_NATIVE_KERNELS"):
        with door_closed(variable, " 0 "), counted(door) as seen, forward_context(step):
            layer.call(rows, metadata)
        assert seen["served"] == 0, variable


def test_steps_that_are_not_pure_decode_get_no_ticket(door: op_door.AttentionDoor) -> None:
    layer = Layer()
    layer.approve([6])
    # a prompt of 3 tokens beside a decoding sequence
    prefill = AttentionMetadata.build([1, 3], [6, 3], [[0], [1]], [5, 16, 17, 18], device="cpu")
    prepared = BACKEND.prepare(prefill, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    assert prepared.issue_ticket() is False
    with counted(door) as seen, forward_context(prepared):
        layer.call(layer.rows(4), prefill)
    assert seen == {"served": 0, "handed": 1}
    # a decoding sequence after an empty one: its query row is not its sequence's index
    later = AttentionMetadata.build([0, 1], [0, 6], [[], [0]], [5], device="cpu")
    prepared = BACKEND.prepare(later, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    assert prepared.issue_ticket() is False


def test_layers_off_the_native_path_are_never_approved(door: op_door.AttentionDoor) -> None:
    # float16 attends through float32; keys that are not contiguous are stored by the
    # backend, not by the kernel's own call
    half = Layer(torch.float16)
    strided = Layer(torch.float32)
    q, k, v = strided.rows(2)
    wide = torch.randn(2, strided.kv_heads, 2 * strided.head_size)
    cases = ((half, lambda: half.rows(2)), (strided, lambda: (q, wide[..., : k.shape[-1]], v)))
    for layer, rows in cases:
        for _ in range(2):
            metadata, step = decode_step([12, 3])
            with counted(door) as seen, forward_context(step):
                layer.call(rows(), metadata)
            assert seen == {"served": 0, "handed": 1}, layer.dtype


def test_misuse_after_approval_gets_the_validated_ops_errors(
    door: op_door.AttentionDoor,
) -> None:
    layer = Layer()
    metadata, step = layer.approve([10, 11])
    # a cache of another geometry than the step was prepared for
    small = (layer.key_cache[: NUM_BLOCKS - 1].clone(), layer.value_cache[: NUM_BLOCKS - 1].clone())
    with (
        pytest.raises(ValueError, match="prepared for a cache of 24 blocks"),
        forward_context(step),
    ):
        layer.call(layer.rows(2), metadata, caches=small)
    # one tensor as both caches
    shared = (layer.key_cache, layer.key_cache)
    with pytest.raises(ValueError, match="share memory"), forward_context(step):
        layer.call(layer.rows(2), metadata, caches=shared)
    # a slot moved out of the cache after the step was prepared: the kernel refuses it and
    # the validated op names it; nothing is written
    metadata, step = decode_step([10, 11])
    before = layer.key_cache.clone()
    metadata.slot_mapping[1] = NUM_BLOCKS * BLOCK_SIZE + 3
    with counted(door) as seen, forward_context(step):
        with pytest.raises(KernelArgumentError, match="slot"):
            layer.call(layer.rows(2), metadata)
    assert seen["served"] == 0
    assert torch.equal(layer.key_cache, before)


def test_a_block_table_changed_after_prepare_is_followed_or_refused_as_python_does(
    door: op_door.AttentionDoor,
) -> None:
    layer = Layer()
    layer.approve([10, 40])
    rows = layer.rows(2)
    metadata, step = decode_step([10, 40])
    metadata.block_table[1, 2] = NUM_BLOCKS - 1  # another block, in the cache

    def run(layer: Layer) -> torch.Tensor:
        with forward_context(step):
            return layer.call(rows, metadata)

    with counted(door) as seen:
        served, checked = both_ways(layer, run)
    assert seen["served"] == 0
    assert_same(served, checked)
    metadata, step = decode_step([10, 40])
    metadata.block_table[0, 0] = NUM_BLOCKS  # past the cache
    with counted(door) as seen, forward_context(step):
        with pytest.raises(KernelArgumentError, match="is not a block of the caches"):
            layer.call(rows, metadata)
    assert seen["served"] == 0


def test_an_output_over_the_query_is_handed_over_and_computed_as_python_does(
    door: op_door.AttentionDoor,
) -> None:
    layer = Layer()
    metadata, step = layer.approve([13, 14])
    q, k, v = layer.rows(2)

    def run(layer: Layer) -> torch.Tensor:
        query = q.clone()
        with forward_context(step):
            return layer.call((query, k, v), metadata, out=query)

    with counted(door) as seen:
        served, checked = both_ways(layer, run)
    assert seen["served"] == 0
    assert_same(served, checked)


def test_a_ticket_goes_with_its_step(door: op_door.AttentionDoor) -> None:
    gc.collect()
    before = door.counts()["tickets"]
    metadata, step = decode_step([15])
    assert door.counts()["tickets"] == before + 1
    del metadata, step
    gc.collect()
    assert door.counts()["tickets"] == before


def test_without_pythons_headers_the_attention_ops_stay_on_python() -> None:
    """A door built where Python's headers are missing has no attention part: the ops
    keep their Python kernels (and the linear door still runs)."""
    if os.environ.get("HWPLUG_NATIVE_SANITIZE", "").strip() not in ("", "0"):
        pytest.skip("builds a door of its own (about half a minute); once is enough")
    script = """
import sysconfig, torch
paths = sysconfig.get_paths()
sysconfig.get_paths = lambda *a, **k: dict(paths, include="/nonexistent/hwplug-test")
from hwplug.attention import AttentionMetadata, forward_context, get_backend, unified_attention
from hwplug.kernels import op_door
md = AttentionMetadata.build([1], [3], [[0]], [2], device="cpu")
step = get_backend("torch").prepare(md, num_blocks=2, block_size=4)
kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
q, k, v = torch.ones(1, 1, 8), torch.ones(1, 1, 8), torch.ones(1, 1, 8)
with forward_context(step):
    out = unified_attention(q, k, v, kc, vc, md, backend="torch", scale=1.0)
print(op_door.active(), op_door.bound_attention_door(), bool(torch.isfinite(out).all()))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "None", "True"]


def test_a_ticket_takes_only_the_steps_own_slots(door: op_door.AttentionDoor) -> None:
    """The door reads a ticket's slots from the step's slot_mapping, whose memory the op's
    own argument keeps alive: slots elsewhere are refused (its table and lengths it
    copies, so a ticket outlives the tensors it was issued from)."""
    metadata, _ = decode_step([5, 9])
    tensors = (
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_table,
        metadata.slot_mapping,
    )
    table = metadata.block_table[:2].to(torch.int64)
    lens = torch.tensor([5, 9])

    class Step:
        pass

    elsewhere = metadata.slot_mapping.clone()
    args = {"num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE}
    assert door.issue(Step(), tensors, table, lens, elsewhere, **args) is False
    assert door.issue(Step(), tensors, table, lens[:0], metadata.slot_mapping, **args) is False
    owner = Step()
    assert door.issue(owner, tensors, table, lens, metadata.slot_mapping, **args) is True
