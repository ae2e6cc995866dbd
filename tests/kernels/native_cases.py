"""Cases of the native kernels that run in a worker process (:mod:`tests.kernels.isolated`).

Each case takes plain values (sizes, layout names, a seed), builds its
tensors in the worker, runs a native entry point and checks it there against
a float64 reference (or checks that it refused the call with a
``ValueError`` naming the argument). It returns a short outcome string for
the test to assert on. A kernel that reads or writes out of bounds kills the
worker instead, which fails the case.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hwplug.attention import AttentionMetadata, TorchAttentionBackend, unified_attention
from hwplug.kernels import (
    cpu_decode,
    linear,
    native_linear,
    paged_decode_attention,
)

LAYOUTS = ("contiguous", "permuted", "sliced", "strided", "expanded")
"""How a tensor's values are laid out: row-major; dense with its dimensions' order
reversed; a window of a wider buffer (last dimension contiguous); every other element of
a buffer (last dimension of stride 2); one slice repeated along the first dimension
(stride 0, read-only)."""


def lay(values: torch.Tensor, layout: str) -> torch.Tensor:
    """``values`` (its first slice only, for ``"expanded"``) in ``layout``."""
    junk = math.nan if values.is_floating_point() else -123456  # what the gaps hold
    if layout == "contiguous":
        return values.contiguous()
    if layout == "permuted":
        order = list(reversed(range(values.dim())))
        return values.permute(order).contiguous().permute(order)
    if layout == "sliced":
        wide = torch.full((*values.shape[:-1], values.shape[-1] + 5), junk, dtype=values.dtype)
        wide[..., 2 : 2 + values.shape[-1]] = values
        return wide[..., 2 : 2 + values.shape[-1]]
    if layout == "strided":
        wide = torch.full((*values.shape[:-1], 2 * values.shape[-1]), junk, dtype=values.dtype)
        wide[..., ::2] = values
        return wide[..., ::2]
    if layout == "expanded":
        return values[:1].expand(values.shape)
    raise ValueError(f"unknown layout {layout!r}")


def as_laid(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The values a tensor laid out as ``layout`` holds (the first slice repeated for
    ``"expanded"``)."""
    return values[:1].expand(values.shape).clone() if layout == "expanded" else values


def _rounding(dtype: torch.dtype) -> float:
    return {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}.get(dtype, 0.0)


