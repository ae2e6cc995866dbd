"""What the native kernels' argument checks cost, against a decode step of a model.

Every native call is checked twice (docs/decisions.md, "One door to the
native kernels"): in Python on shapes, dtypes and aliasing
(:mod:`hwplug.kernels.checks`), and in C on every index a kernel reads
(lengths, block ids, slots). This prints one JSON object, all parts timed
side by side in this process (medians of interleaved repeats):

- ``attention_call_us``: one layer's decode attention through the engine's
  call (``cpu_decode.run``: checks, marshalling, kernel) against the bare
  ctypes call of the same kernel with its arguments made beforehand;
  ``python_us`` is the difference (the checks and the marshalling), and
  ``checks_us`` the checks alone (the call's rules, ``STEP``);
- ``c_bounds_us``: the kernel as the library is built against the same
  sources built with ``-DHWPLUG_UNCHECKED_INDICES`` (the index checks
  compiled out), same inputs;
- ``linear_call_us``: ``linear(..., backend="native")`` against the
  kernel's product on checked arguments (``cpu_linear.run``): ``routing`` is
  the difference (the backend's dispatch, most of it older than the checks),
  ``guard`` the check that ``linear`` adds before it routes;
- ``step_ms``: a decode step of the model's shapes (each layer: its seven
  linears and its attention call, through the engine's calls), and
  ``checks_share``: ``layers x (checks_us + c_bounds_us) + 7 x layers x
  linear guard``, over ``step_ms`` (``python_and_checks_share`` counts all of
  ``python_us``, the marshalling too). The step leaves out norms, rotary
  embeddings and sampling, so the share is an upper bound of the share of a
  real step. The goal is under 2%.

Usage: ``python benchmarks/bench_kernel_checks.py [--layers 12] [--hidden 1024]
[--intermediate 2816] [--heads 16] [--kv-heads 16] [--seqs 1,16] [--context 256]
[--dtype float32] [--repeats 200]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hwplug.kernels import bindings, cpu_decode, cpu_linear, linear, native

BLOCK_SIZE = 16


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, run in turn so that all see the same machine."""
    for _ in range(3):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def unchecked_library() -> ctypes.CDLL:
    """The kernels' sources built as the library was, with the index checks compiled out."""
    flags = native.build_flags()
    if flags is None:
        raise SystemExit(f"the native kernels cannot run here: {native.library()}")
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "gcc"]
    sources = sorted(Path(native.__file__).with_name("csrc").glob("*.c"))
    target = Path(tempfile.mkdtemp(prefix="hwplug-bench-")) / "unchecked.so"
    command = [*compiler, *flags, "-DHWPLUG_UNCHECKED_INDICES", "-shared", "-fPIC", "-std=c11"]
    subprocess.run([*command, *map(str, sources), "-o", str(target), "-lm"], check=True)
    lib = bindings._declared(ctypes.CDLL(str(target)))
    assert not isinstance(lib, str), lib
    return lib


