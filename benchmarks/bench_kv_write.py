"""Throughput of the paged KV-cache write (``hwplug.kernels.write_kv_cache``).

Prints one JSON object:

- ``cpu``: the torch reference path writing bf16 keys/values into an fp8
  cache, against a plain ``index_copy_`` that writes the same number of
  cache bytes (already-quantised rows), timed side by side in this process
  (median of repeats). ``ratio`` is the write's throughput over index_copy_'s.
- ``cuda`` (when a GPU is present): the Triton path's GB/s (bytes read plus
  bytes written) and its fraction of ``--peak-gbps`` (default 4800, an H200),
  next to the torch path on the same data.

Usage: ``python benchmarks/bench_kv_write.py [--tokens N] [--peak-gbps X]``.
On a machine shared with other work, ``OMP_NUM_THREADS=1`` in the environment
gives steadier CPU figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from hwplug.kernels import compute_kv_scales, write_kv_cache


def median_seconds(
    fn: Callable[[], object], repeats: int, sync: Callable[[], None], *, warmup: bool = True
) -> float:
    if warmup:
        fn()  # also compiles the Triton kernel
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def make_batch(
    tokens: int, heads: int, head_size: int, block_size: int, device: str
) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    num_blocks = (2 * tokens) // block_size
    key = torch.randn(tokens, heads, head_size, generator=gen, device=device)
    value = torch.randn(tokens, heads, head_size, generator=gen, device=device)
    shape = (num_blocks, block_size, heads, head_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=device)[:tokens]
    return {
        "key": key.to(torch.bfloat16),
        "value": value.to(torch.bfloat16),
        "key_cache": torch.zeros(shape, dtype=torch.float8_e4m3fn, device=device),
        "value_cache": torch.zeros(shape, dtype=torch.float8_e4m3fn, device=device),
        "slot_mapping": slots,
    }


def bytes_moved(batch: dict[str, Any]) -> int:
    """Bytes one write reads and writes: keys, values, slots and two cache rows per token."""
    read = batch["key"].nbytes + batch["value"].nbytes + batch["slot_mapping"].nbytes
    written = 2 * batch["key"].numel() * batch["key_cache"].element_size()
    return read + written


def bench_cpu(tokens: int, repeats: int) -> dict[str, Any]:
    batch = make_batch(tokens, heads=8, head_size=128, block_size=16, device="cpu")
    k_scale, v_scale = compute_kv_scales(batch["key"], batch["value"], torch.float8_e4m3fn)

    def write() -> None:
        write_kv_cache(**batch, k_scale=k_scale, v_scale=v_scale, backend="torch")

    # the same cache bytes, as rows that need no conversion
    row = batch["key"].shape[1] * batch["key"].shape[2]
    flat_k = batch["key_cache"].view(torch.uint8).view(-1, row)
    flat_v = batch["value_cache"].view(torch.uint8).view(-1, row)
    src = torch.randint(0, 255, (tokens, row), dtype=torch.uint8)
    index = batch["slot_mapping"]

    def copy() -> None:
        flat_k.index_copy_(0, index, src)
        flat_v.index_copy_(0, index, src)

    def no_sync() -> None:
        pass

    # warm up once, then interleave so that both see the same machine state
    write()
    copy()
    write_times, copy_times = [], []
    for _ in range(repeats):
        write_times.append(median_seconds(write, 1, no_sync, warmup=False))
        copy_times.append(median_seconds(copy, 1, no_sync, warmup=False))
    t_write = statistics.median(write_times)
    t_copy = statistics.median(copy_times)
    cache_bytes = 2 * tokens * row
    return {
        "tokens": tokens,
        "num_kv_heads": 8,
        "head_size": 128,
        "threads": torch.get_num_threads(),
        "input_dtype": "bfloat16",
        "cache_dtype": "float8_e4m3fn",
        "write_s": t_write,
        "index_copy_s": t_copy,
        "write_cache_gbps": cache_bytes / t_write / 1e9,
        "index_copy_gbps": cache_bytes / t_copy / 1e9,
        "ratio": t_copy / t_write,
    }


def bench_cuda(tokens: int, repeats: int, peak_gbps: float) -> dict[str, Any]:
    batch = make_batch(tokens, heads=8, head_size=128, block_size=16, device="cuda")
    k_scale, v_scale = compute_kv_scales(batch["key"], batch["value"], torch.float8_e4m3fn)
    ks, vs = float(k_scale), float(v_scale)
    moved = bytes_moved(batch)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "tokens": tokens,
        "bytes_moved": moved,
        "peak_gbps": peak_gbps,
    }
    for backend in ("triton", "torch"):

        def write(backend: str = backend) -> None:
            write_kv_cache(**batch, k_scale=ks, v_scale=vs, backend=backend)

        seconds = median_seconds(write, repeats, torch.cuda.synchronize)
        gbps = moved / seconds / 1e9
        result[backend] = {"seconds": seconds, "gbps": gbps, "fraction_of_peak": gbps / peak_gbps}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per CPU write")
    parser.add_argument("--gpu-tokens", type=int, default=65536, help="tokens per GPU write")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--peak-gbps", type=float, default=4800.0, help="device peak memory bandwidth, GB/s"
    )
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.gpu_tokens < 1 or args.repeats < 1 or args.peak_gbps <= 0:
        parser.error("--tokens, --gpu-tokens, --repeats and --peak-gbps must be positive")
    report: dict[str, Any] = {
        "benchmark": "kv_write",
        "torch": torch.__version__,
        "cpu": bench_cpu(args.tokens, args.repeats),
    }
    if torch.cuda.is_available():
        report["cuda"] = bench_cuda(args.gpu_tokens, args.repeats, args.peak_gbps)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
