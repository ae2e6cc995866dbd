"""What a CPU step costs on each kind of compiled code: the options for host step graphs.

For one tiny_engine model (a checkpoint of benchmarks/bench_peers.py) and
each decode batch size, the time of one model forward (a uniform decode step;
no scheduling, sampling or logits) on:

- ``eager``: the model's own Python, op by op;
- ``dynamic``: the engine's compiled model (one Inductor graph with dynamic
  shapes, Python wrapper): what a step runs without step graphs;
- ``static``: a graph compiled for the batch's static shapes, Python wrapper;
- ``static_cpp``: the same with Inductor's C++ wrapper: the CPU platform's
  host step graphs (:class:`hwplug.compilation.InductorStepBackend`).

Options are interleaved, best of ``--rounds`` runs of ``--calls`` forwards;
ratios are ``dynamic`` over each option (above 1: faster than the engine's
graph). Prints JSON.

``PYTHONPATH=src:examples/tiny_engine/src python benchmarks/bench_step_graphs.py
--checkpoint /tmp/hwplug-peers/models/llama250m/hf --dtype float32 --sizes 1,4,16``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def _time_key(
    runner: Any, wrappers: dict[str, Any], key: Any, inputs: Any, calls: int, rounds: int
) -> dict[str, float]:
    """Seconds per forward of each option on ``key``'s inputs: the best of ``rounds``
    runs of ``calls`` forwards, options interleaved."""
    from hwplug.attention import forward_context
    from hwplug.core.config import CUDAGraphMode
    from hwplug.core.graphs import graph_context

    step_args, prepared = inputs

    def call(fn: Any, mode: CUDAGraphMode = CUDAGraphMode.NONE) -> Any:
        with forward_context(prepared), graph_context(mode, key):
            return fn(*step_args)

    options = {
        "eager": lambda: call(runner.model),
        "dynamic": lambda: call(runner.compiled),
        **{name: (lambda w=w: call(w, CUDAGraphMode.FULL)) for name, w in wrappers.items()},
    }
    best = dict.fromkeys(options, float("inf"))
    for fn in options.values():
        fn()
    for _ in range(rounds):
        for name, fn in options.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s}, reverse=True)
    os.environ["HWPLUG_CPU_STEP_GRAPHS"] = "0"  # built here, one option at a time
    os.environ["HWPLUG_BACKGROUND_COMPILE"] = "0"

    import torch
    from tiny_engine import LLM

    from hwplug.attention import forward_context
    from hwplug.compilation import InductorStepBackend, StepGraphWrapper
    from hwplug.core.config import CUDAGraphMode
    from hwplug.core.graphs import BatchDescriptor, capture_graphs

    config = {
        "model": {"dtype": args.dtype, "max_model_len": 512},
        "scheduler": {"max_num_seqs": max(sizes), "max_num_batched_tokens": 2048},
        "cache": {"kv_cache_memory_bytes": 1 << 30},
    }
    llm = LLM(args.checkpoint, config=config, platform="cpu")
    runner = llm.runner
    compilation = runner.config.compilation
    options = dict(compilation.inductor_compile_config or {})
    wrappers = {
        name: StepGraphWrapper(
            runner.model,
            compilation,
            CUDAGraphMode.FULL,
            InductorStepBackend(options, cpp_wrapper=cpp),
        )
        for name, cpp in (("static", False), ("static_cpp", True))
    }
    keys = [BatchDescriptor(n, True) for n in sizes]
    report: dict[str, Any] = {
        "checkpoint": args.checkpoint,
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "compile_seconds": {},
        "ms_per_forward": {},
        "dynamic_over": {},
    }
    with torch.inference_mode():
        inputs = {key: runner._dummy_inputs(key.num_tokens, key.num_tokens, True) for key in keys}
        for name, wrapper in wrappers.items():

            def build(key: BatchDescriptor, wrapper: Any = wrapper) -> None:
                step_args, prepared = inputs[key]
                with forward_context(prepared):
                    wrapper(*step_args)

            started = time.perf_counter()
            capture_graphs(build, {CUDAGraphMode.FULL: keys}, pause_gc=False)
            report["compile_seconds"][name] = round(time.perf_counter() - started, 1)
        for key in keys:
            best = _time_key(runner, wrappers, key, inputs[key], args.calls, args.rounds)
            n = str(key.num_tokens)
            report["ms_per_forward"][n] = {k: round(v * 1e3, 3) for k, v in best.items()}
            report["dynamic_over"][n] = {
                k: round(best["dynamic"] / v, 3) for k, v in best.items() if k != "dynamic"
            }
    llm.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
