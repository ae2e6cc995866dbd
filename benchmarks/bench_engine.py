"""tiny_engine against transformers' generate() on the same checkpoint, on CPU.

Writes a small random Llama checkpoint (4 layers, hidden 512, vocabulary
8192), then generates greedily for 16 prompts of 128 tokens, 128 new tokens
each, with transformers' ``generate()`` (one batch, KV cache, SDPA) and with
tiny_engine (continuous batching, paged attention through hwplug, the CPU's
resolved compilation). Both run fp32 in
this process, taking turns; each timing is the best of ``--repeats`` runs on
fresh prompts (no prefix-cache hits). Prints JSON: end-to-end and decode
throughput of each, and the ratios.

Decode throughput is the tokens after the first divided by the time after the
prefill (the end-to-end time minus the time of a one-token generation).

On a GPU machine ``--device cuda`` runs both on the GPU: transformers'
model moved there, tiny_engine on the current (CUDA or ROCm) platform as it
resolves (piecewise compilation, captured CUDA graphs, Triton attention),
timed after a device synchronisation.

``python benchmarks/bench_engine.py [--device cpu|cuda --layers 4 --hidden 512
--batch 16 --prompt-len 128 --max-tokens 128 --repeats 3 --threads N --set
section.field=value --peers-json FILE]``

``--peers-json`` takes the JSON of benchmarks/bench_peers.py and adds its
end-to-end ratios over transformers (model ``bench``, workload ``fixed``, the
same shapes as here) as ``peer_ratios``; ``ratio_e2e`` stays this run's own.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _import_engine() -> None:
    try:
        import tiny_engine  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "examples" / "tiny_engine" / "src"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--set", dest="assignments", action="append", default=[])
    parser.add_argument(
        "--peers-json", type=Path, default=None, help="bench_peers.py's JSON: add its ratios"
    )
    args = parser.parse_args(argv)
    _import_engine()

    import torch
    import transformers
    from tiny_engine import LLM
    from tiny_engine.make_checkpoint import make_checkpoint

    from hwplug.cli import parse_set_option

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "bench_engine: --device cuda needs a CUDA or ROCm GPU; none is visible", file=sys.stderr
        )
        return 2
    device = torch.device(args.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    if args.threads:
        torch.set_num_threads(args.threads)
    batch, plen, new = args.batch, args.prompt_len, args.max_tokens
    gen = torch.Generator().manual_seed(0)

    def prompts(run: int) -> list[list[int]]:
        del run  # fresh prompts every run: nothing is served from the prefix cache
        return torch.randint(3, args.vocab, (batch, plen), generator=gen).tolist()

    with tempfile.TemporaryDirectory() as tmp:
        path = make_checkpoint(
            Path(tmp) / "ckpt",
            arch="llama",
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            intermediate=int(args.hidden * 2.75),
            vocab=args.vocab,
            max_positions=max(512, plen + new),
            init_std=0.02,
        )

        # -- transformers --------------------------------------------------------------
        hf: Any = (
            transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, args.dtype)
            )
            .to(device)
            .eval()
        )

        def hf_run(tokens: int) -> Callable[[int], float]:
            def run(i: int) -> float:
                ids = torch.tensor(prompts(i), device=device)
                sync()
                start = time.perf_counter()
                with torch.inference_mode():
                    hf.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=tokens,
                        min_new_tokens=tokens,
                        do_sample=False,
                        pad_token_id=0,
                    )
                sync()
                return time.perf_counter() - start

            return run

        # -- tiny_engine ----------------------------------------------------------------
        config: dict[str, Any] = {
            "model": {"dtype": args.dtype, "max_model_len": plen + new},
            "scheduler": {"max_num_seqs": batch, "max_num_batched_tokens": batch * plen},
            "cache": {"kv_cache_memory_bytes": 1 << 30},
        }
        for text in args.assignments:
            (section, field, *_), value = parse_set_option(text)
            config.setdefault(section, {})[field] = value
        start = time.perf_counter()
        # cpu: the CPU platform even on a GPU machine; cuda: the current platform
        llm = LLM(path, config=config, platform="cpu" if device.type == "cpu" else None)
        init_s = time.perf_counter() - start
        llm.wait_compiled()  # a model compiling in the background: time it compiled
        compiled_s = time.perf_counter() - start

        def te_run(tokens: int) -> Callable[[int], float]:
            def run(i: int) -> float:
                batch_prompts = prompts(i)
                sync()
                start = time.perf_counter()
                llm.generate(batch_prompts, max_tokens=tokens, ignore_eos=True)
                sync()
                return time.perf_counter() - start

            return run

        # Alternate the two, round after round, and keep each one's best: on a shared
        # machine the load changes from second to second, and both see the same spells.
        hf_run(4)(0)  # warm-up
        te_run(4)(0)
        runs: dict[str, list[float]] = {"hf_e2e": [], "te_e2e": [], "hf_pre": [], "te_pre": []}
        for i in range(args.repeats):
            runs["hf_e2e"].append(hf_run(new)(i))
            runs["te_e2e"].append(te_run(new)(i))
            runs["hf_pre"].append(hf_run(1)(i))
            runs["te_pre"].append(te_run(1)(i))
        hf_e2e, te_e2e = min(runs["hf_e2e"]), min(runs["te_e2e"])
        hf_prefill, te_prefill = min(runs["hf_pre"]), min(runs["te_pre"])

    generated = batch * new
    decoded = batch * (new - 1)

    def figures(e2e: float, prefill: float) -> dict[str, float]:
        return {
            "e2e_seconds": round(e2e, 3),
            "e2e_tokens_per_s": round(generated / e2e, 1),
            "prefill_seconds": round(prefill, 3),
            "decode_tokens_per_s": round(decoded / max(e2e - prefill, 1e-9), 1),
        }

    hf_fig, te_fig = figures(hf_e2e, hf_prefill), figures(te_e2e, te_prefill)
    stats = llm.stats
    report = {
        "workload": {
            "batch": batch,
            "prompt_len": plen,
            "max_tokens": new,
            "dtype": args.dtype,
            "device": args.device,
            "threads": torch.get_num_threads(),
        },
        "model": {
            "arch": "llama",
            "layers": args.layers,
            "hidden": args.hidden,
            "heads": args.heads,
            "kv_heads": args.kv_heads,
            "vocab": args.vocab,
            "parameters": sum(p.numel() for p in llm.model.parameters()),
        },
        "transformers": {"version": transformers.__version__, **hf_fig},
        "tiny_engine": {
            **te_fig,
            "init_seconds": round(init_s, 2),
            "compiled_seconds": round(compiled_s, 2),
            "attention_backend": stats["attention_backend"],
            "compilation_level": stats["compilation_level"],
            "cudagraph_mode": stats["cudagraph_mode"],
            "graphs_captured": stats["graphs_captured"],
            "platform": stats["platform"],
            "num_blocks": stats["num_blocks"],
        },
        "ratio_e2e": round(te_fig["e2e_tokens_per_s"] / hf_fig["e2e_tokens_per_s"], 2),
        "ratio_decode": round(te_fig["decode_tokens_per_s"] / hf_fig["decode_tokens_per_s"], 2),
    }
    if args.peers_json is not None:
        report["peer_ratios"] = peer_ratios(json.loads(args.peers_json.read_text()))
    print(json.dumps(report, indent=2))
    return 0


def peer_ratios(peers: dict[str, Any]) -> dict[str, Any]:
    """bench_peers.py's end-to-end ratios over transformers for this benchmark's shapes."""
    model = peers.get("models", {}).get("bench", {})
    return {
        "dtype": peers.get("dtype"),
        "date": peers.get("date"),
        **model.get("ratio", {}).get("fixed", {}),
    }


if __name__ == "__main__":
    sys.exit(main())
