"""One decode step of a model: attention prepared once per step vs planned per layer.

Prints one JSON object with two parts, each timed side by side in this
process (median of interleaved repeats):

- ``step``: the attention of a whole decode step of ``--layers`` layers with
  the ``torch`` backend, three ways: ``prepared_once`` (the engine calls
  ``prepare`` once and every layer's ``forward`` takes the prepared step, as
  SPEC 12 says), ``planned_per_layer`` (every layer is given the metadata and
  plans the step itself from its host values) and ``read_back_per_layer``
  (metadata made from device tensors alone: every layer reads the lengths
  and tables back, as the backend did before steps were prepared; on a GPU
  each read is a synchronisation). Ratios are over ``prepared_once``.
- ``decode_vs_sdpa``: one layer's decode attention (prepared step, paged
  cache, pages scattered) against ``scaled_dot_product_attention`` over the
  same keys and values held contiguously, at batch ``--seqs`` and each
  context of ``--contexts``; ``ratio`` is the backend's time over SDPA's
  (the goal is at most 2).

Usage: ``python benchmarks/bench_attention_step.py [--layers N] [--seqs N]
[--step-context N] [--contexts 1024,2048,4096] [--dtype float32|bfloat16]
[--repeats N]``.
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


def interleaved_medians(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median seconds of each function, run in turn so all see the same machine state."""
    for _ in range(2):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return [statistics.median(samples) for samples in times]


def decode_batch(seqs: int, context: int, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """A decode step: one new token per sequence, each sequence's pages scattered."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = -(-context // BLOCK_SIZE)
    num_blocks = seqs * per_seq + 1
    order = torch.randperm(num_blocks, generator=gen).tolist()
    table = [order[i * per_seq : (i + 1) * per_seq] for i in range(seqs)]
    metadata = AttentionMetadata.from_lengths([context] * seqs, [1] * seqs, table, BLOCK_SIZE)
    shape = (num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)
    return {
        "query": torch.randn(seqs, HEADS, HEAD_SIZE, generator=gen).to(dtype),
        "key": torch.randn(seqs, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype),
        "value": torch.randn(seqs, KV_HEADS, HEAD_SIZE, generator=gen).to(dtype),
        "key_cache": torch.randn(shape, generator=gen).to(dtype),
        "value_cache": torch.randn(shape, generator=gen).to(dtype),
        "metadata": metadata,
        "num_blocks": num_blocks,
    }


def bench_step(layers: int, seqs: int, context: int, dtype: torch.dtype, repeats: int) -> dict:
    batch = decode_batch(seqs, context, dtype)
    meta: AttentionMetadata = batch["metadata"]
    device_only = AttentionMetadata(
        meta.query_start_loc, meta.seq_lens, meta.block_table, meta.slot_mapping
    )
    impl = TorchAttentionBackend(HEADS, HEAD_SIZE, KV_HEADS, HEAD_SIZE**-0.5)
    tensors = [batch[k] for k in ("query", "key", "value", "key_cache", "value_cache")]

    def prepared_once() -> None:
        step = TorchAttentionBackend.prepare(
            meta, num_blocks=batch["num_blocks"], block_size=BLOCK_SIZE
        )
        for _ in range(layers):
            impl.forward(*tensors, step)

    def planned_per_layer() -> None:
        for _ in range(layers):
            impl.forward(*tensors, meta)

    def read_back_per_layer() -> None:
        for _ in range(layers):
            impl.forward(*tensors, device_only)

    once, per_layer, read_back = interleaved_medians(
        [prepared_once, planned_per_layer, read_back_per_layer], repeats
    )
    return {
        "layers": layers,
        "seqs": seqs,
        "context": context,
        "prepared_once_s": once,
        "planned_per_layer_s": per_layer,
        "read_back_per_layer_s": read_back,
        "planned_per_layer_ratio": per_layer / once,
        "read_back_per_layer_ratio": read_back / once,
    }


def bench_decode(seqs: int, contexts: list[int], dtype: torch.dtype, repeats: int) -> list[dict]:
    results = []
    for context in contexts:
        batch = decode_batch(seqs, context, dtype, seed=context)
        step = TorchAttentionBackend.prepare(
            batch["metadata"], num_blocks=batch["num_blocks"], block_size=BLOCK_SIZE
        )
        impl = TorchAttentionBackend(HEADS, HEAD_SIZE, KV_HEADS, HEAD_SIZE**-0.5)
        tensors = [batch[k] for k in ("query", "key", "value", "key_cache", "value_cache")]
        q = batch["query"].unsqueeze(2)
        k = torch.randn(seqs, KV_HEADS, context, HEAD_SIZE).to(dtype)
        v = torch.randn(seqs, KV_HEADS, context, HEAD_SIZE).to(dtype)

        def backend(
            impl: TorchAttentionBackend = impl, tensors: list = tensors, step: Any = step
        ) -> object:
            return impl.forward(*tensors, step)

        def sdpa(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> object:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k, v, scale=HEAD_SIZE**-0.5, enable_gqa=True
            )

        t_backend, t_sdpa = interleaved_medians([backend, sdpa], repeats)
        results.append(
            {
                "context": context,
                "backend_s": t_backend,
                "sdpa_s": t_sdpa,
                "ratio": t_backend / t_sdpa,
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--step-context", type=int, default=256)
    parser.add_argument("--contexts", default="1024,2048,4096")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--contexts {args.contexts!r}: give comma-separated token counts")
    if (
        min([args.layers, args.seqs, args.step_context, args.repeats, *contexts]) < 1
        or not contexts
    ):
        parser.error("--layers, --seqs, --step-context, --contexts and --repeats must be positive")
    dtype = getattr(torch, args.dtype)
    report = {
        "benchmark": "attention_step",
        "device": "cpu",
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "heads": HEADS,
        "kv_heads": KV_HEADS,
        "head_size": HEAD_SIZE,
        "block_size": BLOCK_SIZE,
        "step": bench_step(args.layers, args.seqs, args.step_context, dtype, args.repeats),
        "decode_vs_sdpa": bench_decode(args.seqs, contexts, dtype, args.repeats),
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
