#!/usr/bin/env python
"""What one decode step of one user costs beside its kernels, measured by taking them out.

tiny_engine is built as ``bench_peers.py`` builds it, a one-token decode step
is prepared, and its host step graph (the compiled step, Inductor's C++
wrapper) is called five ways, interleaved, ``--repeats`` rounds (medians):

- ``door``: as the engine calls it, each linear through its op's C++ door
  (:mod:`hwplug.kernels.op_door`; where the door is not loaded, as ``full``);
- ``full``: the same step with the door closed (``HWPLUG_NATIVE_DOOR=0``),
  every linear entering Python, so that the ways below can take kernels out
  by replacing Python functions;
- ``no_kernels``: every linear returns an empty tensor and every attention
  op its output buffer, so what is left is the step's skeleton: Inductor's
  own kernels (norms, rotary, activations, residuals), the dispatch of each
  custom op into Python and Dynamo's guards;
- ``attention_only``: the skeleton with the real attention ops (their Python
  and the native decode kernel);
- ``linears_only``: the skeleton with the real linears (the door's Python and
  the native kernel).

In every round the native calls themselves are timed too (``bindings.linear``
and ``bindings.paged_decode``: the ctypes call and the kernel), so the report
splits the step into the kernels, the Python of their doors, the skeleton, and
what the full step costs beyond them (``interaction``); ``door_step_ms`` is
the ``door`` way's step. JSON on stdout, milliseconds per step.

``PYTHONPATH=src:examples/tiny_engine/src python benchmarks/bench_step_overhead.py
[--model llama250m | --checkpoint DIR] [--dtype bf16|fp32] [--context 192]
[--repeats 30]``
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peers  # (beside this file)


def attribute(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """Split a step into its parts from each way's medians (``times[way]``: ``step``, and
    ``linear`` and ``attention``, the ms its native calls took):

    - ``linear kernels`` and ``attention kernel``: the full step's native calls;
    - ``linear doors``: what the linears add to the skeleton beyond their native calls;
    - ``attention Python``: the same for the attention ops;
    - ``skeleton``: Inductor's kernels, the custom ops' dispatch and Dynamo's guards;
    - ``interaction``: what the full step costs beyond those parts (kernels slowed by
      what runs between them, and noise).
    """
    skeleton = times["no_kernels"]["step"]
    linears = times["linears_only"]
    attention = times["attention_only"]
    full = times["full"]
    parts = {
        "linear kernels": full["linear"],
        "linear doors": linears["step"] - skeleton - linears["linear"],
        "attention kernel": full["attention"],
        "attention Python": attention["step"] - skeleton - attention["attention"],
        "skeleton": skeleton,
    }
    parts["interaction"] = full["step"] - sum(parts.values())
    return {name: round(value, 3) for name, value in parts.items()}


def _medians(
    ways: dict[str, Callable[[], Any]], native: dict[str, float], repeats: int
) -> dict[str, dict[str, float]]:
    """Each way run in turn ``repeats`` times: the median ms of the step and of its native
    linear and attention calls (``native`` is what the timed calls add to)."""
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, call in ways.items():
            native["linear"] = native["attention"] = 0.0
            start = time.perf_counter()
            call()
            step = (time.perf_counter() - start) * 1e3
            samples[name].append((step, native["linear"], native["attention"]))
    return {
        name: {
            part: round(statistics.median(row[i] for row in rows), 3)
            for i, part in enumerate(("step", "linear", "attention"))
        }
        for name, rows in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama250m", choices=sorted(bench_peers.MODELS))
    parser.add_argument("--dtype", default="bf16", choices=sorted(bench_peers.DTYPES))
    parser.add_argument("--context", type=int, default=192, help="tokens before the step")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/hwplug-peers/models"))
    parser.add_argument(
        "--checkpoint", type=Path, help="a checkpoint directory instead of --model's"
    )
    args = parser.parse_args(argv)

    import torch
    from tiny_engine import runner as runner_module

    from hwplug.attention.context import forward_context
    from hwplug.core.config import CUDAGraphMode
    from hwplug.kernels import bindings, op_door
    from hwplug.kernels.native import DOOR_ENV

    if args.checkpoint is not None:
        checkpoint = args.checkpoint
        vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    else:
        checkpoint = bench_peers.ensure_checkpoint(args.cache, args.model)
        vocab = bench_peers.MODELS[args.model]["vocab"]
    prompt = [(i * 37) % (vocab - 8) + 5 for i in range(args.context)]
    worker = bench_peers.TinyEngineWorker(
        argparse.Namespace(
            checkpoint=str(checkpoint),
            dtype=args.dtype,
            threads=0,
            workload_shapes={"count": 1, "tokens": args.context, "max_len": args.context + 8},
        )
    )
    worker.load()
    worker.settle()
    llm = worker.llm
    runner = llm.runner
    if runner is None or runner.step_graph is None:
        print(json.dumps({"error": "no host step graph in this process (one-rank engine only)"}))
        return 1

    # a decode step's prepared inputs, as the engine made them
    steps: list[tuple[Any, ...]] = []
    prepare = runner_module.ModelRunner.prepare

    def keep(self: Any, step: Any) -> Any:
        made = prepare(self, step)
        if made[0] is CUDAGraphMode.FULL and not steps:
            steps.append(made)
        return made

    runner_module.ModelRunner.prepare = keep  # type: ignore[method-assign]
    try:
        llm.generate([prompt], max_tokens=[3], ignore_eos=True)
    finally:
        runner_module.ModelRunner.prepare = prepare  # type: ignore[method-assign]
    if not steps:
        print(json.dumps({"error": "no decode step ran on a host step graph"}))
        return 1
    _, key, step_args, prepared, _ = steps[0]
    graph = runner.step_graph.graph_for(key)

    linear_module = importlib.import_module("hwplug.kernels.linear")
    attention_module = importlib.import_module("hwplug.attention._unified_op")
    real_linear, real_attention = linear_module._native, attention_module._run

    def no_linear(x: torch.Tensor, weight: torch.Tensor, bias: Any) -> torch.Tensor:
        return torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype)

    def no_attention(*call: Any) -> torch.Tensor:
        return call[-1] if call[-1] is not None else torch.empty_like(call[0])

    def way(linear: Any, attention: Any, *, door: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            linear_module._native, attention_module._run = linear, attention
            # the ways that take kernels out replace Python functions, which the linear
            # op's C++ door would not call: it is closed for them (read at each call)
            os.environ[DOOR_ENV] = "1" if door else "0"
            try:
                return graph(*step_args)
            finally:
                linear_module._native, attention_module._run = real_linear, real_attention
                os.environ[DOOR_ENV] = door_setting

        return run

    door_setting = os.environ.get(DOOR_ENV, "1")
    ways = {
        "full": way(real_linear, real_attention),
        "no_kernels": way(no_linear, no_attention),
        "attention_only": way(no_linear, real_attention),
        "linears_only": way(real_linear, no_attention),
        "door": way(real_linear, real_attention, door=True),
    }
    native = {"linear": 0.0, "attention": 0.0}
    calls = {"linear": bindings.linear, "attention": bindings.paged_decode}

    def timed(kind: str) -> Callable[..., Any]:
        original = calls[kind]

        def call(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                native[kind] += (time.perf_counter() - start) * 1e3

        return call

    bindings.linear, bindings.paged_decode = timed("linear"), timed("attention")
    try:
        with torch.inference_mode(), forward_context(prepared):
            for run in ways.values():  # (warm)
                run()
            times = _medians(ways, native, args.repeats)
    finally:
        bindings.linear, bindings.paged_decode = calls["linear"], calls["attention"]
    report = {
        "model": str(args.checkpoint) if args.checkpoint is not None else args.model,
        "dtype": args.dtype,
        "context": args.context,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "median_ms": times,
        "parts_ms": attribute(times),
        # the step as the engine runs it, the linears through their op's C++ door (where
        # it is loaded: hwplug.kernels.op_door), beside the full step without it
        "door_step_ms": times["door"]["step"],
        "op_door": op_door.unavailable_reason() or "open",
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
