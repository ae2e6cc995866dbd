"""tiny_engine on hwplug side by side with what a CPU user would run instead.

Engines: transformers' ``generate()`` (the baseline), tiny_engine on hwplug,
CTranslate2 and vLLM's CPU build, each in its own process (a worker: this file
with ``--worker ENGINE``, run by that engine's Python, JSON on stdout). The
peers live in their own virtual environments (``make bench-peers`` creates
them); an engine whose Python or package is missing, or whose worker fails,
is reported as ``skipped`` with the reason.

Models (written once to ``--cache``, with transformers + safetensors, and a
word-level tokenizer ``t0 .. tN`` so that every engine can load them):

- ``bench``: the model of benchmarks/bench_engine.py (Llama, 4 layers, hidden
  512, 8 heads, 4 key/value heads, intermediate 1408, vocabulary 8192);
- ``llama250m``: hidden 1024, 12 layers, 16 heads, 4 key/value heads,
  intermediate 2816, vocabulary 32000 (about 250M parameters).

Workloads (token ids drawn from a seeded generator, the same for every engine):

- ``fixed``: 16 prompts x 128 tokens -> 128 new tokens each, greedy;
- ``mix``: a serving mix of 32 prompts of 32-512 tokens with 16-256 new
  tokens each (seed 0). Engines that take one length for a batch
  (transformers, CTranslate2) generate the longest one for all and keep each
  prompt's own: that is what their user can do; the tokens counted are the
  requested ones.

In each worker: load, then one token for one prompt (start-up: from the
parent's spawn of the process to that token), then whatever the engine still
does before it runs at full speed (tiny_engine: the compilation of its model,
which runs in a worker thread while its first tokens run eagerly; reported
as ``full_speed_seconds``, from the spawn), a warm-up on other prompts of
the same shapes (2 new tokens), a prefill run (1 new token, other prompts of
the same shapes, so that no prefix cache helps), then the timed run. Decode
tokens/s is the tokens after each prompt's first divided by (timed run -
prefill run). Peak resident memory is the worker's ``VmHWM``. Rounds are
interleaved: round 1 of every engine, then round 2, and so on; the report has
the median, min and max of each figure, the fraction of sequences
token-identical to transformers' output, and ``ratio``: each engine's end-to-end
tokens/s over transformers'.

``python benchmarks/bench_peers.py [--models bench,llama250m --workloads
fixed,mix --engines transformers,tiny_engine,ctranslate2,vllm --rounds 3
--dtype fp32|bf16 --threads N --peers-dir /tmp/hwplug-peers --out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("transformers", "tiny_engine", "ctranslate2", "vllm")
MODELS: dict[str, dict[str, int]] = {
    "bench": {
        "layers": 4,
        "hidden": 512,
        "heads": 8,
        "kv_heads": 4,
        "intermediate": 1408,
        "vocab": 8192,
    },
    "llama250m": {
        "layers": 12,
        "hidden": 1024,
        "heads": 16,
        "kv_heads": 4,
        "intermediate": 2816,
        "vocab": 32000,
    },
}
MAX_POSITIONS = 1024
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


# -- workloads ---------------------------------------------------------------------------------
def workload(name: str, vocab: int, variant: int, scale: float = 1.0) -> dict[str, Any]:
    """Prompts and new-token counts; ``variant`` 0 is the timed set, others have its shapes."""
    shapes = random.Random(0)
    if name == "fixed":
        lens, new = [128] * 16, [128] * 16
    elif name == "mix":
        lens = [shapes.randint(32, 512) for _ in range(32)]
        new = [shapes.randint(16, 256) for _ in range(32)]
    else:
        raise ValueError(f"unknown workload {name!r}: fixed or mix")
    if scale != 1.0:  # smoke runs: fewer prompts and tokens, the same kind of mix
        count = max(2, round(len(lens) * scale))
        lens = [max(4, round(n * scale)) for n in lens[:count]]
        new = [max(2, round(n * scale)) for n in new[:count]]
    tokens = random.Random(1000 + variant)
    prompts = [[tokens.randrange(3, vocab) for _ in range(n)] for n in lens]
    return {"prompts": prompts, "max_tokens": new}


# -- the checkpoint --------------------------------------------------------------------------
def ensure_checkpoint(cache: Path, model: str) -> Path:
    """The model's transformers checkpoint under ``cache``, written once."""
    path = cache / model / "hf"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    sys.path.insert(0, str(REPO / "examples" / "tiny_engine" / "src"))
    from tiny_engine.make_checkpoint import make_checkpoint
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    spec = MODELS[model]
    make_checkpoint(
        path,
        arch="llama",
        layers=spec["layers"],
        hidden=spec["hidden"],
        heads=spec["heads"],
        kv_heads=spec["kv_heads"],
        intermediate=spec["intermediate"],
        vocab=spec["vocab"],
        max_positions=MAX_POSITIONS,
        init_std=0.02,
    )
    # A word-level tokenizer t0 .. tN (id i is "t{i}"): CTranslate2's converter and
    # vLLM want one; the benchmark itself feeds token ids.
    vocab = {f"t{i}": i for i in range(spec["vocab"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t0"
    )
    fast.save_pretrained(path)
    return path


# -- workers: each runs in its engine's own Python -------------------------------------------
def _rss_mib() -> float:
    """This process's peak resident memory in MiB: ``VmHWM`` (the high-water mark of
    its own address space). ``ru_maxrss`` survives ``exec``: a worker would report at
    least what its parent held when it was started."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Worker:
    """One engine: ``load()``, then ``generate(prompts, max_tokens)`` -> token lists."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dtype = DTYPES[args.dtype]
        self.info: dict[str, Any] = {}

    def load(self) -> None:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        raise NotImplementedError

    def settle(self) -> None:
        """Wait for what the engine still does after its first token before it runs at
        full speed (nothing, for most engines)."""


class TransformersWorker(Worker):
    def load(self) -> None:
        import torch
        import transformers

        if self.args.threads:
            torch.set_num_threads(self.args.threads)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            self.args.checkpoint, dtype=getattr(torch, self.dtype)
        ).eval()
        self.info = {"version": transformers.__version__, "threads": torch.get_num_threads()}

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        torch = self.torch
        longest, new = max(map(len, prompts)), max(max_tokens)
        # one batch, left-padded; every prompt gets the longest count, each keeps its own
        ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        return [row[longest : longest + n] for row, n in zip(out.tolist(), max_tokens)]


class TinyEngineWorker(Worker):
    def load(self) -> None:
        import torch
        from tiny_engine import LLM

        if self.args.threads:
            torch.set_num_threads(self.args.threads)
        w = self.args.workload_shapes
        config = {
            "model": {"dtype": self.dtype, "max_model_len": w["max_len"]},
            "scheduler": {
                "max_num_seqs": w["count"],
                "max_num_batched_tokens": max(w["tokens"], w["max_len"]),
            },
            "cache": {"kv_cache_memory_bytes": 1 << 30},
        }
        self.llm = LLM(self.args.checkpoint, config=config, platform="cpu")
        stats = self.llm.stats
        self.info = {
            "threads": torch.get_num_threads(),
            **{k: stats.get(k) for k in ("platform", "attention_backend", "compilation_level")},
        }

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        out = self.llm.generate(prompts, max_tokens=max_tokens, ignore_eos=True)
        return [list(o) for o in out]

    def settle(self) -> None:
        # The model compiles in a worker thread while the first tokens run eagerly.
        self.llm.wait_compiled()
        self.info["compiled"] = self.llm.stats["compiled"]


class CTranslate2Worker(Worker):
    def load(self) -> None:
        import ctranslate2

        threads = self.args.threads or os.cpu_count() or 1
        self.generator = ctranslate2.Generator(
            self.args.ct2_model, device="cpu", compute_type=self.dtype, intra_threads=threads
        )
        self.info = {
            "version": ctranslate2.__version__,
            "compute_type": self.generator.compute_type,
            "threads": threads,
        }

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        new = max(max_tokens)
        # one batch and one length for all (CTranslate2 has no per-prompt limit)
        results = self.generator.generate_batch(
            [[f"t{t}" for t in p] for p in prompts],
            max_length=new,
            min_length=new,
            sampling_topk=1,
            include_prompt_in_result=False,
            max_batch_size=len(prompts),
        )
        return [list(r.sequences_ids[0][:n]) for r, n in zip(results, max_tokens)]


class VLLMWorker(Worker):
    def load(self) -> None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        if self.args.threads:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "all")
        import vllm

        w = self.args.workload_shapes
        self.vllm = vllm
        self.llm = vllm.LLM(
            model=self.args.checkpoint,
            dtype=self.dtype,
            max_model_len=w["max_len"],
            max_num_seqs=w["count"],
            max_num_batched_tokens=max(w["tokens"], w["max_len"]),
            skip_tokenizer_init=True,
            enable_prefix_caching=False,
        )
        self.info = {"version": vllm.__version__}

    def generate(self, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
        params = [
            self.vllm.SamplingParams(
                temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False
            )
            for n in max_tokens
        ]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


WORKERS: dict[str, type[Worker]] = {
    "transformers": TransformersWorker,
    "tiny_engine": TinyEngineWorker,
    "ctranslate2": CTranslate2Worker,
    "vllm": VLLMWorker,
}


def workload_shapes(loads: list[dict[str, Any]]) -> dict[str, int]:
    """What an engine is configured for to serve every one of ``loads``: the most
    prompts, the most prompt tokens, and the longest sequence (plus a margin)."""
    shapes = [(len(p), n) for w in loads for p, n in zip(w["prompts"], w["max_tokens"])]
    return {
        "count": max(len(w["prompts"]) for w in loads),
        "tokens": max(sum(map(len, w["prompts"])) for w in loads),
        "max_len": max(p + n for p, n in shapes) + 8,
    }


def run_worker(args: argparse.Namespace) -> int:
    """One engine, one model, the workloads in turn: print one JSON object."""
    spawned = args.spawned
    loads = {w: workload(w, args.vocab, 0, args.scale) for w in args.workloads}
    args.workload_shapes = workload_shapes(list(loads.values()))
    worker = WORKERS[args.worker](args)
    start = time.perf_counter()
    worker.load()
    load_s = time.perf_counter() - start
    first = worker.generate([loads[args.workloads[0]]["prompts"][0]], [1])
    assert len(first[0]) == 1, first
    report: dict[str, Any] = {
        "engine": args.worker,
        "load_seconds": round(load_s, 3),
        "startup_seconds": round(time.time() - spawned, 3),
        "info": worker.info,
        "workloads": {},
    }
    worker.settle()
    report["full_speed_seconds"] = round(time.time() - spawned, 3)
    for name in args.workloads:
        timed = loads[name]
        warm = workload(name, args.vocab, 2, args.scale)
        worker.generate(warm["prompts"], [min(2, n) for n in warm["max_tokens"]])
        pre = workload(name, args.vocab, 1, args.scale)
        start = time.perf_counter()
        worker.generate(pre["prompts"], [1] * len(pre["prompts"]))
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = worker.generate(timed["prompts"], timed["max_tokens"])
        e2e_s = time.perf_counter() - start
        lengths = [len(o) for o in out]
        if lengths != timed["max_tokens"]:
            raise RuntimeError(f"{args.worker} generated {lengths}, asked {timed['max_tokens']}")
        generated = sum(timed["max_tokens"])
        decoded = generated - len(timed["prompts"])
        report["workloads"][name] = {
            "e2e_seconds": round(e2e_s, 3),
            "prefill_seconds": round(prefill_s, 3),
            "e2e_tokens_per_s": round(generated / e2e_s, 2),
            "decode_tokens_per_s": round(decoded / max(e2e_s - prefill_s, 1e-9), 2),
            "outputs": out,
        }
    report["peak_rss_mib"] = round(_rss_mib(), 1)
    print("@@RESULT@@" + json.dumps(report))
    return 0


# -- the driver ------------------------------------------------------------------------------
def engine_python(engine: str, peers_dir: Path) -> Path:
    if engine == "ctranslate2":
        return peers_dir / "ct2" / "bin" / "python"
    if engine == "vllm":
        return peers_dir / "vllm" / "bin" / "python"
    return Path(sys.executable)


def prepare(engine: str, python: Path, hf: Path, dtype: str) -> tuple[dict[str, Any], str | None]:
    """Extra worker arguments, or the reason the engine is skipped."""
    reason_file = python.parents[1] / "SKIPPED"
    if engine in ("ctranslate2", "vllm"):
        if reason_file.exists():
            return {}, reason_file.read_text().strip()
        if not python.exists():
            return {}, f"no venv at {python.parents[1]} (make bench-peers creates it)"
        module = "ctranslate2" if engine == "ctranslate2" else "vllm"
        check = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, text=True
        )
        if check.returncode:
            tail = (check.stderr.strip().splitlines() or ["?"])[-1]
            return {}, f"import {module} failed: {tail}"
    if engine != "ctranslate2":
        return {}, None
    out = hf.parent / "ct2-float32"
    if not (out / "model.bin").exists():
        code = (
            "import sys, ctranslate2;"
            "ctranslate2.converters.TransformersConverter(sys.argv[1]).convert("
            "sys.argv[2], quantization='float32', force=True)"
        )
        done = subprocess.run(
            [str(python), "-c", code, str(hf), str(out)], capture_output=True, text=True
        )
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            return {}, f"conversion failed: {tail}"
    return {"ct2_model": str(out)}, None


