"""oneDNN-packed linear layers (``hwplug.kernels.linear``) against ``nn.Linear`` on CPU.

Runs the linear layers of a small Llama (4 layers, hidden 512, intermediate
1408, vocabulary 8192: about 64 MB of float32 weights, more than the caches
hold, as in a real decode step) for a batch of ``--rows`` rows, once with
``torch.nn.functional.linear`` and once with the packed layers, side by side
in this process (best of ``--repeats``). Prints JSON with the time of one pass
over all layers for each, and the ratio (packed speed-up), per dtype and row count.

``python benchmarks/bench_linear.py [--rows 1 16 512] [--dtype float32 bfloat16] [--repeats 20]``
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable

import torch
from torch import nn

from hwplug.kernels.linear import PackedLinear, packing_unavailable_reason

SHAPES = [(512, 1024), (512, 512), (512, 2816), (1408, 512)] * 4 + [(512, 8192)]
"""(in, out) of every linear layer of the model: q/k/v, o, gate/up, down per layer; lm_head."""


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 512])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    results = []
    for name in args.dtype:
        dtype = getattr(torch, name)
        torch.manual_seed(0)
        dense = [nn.Linear(i, o, bias=False, dtype=dtype).requires_grad_(False) for i, o in SHAPES]
        reason = packing_unavailable_reason(dense[0].weight)
        if reason is not None:
            results.append({"dtype": name, "skipped": reason})
            continue
        packed = [PackedLinear.from_linear(layer) for layer in dense]
        for rows in args.rows:
            inputs = [torch.randn(rows, i, dtype=dtype) for i, _ in SHAPES]

            def run(layers: list[nn.Module], inputs: list[torch.Tensor] = inputs) -> None:
                with torch.inference_mode():
                    for layer, x in zip(layers, inputs):
                        layer(x)

            dense_s = best_seconds(functools.partial(run, dense), args.repeats)
            packed_s = best_seconds(functools.partial(run, packed), args.repeats)
            results.append(
                {
                    "dtype": name,
                    "rows": rows,
                    "nn_linear_ms": round(dense_s * 1e3, 2),
                    "packed_ms": round(packed_s * 1e3, 2),
                    "speedup": round(dense_s / packed_s, 2),
                }
            )
    report = {
        "threads": torch.get_num_threads(),
        "weight_mb_float32": round(sum(i * o for i, o in SHAPES) * 4 / 1e6, 1),
        "results": results,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