def _assert_product(
    got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> None:
    """``got`` within float32 summation error (and the output's rounding) of float64's
    ``x @ w.T + b``, element by element."""
    xd, wd = x.double(), w.double()
    want = xd @ wd.T
    size = xd.abs() @ wd.abs().T
    if b is not None:
        want = want + b.double()
        size = size + b.double().abs()
    bound = 2e-6 * (1 + x.shape[-1]) ** 0.5 * size + _rounding(got.dtype) * want.abs() + 1e-6
    error = (got.double() - want).abs()
    worst = float((error - bound).max()) if error.numel() else 0.0
    assert worst <= 0, f"off by {float(error.max())} (allowed {float(bound.max())})"


# -- linear -----------------------------------------------------------------------------------


def native_linear_case(spec: dict[str, Any]) -> str:
    """``native_linear`` on generated operands in the given layouts against float64."""
    gen = torch.Generator().manual_seed(spec["seed"])
    rows, k, n = spec["rows"], spec["k"], spec["n"]
    x_values = torch.randn(rows, k, generator=gen).to(spec["x_dtype"])
    w_values = torch.randn(n, k, generator=gen).to(spec["w_dtype"])
    x = lay(x_values, spec["x_layout"])
    w = lay(w_values, spec["w_layout"])
    bias = None
    if spec["bias"] == "full":
        bias = torch.randn(n, generator=gen)
    elif spec["bias"] == "one":
        bias = torch.randn(1, generator=gen)
    elif spec["bias"] == "scalar":
        bias = torch.randn((), generator=gen)
    out = None
    if spec["out_layout"] is not None and spec["out_layout"] != "expanded":
        out = lay(torch.zeros(rows, n), spec["out_layout"])
    got = native_linear(x, w, bias, out=out)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    if out is not None:
        assert got.data_ptr() == out.data_ptr(), "the result is the out tensor given"
    full_bias = None if bias is None else bias.reshape(-1).expand(n)
    _assert_product(
        got,
        as_laid(x_values, spec["x_layout"]).float(),
        as_laid(w_values, spec["w_layout"]),
        full_bias,
    )
    return "ok"


def backend_linear_case(spec: dict[str, Any]) -> str:
    """``linear(..., backend=...)`` on operands of one dtype in the given layouts, with a
    leading batch dimension, or a registered op (``backend`` ``"op:native_linear"``,
    ``"op:onednn_linear"``) called directly on them as they are, against float64 (the
    result in the operands' dtype)."""
    gen = torch.Generator().manual_seed(spec["seed"])
    rows, k, n, dtype = spec["rows"], spec["k"], spec["n"], spec["dtype"]
    x_values = torch.randn(rows, k, generator=gen).to(dtype)
    w_values = torch.randn(n, k, generator=gen).to(dtype)
    x = lay(x_values, spec["x_layout"])
    w = lay(w_values, spec["w_layout"])
    bias = torch.randn(n, generator=gen).to(dtype) if spec["bias"] else None
    backend = spec["backend"]
    if backend.startswith("op:"):
        got = getattr(torch.ops.hwplug, backend[3:])(x, w, bias).unsqueeze(0)
    else:
        got = linear(x.unsqueeze(0), w, bias, backend=backend)
    assert got.dtype == dtype and got.shape == (1, rows, n)
    _assert_product(
        got[0], as_laid(x_values, spec["x_layout"]), as_laid(w_values, spec["w_layout"]), bias
    )
    return "ok"


def refused_linear_case(spec: dict[str, Any]) -> str:
    """A call torch refuses: the kernel's entry refuses it too, with a ValueError. Returns
    its message."""
    x = torch.randn(spec["rows"], spec["x_k"])
    w = torch.randn(spec["n"], spec["w_k"])
    bias = torch.randn(spec["bias"]) if spec["bias"] is not None else None
    call = spec["call"]
    try:
        if call == "native_linear":
            native_linear(x, w, bias)
        elif call.startswith("op:"):  # the registered op, called as anyone may call it
            getattr(torch.ops.hwplug, call[3:])(x, w, bias)
        else:
            linear(x, w, bias, backend=call)
    except ValueError as error:
        return str(error)
    raise AssertionError(
        f"{call} took x {list(x.shape)}, weight {list(w.shape)}, bias {spec['bias']}"
    )


def refused_op_case(op: str, x: str, weight: str, bias: str | None) -> str:
    """A registered linear op called directly with tensors built by the torch
    expressions given (``"randn(3, 16)"``): refused with a ValueError. Returns its
    message."""
    import hwplug.kernels.linear  # noqa: F401  (registers the ops)

    def build(expression: str) -> torch.Tensor:
        return eval(f"torch.{expression}", {"torch": torch})  # (the tests' own literals)

    args = (build(x), build(weight), None if bias is None else build(bias))
    try:
        getattr(torch.ops.hwplug, op)(*args)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"hwplug::{op} took x {x}, weight {weight}, bias {bias}")


def aliased_out_case(spec: dict[str, Any]) -> str:
    """``native_linear`` with an ``out`` that shares memory with an input: refused.
    Returns the message."""
    k = spec["k"]
    x = torch.randn(4, k)
    w = torch.randn(k, k)
    bias = torch.randn(k)
    out = {"x": x, "x rows": x[1:3], "weight": w[:4], "bias": bias.expand(4, k)}[spec["out"]]
    before = (x.clone(), w.clone(), bias.clone())
    try:
        native_linear(x if spec["out"] != "x rows" else x[:2], w, bias, out=out)
    except ValueError as error:
        assert all(torch.equal(a, b) for a, b in zip((x, w, bias), before, strict=True))
        return str(error)
    raise AssertionError(f"native_linear wrote into an out that is {spec['out']}")


