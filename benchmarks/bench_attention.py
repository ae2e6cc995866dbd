"""Decode-step speed of the attention backends (``hwplug.attention``).

Prints one JSON object:

- ``cpu``: the ``torch`` backend's decode step (write one new token per
  sequence, then attend over every sequence's paged cache) against a plain
  ``scaled_dot_product_attention`` over the same tokens held contiguously
  (``[seqs, heads, 1, head_size]`` queries, ``[seqs, kv_heads, context,
  head_size]`` keys and values, grouped heads), timed side by side in this
  process (median of interleaved repeats), for several model/cache dtypes.
  ``ratio`` is the backend's time over SDPA's (the goal is at most 3).
- ``cuda`` (when a GPU is present): the ``triton`` backend's decode step,
  its bandwidth counted as the bytes of keys and values it reads, as a
  fraction of a device-to-device copy's bandwidth (bytes read plus written)
  measured in the same run; and ``cuda_graph``: the forward captured in a
  CUDA graph, replayed on new tokens, lengths and scales, against an eager
  forward (``ok`` when bit-identical). The exit status is 1 when it is not.

Usage: ``python benchmarks/bench_attention.py [--seqs N] [--context N] [--repeats N]``.
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

from hwplug.attention import AttentionMetadata, TorchAttentionBackend

HEADS, KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
CPU_CASES = [
    ("float32", "float32"),
    ("bfloat16", "bfloat16"),
    ("bfloat16", "float8_e4m3fn"),
    ("float32", "float8_e5m2"),
]


def decode_step(
    seq_lens: list[int],
    model_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: str,
    *,
    num_blocks: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Forward arguments for a decode batch: one new token per sequence, pages scattered."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = num_blocks or sum(needed) + 1
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table, used = [], 0
    for n in needed:
        table.append(order[used : used + n])
        used += n
    metadata = AttentionMetadata.from_lengths(
        seq_lens, [1] * len(seq_lens), table, BLOCK_SIZE, device=device
    )
    seqs = len(seq_lens)
    shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    return {
        "query": torch.randn(seqs, HEADS, HEAD_SIZE, generator=gen).to(device, model_dtype),
        "key": torch.randn(seqs, KV_HEADS, HEAD_SIZE, generator=gen).to(device, model_dtype),
        "value": torch.randn(seqs, KV_HEADS, HEAD_SIZE, generator=gen).to(device, model_dtype),
        "key_cache": torch.randn(shape, generator=gen).to(device, cache_dtype),
        "value_cache": torch.randn(shape, generator=gen).to(device, cache_dtype),
        "metadata": metadata,
    }


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, run in turn so all see the same machine state."""
    for _ in range(3):  # warm up: compile, and let the allocator settle
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def bench_cpu(seqs: int, context: int, repeats: int) -> dict[str, Any]:
    results = []
    for model_name, cache_name in CPU_CASES:
        model_dtype, cache_dtype = getattr(torch, model_name), getattr(torch, cache_name)
        batch = decode_step([context] * seqs, model_dtype, cache_dtype, "cpu")
        impl = TorchAttentionBackend(
            HEADS, HEAD_SIZE, KV_HEADS, HEAD_SIZE**-0.5, cache_dtype=cache_dtype
        )
        scales = {"k_scale": 0.02, "v_scale": 0.02} if cache_dtype.itemsize == 1 else {}
        q = batch["query"].unsqueeze(2)
        k = torch.randn(seqs, KV_HEADS, context, HEAD_SIZE).to(model_dtype)
        v = torch.randn(seqs, KV_HEADS, context, HEAD_SIZE).to(model_dtype)

        def backend(
            impl: TorchAttentionBackend = impl, batch: dict = batch, scales: dict = scales
        ) -> object:
            return impl.forward(**batch, **scales)

        def sdpa(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> object:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, scale=HEAD_SIZE**-0.5, enable_gqa=True
            )

        t_backend, t_sdpa = interleaved_medians([backend, sdpa], repeats)
        results.append(
            {
                "model_dtype": model_name,
                "cache_dtype": cache_name,
                "backend_s": t_backend,
                "sdpa_s": t_sdpa,
                "ratio": t_backend / t_sdpa,
            }
        )
    return {
        "seqs": seqs,
        "context": context,
        "num_heads": HEADS,
        "num_kv_heads": KV_HEADS,
        "head_size": HEAD_SIZE,
        "block_size": BLOCK_SIZE,
        "threads": torch.get_num_threads(),
        "cases": results,
        "max_ratio": max(r["ratio"] for r in results),
    }