def spawn(
    engine: str, python: Path, args: argparse.Namespace, hf: Path, model: str, extra: dict
) -> dict[str, Any]:
    cmd = [
        str(python),
        str(Path(__file__).resolve()),
        "--worker",
        engine,
        "--checkpoint",
        str(hf),
        "--vocab",
        str(MODELS[model]["vocab"]),
        "--workloads",
        ",".join(args.workloads),
        "--dtype",
        args.dtype,
        "--scale",
        str(args.scale),
        "--spawned",
        repr(time.time()),
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if "ct2_model" in extra:
        cmd += ["--ct2-model", extra["ct2_model"]]
    env = dict(os.environ)
    if engine == "tiny_engine":
        paths = [str(REPO / "src"), str(REPO / "examples" / "tiny_engine" / "src")]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    for line in done.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@") :])
    tail = " | ".join((done.stderr.strip().splitlines() or ["no output"])[-3:])
    return {"error": f"worker exited {done.returncode}: {tail}"[:2000]}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bench,llama250m")
    parser.add_argument("--workloads", default="fixed,mix")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, default=None, help="threads per engine")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the workloads (smoke runs): 0.25 ..."
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/hwplug-peers/models"))
    parser.add_argument("--peers-dir", type=Path, default=Path("/tmp/hwplug-peers"))
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per worker")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    # worker mode (internal)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-model", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    if args.worker:
        return run_worker(args)

    engines = [e for e in args.engines.split(",") if e]
    models = [m for m in args.models.split(",") if m]
    for name, known in (("engine", ENGINES), ("model", MODELS)):
        for item in engines if name == "engine" else models:
            if item not in known:
                parser.error(f"unknown {name} {item!r}: {', '.join(known)}")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", "benchmarks/bench_peers.py", *(argv or sys.argv[1:])]),
        "dtype": args.dtype,
        "rounds": args.rounds,
        "scale": args.scale,
        "cpus": os.cpu_count(),
        "models": {},
    }
    for model in models:
        hf = ensure_checkpoint(args.cache, model)
        ready: dict[str, tuple[Path, dict[str, Any]]] = {}
        result: dict[str, Any] = {"spec": MODELS[model], "engines": {}}
        for engine in engines:
            python = engine_python(engine, args.peers_dir)
            extra, reason = prepare(engine, python, hf, args.dtype)
            if reason:
                result["engines"][engine] = {"skipped": reason}
            else:
                ready[engine] = (python, extra)
        runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ready}
        for round_ in range(args.rounds):
            for engine, (python, extra) in ready.items():
                print(f"bench_peers: {model} round {round_ + 1} {engine}", file=sys.stderr)
                runs[engine].append(spawn(engine, python, args, hf, model, extra))
        reference = next((r for r in runs.get("transformers", []) if "error" not in r), None)
        for engine, rounds in runs.items():
            good = [r for r in rounds if "error" not in r]
            if not good:
                result["engines"][engine] = {"skipped": rounds[0]["error"]}
                continue
            entry: dict[str, Any] = {
                "info": good[0]["info"],
                "rounds_ok": len(good),
                "errors": [r["error"] for r in rounds if "error" in r],
                "startup_seconds": summary([r["startup_seconds"] for r in good]),
                "load_seconds": summary([r["load_seconds"] for r in good]),
                "full_speed_seconds": summary([r["full_speed_seconds"] for r in good]),
                "peak_rss_mib": summary([r["peak_rss_mib"] for r in good]),
                "workloads": {},
            }
            for name in args.workloads:
                figures = [r["workloads"][name] for r in good]
                w: dict[str, Any] = {
                    key: summary([f[key] for f in figures])
                    for key in ("e2e_tokens_per_s", "decode_tokens_per_s", "e2e_seconds")
                }
                if reference is not None:
                    ref = reference["workloads"][name]["outputs"]
                    same = [a == b for a, b in zip(figures[0]["outputs"], ref)]
                    w["identical_to_transformers"] = round(sum(same) / len(same), 3)
                entry["workloads"][name] = w
            result["engines"][engine] = entry
        base = result["engines"].get("transformers", {}).get("workloads", {})
        result["ratio"] = {
            name: {
                engine: round(
                    e["workloads"][name]["e2e_tokens_per_s"]["median"]
                    / base[name]["e2e_tokens_per_s"]["median"],
                    2,
                )
                for engine, e in result["engines"].items()
                if "workloads" in e and engine != "transformers"
            }
            for name in args.workloads
            if name in base
        }
        report["models"][model] = result
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
