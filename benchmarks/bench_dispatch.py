"""Cost of ``GraphDispatcher.dispatch`` against the bare table look-up it wraps.

The baseline is inline code doing the same work by hand: bounds check, one
look-up in ``bs_to_padded_graph_size`` and building the same result tuple.
Both run in this process over the same batches, alternated in rounds so
drift on a shared machine hits both alike; the figure that matters is the
ratio of the medians. Prints one JSON object. Goal: ratio <= 3.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable

from hwplug.core.config import CompilationConfig, CUDAGraphMode
from hwplug.core.graphs import BatchDescriptor, GraphDispatcher


def make_dispatcher() -> tuple[GraphDispatcher, CompilationConfig]:
    config = CompilationConfig(level=3, cudagraph_mode="FULL_AND_PIECEWISE")
    config.init_with_cudagraph_sizes([1, 2, 4, *range(8, 513, 8)])
    return GraphDispatcher(config), config


def make_baseline(config: CompilationConfig) -> Callable[[BatchDescriptor], object]:
    table = config.bs_to_padded_graph_size
    assert table is not None
    largest = len(table) - 1
    none, piecewise, full = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL

    def baseline(batch: BatchDescriptor) -> object:
        n = batch[0]
        if 0 < n <= largest:
            if batch[1]:
                return (full, BatchDescriptor(table[n], True))
            return (piecewise, BatchDescriptor(table[n], False))
        return (none, batch)

    return baseline


def time_loop(fn: Callable[[BatchDescriptor], object], batches: list[BatchDescriptor]) -> float:
    start = time.perf_counter_ns()
    for batch in batches:
        fn(batch)
    return (time.perf_counter_ns() - start) / len(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    dispatcher, config = make_dispatcher()
    baseline = make_baseline(config)
    rng = random.Random(0)
    # Mostly in range, some uniform-decode, a few above the largest size.
    batches = [BatchDescriptor(rng.randint(1, 600), rng.random() < 0.5) for _ in range(args.calls)]
    for batch in batches[:1000]:  # the two must give the same answers
        assert dispatcher.dispatch(batch) == baseline(batch), batch

    dispatch = dispatcher.dispatch
    time_loop(dispatch, batches[:10_000])
    time_loop(baseline, batches[:10_000])
    ours: list[float] = []
    base: list[float] = []
    for _ in range(args.rounds):
        ours.append(time_loop(dispatch, batches))
        base.append(time_loop(baseline, batches))
    ours_med, base_med = statistics.median(ours), statistics.median(base)
    print(
        json.dumps(
            {
                "benchmark": "graph_dispatch",
                "dispatch_ns_per_call": round(ours_med, 1),
                "baseline_ns_per_call": round(base_med, 1),
                "ratio": round(ours_med / base_med, 3),
                "goal": "ratio <= 3",
                "calls_per_round": args.calls,
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