def cuda_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn`` on the current stream, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def copy_bandwidth(repeats: int, nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy, counting bytes read and written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = cuda_seconds(lambda: dst.copy_(src), repeats)
    return 2 * nbytes / seconds / 1e9


def bench_cuda(seqs: int, context: int, repeats: int) -> dict[str, Any]:
    from hwplug.attention import TritonAttentionBackend

    copy_gbps = copy_bandwidth(repeats)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "seqs": seqs,
        "context": context,
        "copy_gbps": copy_gbps,
    }
    for model_name, cache_name in (("bfloat16", "bfloat16"), ("bfloat16", "float8_e4m3fn")):
        cache_dtype = getattr(torch, cache_name)
        model_dtype = getattr(torch, model_name)
        batch = decode_step([context] * seqs, model_dtype, cache_dtype, "cuda")
        impl = TritonAttentionBackend(
            HEADS, HEAD_SIZE, KV_HEADS, HEAD_SIZE**-0.5, cache_dtype=cache_dtype
        )
        scale = torch.tensor(0.02, device="cuda")

        def step(
            impl: TritonAttentionBackend = impl, batch: dict = batch, scale: object = scale
        ) -> object:
            return impl.forward(**batch, k_scale=scale, v_scale=scale)

        seconds = cuda_seconds(step, repeats)
        kv_bytes = 2 * seqs * context * KV_HEADS * HEAD_SIZE * cache_dtype.itemsize
        gbps = kv_bytes / seconds / 1e9
        result[f"triton_{cache_name}"] = {
            "seconds": seconds,
            "kv_bytes_read": kv_bytes,
            "gbps": gbps,
            "fraction_of_copy": gbps / copy_gbps,
        }
    result["cuda_graph"] = cuda_graph_check()
    return result


def cuda_graph_check() -> dict[str, Any]:
    """Capture the Triton forward, replay it on a new step, compare with an eager forward."""
    from hwplug.attention import TritonAttentionBackend

    fp8 = torch.float8_e4m3fn
    impl = TritonAttentionBackend(HEADS, HEAD_SIZE, KV_HEADS, HEAD_SIZE**-0.5, cache_dtype=fp8)
    static = decode_step([300] * 8, torch.bfloat16, fp8, "cuda", num_blocks=160)
    scales = {
        "k_scale": torch.tensor(0.02, device="cuda"),
        "v_scale": torch.tensor(0.03, device="cuda"),
    }

    def step() -> torch.Tensor:
        return impl.forward(**static, **scales)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    # the next step: same shapes (8 sequences, 160 blocks), other lengths, tokens, scales
    nxt = decode_step(
        [280, 1, 299, 150, 17, 300, 64, 2], torch.bfloat16, fp8, "cuda", num_blocks=160, seed=1
    )
    eager = {
        **nxt,
        "key_cache": nxt["key_cache"].clone(),
        "value_cache": nxt["value_cache"].clone(),
    }
    for name in ("query", "key", "value", "key_cache", "value_cache"):
        static[name].copy_(nxt[name])
    for field in ("query_start_loc", "seq_lens", "slot_mapping"):
        getattr(static["metadata"], field).copy_(getattr(nxt["metadata"], field))
    table = static["metadata"].block_table
    table.zero_()
    table[:, : nxt["metadata"].block_table.shape[1]].copy_(nxt["metadata"].block_table)
    scales["k_scale"].fill_(0.05)
    scales["v_scale"].fill_(0.01)
    graph.replay()
    torch.cuda.synchronize()
    want = impl.forward(**eager, **scales)
    diff = (out.float() - want.float()).abs().max().item()
    return {"max_abs_diff": diff, "ok": diff == 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seqs", type=int, default=32, help="decoding sequences (CPU)")
    parser.add_argument("--context", type=int, default=512, help="tokens per sequence (CPU)")
    parser.add_argument("--gpu-seqs", type=int, default=64)
    parser.add_argument("--gpu-context", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    if min(args.seqs, args.context, args.gpu_seqs, args.gpu_context, args.repeats) < 1:
        parser.error("--seqs, --context, --gpu-seqs, --gpu-context and --repeats must be positive")
    report: dict[str, Any] = {
        "benchmark": "attention_decode",
        "torch": torch.__version__,
        "cpu": bench_cpu(args.seqs, args.context, args.repeats),
    }
    status = 0
    if torch.cuda.is_available():
        report["cuda"] = bench_cuda(args.gpu_seqs, args.gpu_context, args.repeats)
        status = 0 if report["cuda"]["cuda_graph"]["ok"] else 1
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
