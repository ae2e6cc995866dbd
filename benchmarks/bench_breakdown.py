#!/usr/bin/env python
"""Where tiny_engine's time goes on a CPU, over one workload of bench_peers.py.

The engine is built exactly as ``bench_peers.py`` builds it (its
``TinyEngineWorker``, on the same checkpoint and prompts); during the timed
run the wall time of these calls is summed: hwplug's oneDNN linears, the
torch attention backend (and, inside it, the page gathers and the native
decode kernel), the runner's
input preparation, and the runner's whole step. What is outside the step is
the scheduler and sampling. JSON on stdout, seconds.

``python benchmarks/bench_breakdown.py [--model bench|llama250m] [--workload
fixed|mix|single] [--dtype fp32|bf16] [--cache /tmp/hwplug-peers/models]``
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peers  # (beside this file)

TIMED = (
    ("hwplug.kernels.linear", None, "_native", "linears (native kernel or oneDNN)"),
    ("hwplug.kernels.linear", None, "_onednn", "linears: oneDNN"),
    ("hwplug.attention.torch_backend", "TorchAttentionBackend", "attend", "attention"),
    ("hwplug.attention.torch_backend", "_Pages", "gather", "attention: page gathers"),
    ("hwplug.kernels.cpu_decode", None, "run", "attention: native decode kernel"),
    ("tiny_engine.runner", "ModelRunner", "prepare", "step inputs and metadata"),
    ("tiny_engine.runner", "ModelRunner", "execute", "runner steps"),
)


def _time_calls(seconds: dict[str, float]) -> None:
    """Wrap each call of ``TIMED`` so that its wall time is added to ``seconds``."""
    for module_name, owner_name, name, label in TIMED:
        module = importlib.import_module(module_name)
        owner: Any = module if owner_name is None else getattr(module, owner_name)
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args: Any, _original: Any = original, _label: str = label, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return _original(*args, **kw)
            finally:
                seconds[_label] = seconds.get(_label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bench", choices=sorted(bench_peers.MODELS))
    parser.add_argument("--workload", default="fixed", choices=["fixed", "mix", "single"])
    parser.add_argument("--dtype", default="fp32", choices=sorted(bench_peers.DTYPES))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/hwplug-peers/models"))
    args = parser.parse_args(argv)
    vocab = bench_peers.MODELS[args.model]["vocab"]
    timed = bench_peers.workload(args.workload, vocab, 0)
    warm = bench_peers.workload(args.workload, vocab, 2)
    worker_args = argparse.Namespace(
        checkpoint=str(bench_peers.ensure_checkpoint(args.cache, args.model)),
        dtype=args.dtype,
        threads=0,
        workload_shapes=bench_peers.workload_shapes([timed]),
    )
    worker = bench_peers.TinyEngineWorker(worker_args)
    worker.load()
    worker.settle()
    worker.generate(warm["prompts"], [min(2, n) for n in warm["max_tokens"]])
    seconds: dict[str, float] = {}
    _time_calls(seconds)
    start = time.perf_counter()
    worker.generate(timed["prompts"], timed["max_tokens"])
    total = time.perf_counter() - start
    report = {
        "model": args.model,
        "workload": args.workload,
        "dtype": args.dtype,
        "seconds": round(total, 3),
        **{label: round(value, 3) for label, value in seconds.items()},
        "scheduler and sampling": round(total - seconds.get("runner steps", 0.0), 3),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
