#!/usr/bin/env python
"""How fast one row (a decoding step of one sequence), or a few, streams a model's weights.

Every linear of a decoder's layers, for ``--layers`` layers (so the weights
come from memory, not the cache), one row at a time: hwplug's native kernel
through the engine's door (``linear(backend="native")``: for bfloat16 on an
AVX2 CPU, the one-row tiles), the same kernel called straight through ctypes
(what the door costs), oneDNN (``backend="onednn"``) and torch's
``nn.functional.linear``; beside the machine's streaming read (torch summing a
1 GiB buffer). Paths are interleaved, best of ``--rounds`` sweeps. Prints JSON:
GB/s of weights read (1e9 bytes), GFLOPS (``2 x rows x weights`` a sweep) and each
path's rate over torch's. ``--rows 16`` is a decoding step of a batch of 16, where
the kernel is bound by its arithmetic rather than by the memory.

``PYTHONPATH=src python benchmarks/bench_linear_row.py [--dtype bf16|fp32|both]
[--rows 1] [--hidden 1024 --intermediate 4096 --layers 12]`` (the shapes of
``bench_peers.py``'s 250M model).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import stream_read_gb_per_s  # (beside this file)


def _shapes(hidden: int, intermediate: int) -> list[tuple[int, int]]:
    """[out, in] features of one layer's linears: q/k/v fused, o, gate/up fused, down."""
    return [
        (3 * hidden, hidden),
        (hidden, hidden),
        (2 * intermediate, hidden),
        (hidden, intermediate),
    ]


def _sweep(dtype_name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from hwplug.kernels import bindings, cpu_linear
    from hwplug.kernels.linear import linear

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(0)
    layers = [
        [
            torch.randn(n, k, generator=gen).to(dtype)
            for n, k in _shapes(args.hidden, args.intermediate)
        ]
        for _ in range(args.layers)
    ]
    rows = {
        k: torch.randn(args.rows, k, generator=gen).to(dtype)
        for k in (args.hidden, args.intermediate)
    }
    weight_bytes = sum(w.numel() * w.element_size() for layer in layers for w in layer)
    paths: dict[str, Any] = {
        "native": lambda x, w: linear(x, w, backend="native"),
        "onednn": lambda x, w: linear(x, w, backend="onednn"),
        "torch": lambda x, w: torch.nn.functional.linear(x, w),
    }
    if cpu_linear.native_linear_unavailable_reason() is None:
        x0, w0 = rows[args.hidden], layers[0][1]
        pairs = cpu_linear.pairs_path(x0, w0)

        def direct(x: torch.Tensor, w: torch.Tensor) -> None:
            out = torch.empty((args.rows, w.shape[0]), dtype=dtype if pairs else torch.float32)
            bindings.linear(x if pairs else x.float(), w, None, out, pairs=pairs)

        paths["native_direct"] = direct
    else:
        pairs = None
        del paths["native"]
    best = dict.fromkeys(paths, float("inf"))
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, call in paths.items():
                start = time.perf_counter()
                for layer in layers:
                    for w in layer:
                        call(rows[w.shape[1]], w)
                best[name] = min(best[name], time.perf_counter() - start)
    rates = {name: weight_bytes / seconds / 1e9 for name, seconds in best.items()}
    flops = 2 * args.rows * weight_bytes // layers[0][0].element_size()
    return {
        "weight_bytes": weight_bytes,
        "rows": args.rows,
        "native_path": pairs or ("vector" if "native" in paths else None),
        # three significant digits: a smoke run's tiny shapes read at a few MB/s, which two
        # decimals would print as 0
        "gb_per_s": {name: float(f"{rate:.3g}") for name, rate in rates.items()},
        "gflops": {name: float(f"{flops / t / 1e9:.3g}") for name, t in best.items()},
        "over_torch": {name: float(f"{rate / rates['torch']:.3g}") for name, rate in rates.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="both", choices=["bf16", "fp32", "both"])
    parser.add_argument("--rows", type=int, default=1, help="rows of x (a batch's decode step)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    parser.add_argument("--stream-bytes", type=int, default=1 << 30, help="streaming read buffer")
    args = parser.parse_args(argv)
    if args.rows < 1:
        parser.error(f"--rows must be at least 1, got {args.rows}")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = ["bf16", "fp32"] if args.dtype == "both" else [args.dtype]
    report: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "shapes": _shapes(args.hidden, args.intermediate),
        "layers": args.layers,
        "stream_read_gb_per_s": stream_read_gb_per_s(args.threads or None, args.stream_bytes),
    }
    for name in dtypes:
        report[name] = _sweep(name, args)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
