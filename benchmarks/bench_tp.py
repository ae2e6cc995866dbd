"""tiny_engine on a mesh of ranks (tensor x pipeline x data parallel) against one rank, on CPU.

Writes a small random Llama checkpoint, then generates greedily for the same
prompts with each layout of ``--layouts`` (default ``tp1,tp2,pp2,dp2``; also
``tp2xpp2`` and ``dp2xtp2``, four processes), ``mp`` ranks, the engines taking
turns in this process (each timing the best of ``--repeats`` runs on fresh
prompts). Prints JSON: per layout, end-to-end tokens/s, the ratio to one
rank, the steps (the most any replica ran) and the time per step, and whether
its tokens equal one rank's; then what a stage transfer and a replica cost
here, and the arithmetic for hosts with cores of their own.

On a 2-core machine every layout's ranks split the same two cores, so no
gain is expected: the figures are the costs. Tensor parallelism adds its
collectives (two all-reduces per layer, one for the embedding and an
all-gather for the logits); a pipeline adds one send of the hidden states
per stage boundary and step, and its stages wait for each other; replicas
share the cores and the driver.

``python benchmarks/bench_tp.py [--layouts tp1,tp2,pp2,dp2 --layers 4 --hidden 512
--batch 8 --prompt-len 64 --max-tokens 32 --repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

LAYOUT = re.compile(r"^(?:(?:tp|pp|dp)\d+)(?:x(?:tp|pp|dp)\d+)*$")


def parse_layout(name: str) -> dict[str, int]:
    """``tp2xpp2`` -> the ``parallel`` section; ValueError for a malformed name."""
    if not LAYOUT.match(name):
        raise ValueError(
            f"layout {name!r} is not like tp2, pp2, dp2 or tp2xpp2 (parts tpN, ppN, dpN "
            "joined by x)"
        )
    keys = {
        "tp": "tensor_parallel_size",
        "pp": "pipeline_parallel_size",
        "dp": "data_parallel_size",
    }
    parallel: dict[str, int] = {}
    for part in name.split("x"):
        key, size = keys[part[:2]], int(part[2:])
        if size < 1 or key in parallel:
            raise ValueError(f"layout {name!r}: {part} repeats a part or is below 1")
        parallel[key] = size
    return parallel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="tp1,tp2,pp2,dp2")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="no compilation (faster start-up)")
    args = parser.parse_args(argv)
    sizes = (args.layers, args.hidden, args.heads, args.kv_heads, args.vocab, args.batch)
    if min(*sizes, args.prompt_len, args.max_tokens, args.repeats) < 1:
        parser.error("every size and count must be positive")
    names = [n.strip() for n in args.layouts.split(",") if n.strip()]
    try:
        layouts = {name: parse_layout(name) for name in names}
    except ValueError as exc:
        parser.error(str(exc))
    if "tp1" not in layouts:
        layouts = {"tp1": {"tensor_parallel_size": 1}, **layouts}  # the baseline
    try:
        import tiny_engine  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "examples" / "tiny_engine" / "src"))
    import torch
    from tiny_engine import LLM
    from tiny_engine.make_checkpoint import make_checkpoint

    with tempfile.TemporaryDirectory(prefix="bench-tp-") as tmp:
        path = make_checkpoint(
            Path(tmp),
            arch="llama",
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            vocab=args.vocab,
            max_positions=args.prompt_len + args.max_tokens + 1,
            init_std=0.05,
        )
        engines: dict[str, Any] = {}
        try:
            for name, parallel in layouts.items():
                ranks = math.prod(parallel.values())
                config = {
                    "model": {"dtype": "float32", "enforce_eager": args.eager},
                    "cache": {"kv_cache_memory_bytes": 256 << 20},
                    "parallel": {
                        **parallel,
                        "distributed_executor_backend": "uni" if ranks == 1 else "mp",
                    },
                }
                engines[name] = LLM(path, config=config)
                engines[name].wait_compiled()  # one rank may compile in the background
            gen = torch.Generator().manual_seed(0)
            results = {name: {"best_s": float("inf")} for name in engines}
            same = dict.fromkeys(engines, True)
            for _ in range(args.repeats):
                prompts = torch.randint(
                    3, args.vocab, (args.batch, args.prompt_len), generator=gen
                ).tolist()
                outputs = {}
                for name, llm in engines.items():
                    before = _steps(llm.stats)
                    start = time.perf_counter()
                    outputs[name] = llm.generate(
                        prompts, max_tokens=args.max_tokens, ignore_eos=True
                    )
                    seconds = time.perf_counter() - start
                    steps = _steps(llm.stats) - before
                    if seconds < results[name]["best_s"]:
                        results[name] = {"best_s": seconds, "steps": steps}
                for name in engines:
                    same[name] = same[name] and outputs[name] == outputs["tp1"]
        finally:
            for llm in engines.values():
                llm.close()
    tokens = args.batch * args.max_tokens
    report: dict[str, Any] = {
        "benchmark": "mesh",
        "device": "cpu",
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "model": {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab},
        "workload": {
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "max_tokens": args.max_tokens,
        },
        "layouts": {},
    }
    for name, parallel in layouts.items():
        best = results[name]
        report["layouts"][name] = {
            "parallel": parallel,
            "ranks": math.prod(parallel.values()),
            "tokens_per_s": tokens / best["best_s"],
            "seconds": best["best_s"],
            "steps": best["steps"],
            "ms_per_step": 1e3 * best["best_s"] / max(1, best["steps"]),
            "same_tokens_as_tp1": same[name],
        }
    base = report["layouts"]["tp1"]
    for entry in report["layouts"].values():
        entry["ratio_to_tp1"] = entry["tokens_per_s"] / base["tokens_per_s"]
        entry["extra_ms_per_step"] = entry["ms_per_step"] - base["ms_per_step"]
    report["costs_here"] = _costs(report["layouts"])
    # a decode step's hidden states: one row per sequence
    transfer = measure_transfer(args.batch, args.hidden)
    report["transfer"] = transfer
    report["on_hosts_of_their_own"] = _arithmetic(report["layouts"], transfer, args.layers)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


def _steps(stats: dict[str, Any]) -> int:
    """Steps run so far: the most any replica ran (replicas run side by side)."""
    replicas = stats.get("replicas")
    return max(r["steps"] for r in replicas) if replicas else int(stats["steps"])


def _costs(layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a stage boundary and a replica cost on this machine, from the figures: the
    extra time of a step over one rank's (which includes every rank's smaller share of
    the same cores, not only the transfers), and each replica's throughput against one
    rank with every core."""
    out: dict[str, Any] = {}
    for name, entry in layouts.items():
        parallel = entry["parallel"]
        pp = parallel.get("pipeline_parallel_size", 1)
        if pp > 1 and parallel.get("tensor_parallel_size", 1) == 1:
            # one send per boundary per step, the stages waiting for each other, and each
            # stage on its share of the cores
            out[f"{name}_extra_ms_per_step_per_stage_boundary"] = entry["extra_ms_per_step"] / (
                pp - 1
            )
        dp = parallel.get("data_parallel_size", 1)
        if dp > 1:
            out[f"{name}_throughput_per_replica_vs_tp1"] = entry["ratio_to_tp1"] / dp
    return out