def bench(args: argparse.Namespace, seqs: int, unchecked: ctypes.CDLL) -> dict[str, object]:
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, hidden = args.heads, args.kv_heads, args.hidden
    head_size = hidden // heads
    per_seq = -(-(args.context + 1) // BLOCK_SIZE)
    blocks = seqs * per_seq + 1
    order = torch.randperm(blocks, generator=gen)
    table = order[: seqs * per_seq].view(seqs, per_seq).contiguous()
    lens = torch.full((seqs,), args.context + 1, dtype=torch.int64)
    shape = (blocks, BLOCK_SIZE, kv_heads, head_size)
    caches = [
        [torch.randn(shape, generator=gen).to(dtype) for _ in range(2)] for _ in range(args.layers)
    ]
    query = torch.randn(seqs, heads, head_size, generator=gen).to(dtype)
    keys = torch.randn(seqs, kv_heads, head_size, generator=gen).to(dtype)
    values = torch.randn(seqs, kv_heads, head_size, generator=gen).to(dtype)
    slots = table[:, -1] * BLOCK_SIZE + args.context % BLOCK_SIZE
    out = torch.empty_like(query)
    scale = head_size**-0.5

    def engine_call(layer: int = 0) -> None:
        key_cache, value_cache = caches[layer]
        cpu_decode.run(
            query, key_cache, value_cache, table, lens, scale=scale, sliding_window=None,
            out=out, write=(keys, values, slots),
        )  # fmt: skip

    fault = (ctypes.c_int64 * 3)()

    def raw(lib: ctypes.CDLL) -> Callable[[], None]:
        key_cache, value_cache = caches[0]
        strides = key_cache.stride()
        arguments = (
            query.data_ptr(), bindings.QUERY_KINDS.get(dtype, 0),
            key_cache.data_ptr(), value_cache.data_ptr(), bindings.CACHE_KINDS[dtype], None,
            strides[0], strides[1], strides[2], table.data_ptr(), table.stride(0),
            lens.data_ptr(), seqs, kv_heads, heads // kv_heads, head_size, BLOCK_SIZE, 0,
            scale, out.data_ptr(), torch.get_num_threads(), keys.data_ptr(),
            values.data_ptr(), slots.data_ptr(), seqs, blocks, table.shape[1], fault,
        )  # fmt: skip
        function = lib.hwplug_paged_decode

        def call() -> None:
            status = function(*arguments)
            assert status == 0, status

        return call

    arguments = (query, *caches[0], table, lens, out, keys, values, slots)

    def python_checks() -> None:
        cpu_decode._check_heads("step", cpu_decode.STEP.check_values(arguments))

    checked_lib = bindings.library()
    assert not isinstance(checked_lib, str)
    engine_s, raw_s, unchecked_s, checks_only_s = interleaved_medians(
        [engine_call, raw(checked_lib), raw(unchecked), python_checks], args.repeats
    )

    # the linears of a layer: q, k, v, o, gate, up, down
    shapes = [(hidden, hidden)] * 2 + [(kv_heads * head_size, hidden)] * 2
    shapes += [(args.intermediate, hidden)] * 2 + [(hidden, args.intermediate)]
    weights = [
        [torch.randn(s, generator=gen).to(dtype) * 0.02 for s in shapes] for _ in range(args.layers)
    ]
    x = torch.randn(seqs, hidden, generator=gen).to(dtype)
    wide = torch.randn(seqs, args.intermediate, generator=gen).to(dtype)

    def linear_entry() -> None:
        linear(x, weights[0][0], backend="native")

    def linear_kernel() -> None:
        cpu_linear.run(x, weights[0][0], None, dtype=dtype)

    w0 = weights[0][0]

    def linear_guard() -> bool:
        # the check linear() makes before it routes a call (kernels/linear.py)
        return x.dim() == 0 or x.shape[-1] != w0.shape[1]

    entry_s, kernel_s, guard_s = interleaved_medians(
        [linear_entry, linear_kernel, linear_guard], args.repeats
    )

    def step() -> None:
        for layer in range(args.layers):
            for i, w in enumerate(weights[layer]):
                linear(wide if i == 6 else x, w, backend="native")
            engine_call(layer)

    (step_s,) = interleaved_medians([step], max(20, args.repeats // 10))
    python_s = max(0.0, engine_s - raw_s)
    c_bounds_s = max(0.0, raw_s - unchecked_s)
    # the checks: the rules of the step's call, the C bounds, and the linear entry's path
    # in front of the kernel (its guard and routing, an upper bound of the guard)
    checks_s = args.layers * (checks_only_s + c_bounds_s) + 7 * args.layers * guard_s
    overhead_s = args.layers * (python_s + c_bounds_s) + 7 * args.layers * (entry_s - kernel_s)
    return {
        "seqs": seqs,
        "attention_call_us": {
            "engine_call": round(engine_s * 1e6, 2),
            "bare_kernel": round(raw_s * 1e6, 2),
            "python_us": round(python_s * 1e6, 2),
            "checks_us": round(checks_only_s * 1e6, 2),
        },
        "c_bounds_us": {
            "checked": round(raw_s * 1e6, 2),
            "unchecked": round(unchecked_s * 1e6, 2),
            "difference": round(c_bounds_s * 1e6, 2),
        },
        "linear_call_us": {
            "entry": round(entry_s * 1e6, 2),
            "kernel_run": round(kernel_s * 1e6, 2),
            "routing": round((entry_s - kernel_s) * 1e6, 2),
            "guard": round(guard_s * 1e6, 3),
        },
        "step_ms": round(step_s * 1e3, 3),
        "checks_per_step_us": round(checks_s * 1e6, 1),
        "checks_share": round(checks_s / step_s, 5),
        "python_and_checks_share": round(overhead_s / step_s, 5),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=16)
    parser.add_argument("--seqs", default="1,16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    unchecked = unchecked_library()
    results = [bench(args, int(s), unchecked) for s in args.seqs.split(",")]
    print(
        json.dumps(
            {
                "benchmark": "kernel_checks",
                "threads": torch.get_num_threads(),
                "model": {k: v for k, v in vars(args).items() if k not in ("seqs", "repeats")},
                "results": results,
                "goal": "checks_share < 0.02",
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