# -- paged decode attention --------------------------------------------------------------------


def _pages(spec: dict[str, Any], gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Caches with scattered pages and a block table whose columns past each length hold
    junk (-7) unless ``spec["full_table"]``, and the lengths."""
    lens, block_size = spec["lens"], spec["block_size"]
    kv_heads, head_size = spec["kv_heads"], spec["head_size"]
    needed = [-(-n // block_size) for n in lens]
    width = max(needed, default=0) + spec.get("spare_columns", 1)
    blocks = max(1, sum(needed) + 2)
    order = torch.randperm(blocks, generator=gen)
    fill = 0 if spec.get("full_table") else -7
    table = torch.full((len(lens), width), fill, dtype=torch.int64)
    used = 0
    for i, count in enumerate(needed):
        table[i, :count] = order[used : used + count]
        used += count
    shape = (blocks, block_size, kv_heads, head_size)
    key_cache = torch.randn(shape, generator=gen).to(spec["cache_dtype"])
    value_cache = torch.randn(shape, generator=gen).to(spec["cache_dtype"])
    return key_cache, value_cache, table, torch.tensor(lens, dtype=torch.int64)


def decode_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Float64 attention of each sequence's one query token over its pages."""
    n, heads, head_size = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    group = heads // kv_heads
    out = torch.zeros(n, heads, head_size, dtype=torch.float64)
    flat_k = key_cache.float().double().reshape(-1, kv_heads, head_size)
    flat_v = value_cache.float().double().reshape(-1, kv_heads, head_size)
    for b in range(n):
        length = int(lens[b])
        first = max(0, length - window) if window else 0
        positions = torch.arange(first, length)
        slots = table[b, positions // block_size] * block_size + positions % block_size
        k = flat_k[slots].repeat_interleave(group, dim=1)
        v = flat_v[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,khd->hk", query[b].double(), k) * scale
        out[b] = torch.einsum("hk,khd->hd", scores.softmax(-1), v)
    return out


def decode_case(spec: dict[str, Any]) -> str:
    """``paged_decode_attention`` with the query, caches, table and out in the given
    layouts against float64."""
    gen = torch.Generator().manual_seed(spec["seed"])
    key_cache, value_cache, table, lens = _pages(spec, gen)
    n, heads, head_size = len(spec["lens"]), spec["heads"], spec["head_size"]
    q_values = torch.randn(n, heads, head_size, generator=gen).to(spec["query_dtype"])
    query = lay(q_values, spec["query_layout"]) if n else q_values
    caches = [lay(c, spec["cache_layout"]) for c in (key_cache, value_cache)]
    table_in = lay(table, spec["table_layout"]).to(spec["table_dtype"]) if n else table
    out = None
    if spec["out_layout"] is not None and n:
        out = lay(torch.zeros(n, heads, head_size), spec["out_layout"])
    window = spec["window"]
    got = paged_decode_attention(
        query, *caches, table_in, lens.to(spec["lens_dtype"]), scale=spec["scale"],
        sliding_window=window, out=out,
    )  # fmt: skip
    assert got.shape == (n, heads, head_size) and got.dtype == torch.float32
    if out is not None:
        assert got.data_ptr() == out.data_ptr()
    want = decode_reference(
        as_laid(q_values, spec["query_layout"]).float(),
        as_laid(key_cache, spec["cache_layout"]), as_laid(value_cache, spec["cache_layout"]),
        table, lens, spec["scale"], window,
    )  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=3e-5, rtol=3e-5)
    return "ok"


def decode_index_case(spec: dict[str, Any]) -> str:
    """One index the kernel reads set to ``spec["value"]``: a length (``"len"``), a block
    id a length covers (``"block"``) or a new row's slot (``"slot"``, through the engine
    step's call that stores rows). Returns ``"ok"`` when it ran (then against float64,
    with the caches unchanged but for the stored rows), else the ValueError's message
    (then nothing was written)."""
    gen = torch.Generator().manual_seed(spec["seed"])
    key_cache, value_cache, table, lens = _pages({**spec, "full_table": True}, gen)
    n, heads, head_size = len(spec["lens"]), spec["heads"], spec["head_size"]
    query = torch.randn(n, heads, head_size, generator=gen)
    what, value, at = spec["what"], spec["value"], spec["at"]
    before = key_cache.clone(), value_cache.clone()
    rows = torch.randn(2, spec["kv_heads"], head_size, generator=gen)
    slots = torch.tensor([0, 1], dtype=torch.int64)
    if what == "len":
        lens[at % n] = value
    elif what == "block":
        b = at % n
        table[b, (int(lens[b]) - 1) // spec["block_size"]] = value
    else:
        slots[at % 2] = value
    try:
        got = cpu_decode.run(
            query, key_cache, value_cache, table, lens, scale=0.3, sliding_window=None,
            write=(rows, rows.clone(), slots),
        )  # fmt: skip
    except ValueError as error:
        assert torch.equal(key_cache, before[0]) and torch.equal(value_cache, before[1]), (
            "a refused call wrote the caches"
        )
        return str(error)
    flat = key_cache.view(-1, spec["kv_heads"], head_size)
    last = {int(slot): i for i, slot in enumerate(slots.tolist()) if slot >= 0}
    for slot, i in last.items():  # a slot given twice keeps its last row
        assert torch.equal(flat[slot], rows[i])
    want = decode_reference(query, key_cache, value_cache, table, lens, 0.3, None)
    torch.testing.assert_close(got.double(), want, atol=3e-5, rtol=3e-5)
    return "ok"


# -- the torch attention backend ---------------------------------------------------------------


def _step_batch(spec: dict[str, Any]) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(spec["seed"])
    seq_lens, query_lens = spec["seq_lens"], spec["query_lens"]
    heads, kv_heads, head_size, block_size = 4, 2, spec["head_size"], 4
    needed = [-(-n // block_size) for n in seq_lens]
    blocks = sum(needed) + 2
    order = torch.randperm(blocks, generator=gen).tolist()
    table, used = [], 0
    for count in needed:
        table.append(order[used : used + count])
        used += count
    metadata = AttentionMetadata.from_lengths(seq_lens, query_lens, table, block_size)
    dtype = spec["dtype"]
    tokens = sum(query_lens)
    shape = (blocks, block_size, kv_heads, head_size)
    caches = [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)]
    query = torch.randn(tokens, heads, head_size, generator=gen).to(dtype)
    key = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    impl = TorchAttentionBackend(heads, head_size, kv_heads, 0.25, cache_dtype=dtype)
    return impl, query, key, value, caches, metadata


def query_layout_case(spec: dict[str, Any]) -> str:
    """A step whose query is dense but not row-major, through ``spec["through"]``
    (``"forward"``: ``TorchAttentionBackend.forward``; ``"op"``: ``unified_attention``):
    the same rows as the row-major query gives."""
    impl, query, key, value, caches, metadata = _step_batch(spec)
    permuted = lay(query, "permuted")
    assert not permuted.is_contiguous() and torch.equal(permuted, query)

    def attend(q: torch.Tensor) -> torch.Tensor:
        if spec["through"] == "forward":
            return impl.forward(q, key, value, *caches, metadata)
        return unified_attention(q, key, value, *caches, metadata, backend="torch", scale=0.25)

    want = attend(query.clone())
    got = attend(permuted)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    return "ok"


def mutated_step_case(spec: dict[str, Any]) -> str:
    """A step prepared, then its metadata changed in place (``spec["change"]``: a slot or
    a block id set to ``spec["value"]``) before a layer attends: refused with a
    ValueError, never an access out of bounds. Returns the message."""
    impl, query, key, value, caches, metadata = _step_batch(spec)
    step = TorchAttentionBackend.prepare(
        metadata, num_blocks=caches[0].shape[0], block_size=caches[0].shape[1]
    )
    if spec["change"] == "slot":
        metadata.slot_mapping[0] = spec["value"]
    else:
        metadata.block_table[0, 0] = spec["value"]
    try:
        impl.forward(query, key, value, *caches, step)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"a {spec['change']} of {spec['value']} was attended")