def _arithmetic(
    layouts: dict[str, dict[str, Any]], transfer: dict[str, float], layers: int
) -> dict[str, str]:
    """What the measured one-rank step and transfer costs imply where every rank has the
    cores one rank has here (the arithmetic, not a measurement)."""
    base = layouts["tp1"]["ms_per_step"]
    send, reduce = transfer["send_ms"], transfer["all_reduce_ms"]
    out = {}
    for name, entry in layouts.items():
        parallel = entry["parallel"]
        tp = parallel.get("tensor_parallel_size", 1)
        pp = parallel.get("pipeline_parallel_size", 1)
        dp = parallel.get("data_parallel_size", 1)
        if name == "tp1":
            continue
        # tensor parallelism: 1/tp of the compute, two all-reduces per layer and two more
        # (embedding, logits); a pipeline: the stages one after another, one send per
        # boundary; replicas: side by side
        collectives = (2 * layers + 2) * reduce if tp > 1 else 0.0
        step = base / tp + collectives + (pp - 1) * send
        out[name] = (
            f"{base:.1f} ms / {tp} + {collectives:.1f} ms of all-reduces + {pp - 1} x "
            f"{send:.2f} ms of sends = {step:.1f} ms a step, {1e3 * dp / step:.0f} steps/s "
            f"over {dp} replica(s) ({1e3 / base:.0f} on one rank); 1/{tp * pp} of the "
            "weights per rank"
        )
    return out


def _transfer(rank: int, port: int, rows: int, hidden: int, rounds: int, out: Any) -> None:
    """One of two ranks timing a stage's send of ``[rows, hidden]`` float32 hidden states
    (half a ping-pong) and an all-reduce of the same tensor, over the CPU platform's
    communicators."""
    import os as _os

    _os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from hwplug.plugins.manager import platform_from_spec

    plat = platform_from_spec("cpu")
    plat.init_distributed(rank, 2, init_method=f"tcp://127.0.0.1:{port}")
    mesh = plat.init_model_parallel(1, 2)
    pipe, world = mesh.pp_communicator, plat.device_communicator()
    t = torch.ones(rows, hidden)
    other = 1 - rank
    for _round in range(2):  # a warm-up round, then the timed one
        world.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            if rank == 0:
                pipe.send(t, other)
                pipe.recv(t, other)
            else:
                pipe.recv(t, other)
                pipe.send(t, other)
        send_ms = 1e3 * (time.perf_counter() - start) / (2 * rounds)
        world.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            world.all_reduce(t)
        reduce_ms = 1e3 * (time.perf_counter() - start) / rounds
    if rank == 0:
        out.put({"send_ms": send_ms, "all_reduce_ms": reduce_ms})
    plat.destroy_distributed()


def measure_transfer(rows: int, hidden: int, rounds: int = 200) -> dict[str, float]:
    """Milliseconds of one stage send and one all-reduce of ``[rows, hidden]`` float32
    between two processes of this host (gloo on loopback)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_transfer, args=(r, port, rows, hidden, rounds, queue)) for r in range(2)
    ]
    for proc in procs:
        proc.start()
    try:
        result: dict[str, float] = queue.get(timeout=300)
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
    result["rows"], result["hidden"] = rows, hidden
    return result


if __name__ == "__main__":
    sys.exit(main())
